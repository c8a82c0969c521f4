"""The independent measurement: every search output timed and scored here with metainfer's code.

One job: FP32 with ORT's default SessionOptions (the reference), Olive's
best model with the session options Olive chose, metainfer's variant with its
recipe's; timed in alternating rounds (core.engine.evaluate) so background load
hits all alike, quality against FP32 on all samples. Also the reference file
Olive's own quality metric compares against, so both searches are scored alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import metainfer.core  # noqa: F401  # first: it switches ONNX Runtime's telemetry off before the library loads

# isort: split
import numpy as np
import onnxruntime as ort

from bench.olive_output import (
    SearchOutcome,
    describe_olive_quantization,
    describe_olive_settings,
    olive_session_options,
)
from metainfer.agent.zoo.build import ExampleModel
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, measure_interleaved
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import make_reference, mean_pooled, quality_of, run_all
from metainfer.core.engine.runtime import create_session


def load_dataset(example: ExampleModel) -> Dataset:
    with np.load(example.data_path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    labels = arrays.pop("labels", None)
    return Dataset(arrays, labels)


def fp32_session(example: ExampleModel) -> ort.InferenceSession:
    """The reference: the base model with ORT's default SessionOptions, as a user would load it."""
    return ort.InferenceSession(str(example.model_path), providers=["CPUExecutionProvider"])


def write_olive_reference(example: ExampleModel, data: Dataset, batch: int, path: Path) -> None:
    """What Olive's quality metric compares against: labels, or FP32's pooled outputs and masks."""
    ref = make_reference(fp32_session(example), data, batch)
    if ref.labels is not None:
        np.savez(path, labels=ref.labels)
    elif ref.token_mask is not None and ref.outputs[0].ndim == 3:
        np.savez(path, mask=ref.token_mask, pooled=mean_pooled(ref.outputs[0], ref.token_mask))
    else:  # one row per sample (run_all puts samples first, seq-major exports included)
        np.savez(path, outputs=ref.outputs[0].reshape(data.n_samples, -1))


@dataclass
class Measured:
    name: str
    options: str
    p50_ms: float
    p95_ms: float
    quality: float
    drop: float
    metric: str
    size_mib: float


def measure(
    example: ExampleModel, batch: int, outcomes: list[SearchOutcome], rounds: int, seconds: float
) -> list[Measured]:
    """FP32 (default options) and every search output, measured here with metainfer's code, interleaved."""
    data = load_dataset(example)
    fp32 = fp32_session(example)
    reference = make_reference(fp32, data, batch)
    entries: list[tuple[str, str, ort.InferenceSession, Path]] = [
        ("ORT FP32, default options", "ORT defaults", fp32, example.model_path)
    ]
    for outcome in outcomes:
        if outcome.error or outcome.model_path is None:
            continue
        if outcome.tool == "olive":
            settings = outcome.session_options
            session = ort.InferenceSession(
                str(outcome.model_path), olive_session_options(settings), providers=["CPUExecutionProvider"]
            )
            options = f"{describe_olive_quantization(outcome.detail.get('quantization', {}))}; " + (
                describe_olive_settings(settings)
            )
            entries.append(("Olive best", options, session, outcome.model_path))
        else:
            recipe = Recipe.model_validate(outcome.detail["recipe"])
            session = create_session(str(outcome.model_path), recipe)
            entries.append(("metainfer best", describe_recipe(recipe), session, outcome.model_path))
    qualities = [quality_of(run_all(session, data, batch), reference) for _, _, session, _ in entries]
    settings = MeasureSettings(
        warmup_runs=3, round_runs=5, min_runs=10 * rounds, max_runs=200 * rounds, max_seconds=seconds * rounds
    )
    stats = measure_interleaved([session for _, _, session, _ in entries], data, batch, settings, rounds=rounds)
    return [
        Measured(
            name=name,
            options=options,
            p50_ms=lat.p50_ms,
            p95_ms=lat.p95_ms,
            quality=q.value,
            drop=q.drop,
            metric=q.metric,
            size_mib=path.stat().st_size / 2**20,
        )
        for (name, options, _, path), q, lat in zip(entries, qualities, stats, strict=True)
    ]


def describe_recipe(recipe: Recipe) -> str:
    q = recipe.transform.quantization
    parts = [q.mode]
    if q.mode.startswith("int8"):
        parts.append("per-channel" if q.per_channel else "per-tensor")
        parts.append(f"w {q.weight_type} / a {q.activation_type}")
        if q.keep_float:
            parts.append(f"{len(q.keep_float)} layer(s) kept float")
    if recipe.transform.fusion != "none":
        parts.append(f"fusion {recipe.transform.fusion}")
    s = recipe.session
    parts.append(f"{s.graph_optimization_level}, {s.execution_mode}, intra={s.intra_op_num_threads}")
    return ", ".join(parts)
