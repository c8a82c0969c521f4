"""What ``metainfer adapt`` leaves in its output directory.

``model.onnx`` is the variant, runnable as is; ``recipe.json`` is everything
needed to rebuild and run it (base sha256, transform, ORT SessionOptions
attribute names and values, providers, batch, and whether a sample's outputs depend on
the other samples of its run); ``report.json`` is the whole
evidence (profile, every trial, baseline vs best); ``pareto.png`` is the same
evidence for a person.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import REPORT_FILE, Report

MODEL_FILE, RECIPE_FILE, PLOT_FILE = "model.onnx", "recipe.json", "pareto.png"


def recipe_document(recipe: Recipe, base_sha256: str, variant_sha256: str | None) -> dict[str, Any]:
    doc = recipe.model_dump(mode="json")
    doc["base_sha256"] = base_sha256
    doc["variant_sha256"] = variant_sha256
    doc["transform_key"] = recipe.transform_key()
    doc["recipe_key"] = recipe.key()
    doc["batch_dependent"] = recipe.batch_dependent()
    return doc


def write_outputs(out_dir: Path, report: Report, variant: bytes | None) -> list[Path]:
    import hashlib

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    (out_dir / REPORT_FILE).write_text(report.model_dump_json(indent=2))
    written.append(out_dir / REPORT_FILE)
    if report.best is not None and variant is not None:
        (out_dir / MODEL_FILE).write_bytes(variant)
        doc = recipe_document(report.best.recipe, report.model.sha256, hashlib.sha256(variant).hexdigest())
        (out_dir / RECIPE_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        written += [out_dir / MODEL_FILE, out_dir / RECIPE_FILE]
    from metainfer.core.engine.plots import pareto_plot

    pareto_plot(report, out_dir / PLOT_FILE)
    written.append(out_dir / PLOT_FILE)
    return written
