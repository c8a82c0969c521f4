"""ONNX Runtime sessions built from a recipe's session part."""

from __future__ import annotations

import onnxruntime as ort

from metainfer.core.engine.recipe import Recipe


def session_options(recipe: Recipe) -> ort.SessionOptions:
    so = ort.SessionOptions()
    for name, value in recipe.session_options.items():
        if name == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        elif name == "execution_mode":
            value = getattr(ort.ExecutionMode, value)
        setattr(so, name, value)
    so.log_severity_level = 3  # warnings about unused initializers etc. are noise to a user
    return so


def create_session(model: bytes | str, recipe: Recipe) -> ort.InferenceSession:
    return ort.InferenceSession(model, sess_options=session_options(recipe), providers=recipe.providers)


def available_providers() -> list[str]:
    # Azure's EP calls a remote endpoint; it is not hardware to adapt to.
    return [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]
