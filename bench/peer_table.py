"""What the two peer matrices (bench/export_matrix.py, bench/cnn_matrix.py) share.

Both time their contenders with bench/peers_driver.py and report one row per
model: p50/p95 and quality per contender, metainfer's speedup, the wall time of
each search, and where a peer beats metainfer. Only the models, the setup text
and what counts as a quality win differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, quality_of
from metainfer.core.engine.runtime_openvino import compile_config

Row = dict[str, Any]


def metainfer_contender(recipe: Recipe, model: str) -> dict[str, Any]:
    """bench/peers_driver.py's entry for metainfer's pick, on the runtime its recipe names: ONNX Runtime with its
    session options, or OpenVINO with its compile settings (hint, streams, threads, precision)."""
    if recipe.session.runtime == "openvino":
        config = compile_config(recipe)
        return {"name": "metainfer", "kind": "openvino", "model": model, "nncf": False, "config": config}
    return {"name": "metainfer", "kind": "ort", "model": model, "session": recipe.session.model_dump()}


def read_outputs(path: Path, every: bool) -> dict[str, list[np.ndarray]]:
    """bench/peers_driver.py's outputs per contender, in the model's order: all of them, or the first only."""
    with np.load(path) as npz:
        names = [k for k in npz.files if "." not in k]
        return {
            name: [npz[name], *(npz[f"{name}.{k}"] for k in range(1, len(npz.files)) if every and f"{name}.{k}" in npz)]
            for name in names
        }


def add_timings(
    row: Row, peers: dict[str, Any], outputs: dict[str, list[np.ndarray]], reference: Reference | None
) -> None:
    """The driver's per-contender times (and quality against ``reference``) into ``row``; marks it measured."""
    for name, times in peers["times_ms"].items():
        ms = np.asarray(times)
        row[f"{name}_p50_ms"] = float(np.percentile(ms, 50))
        row[f"{name}_p95_ms"] = float(np.percentile(ms, 95))
        row[f"{name}_runs"] = len(ms)
        if reference is not None and name in outputs:
            row[f"{name}_quality"] = quality_of(outputs[name], reference).value
    row["openvino_nncf_wall_s"] = peers["prepare_s"].get("openvino_nncf")
    row["peer_errors"] = peers["errors"]
    row["status"] = "measured"


def olive_ran(rows: Sequence[Row]) -> bool:
    """Whether the section gets Olive's columns: some row ran it (or tried to)."""
    return any("olive_p50_ms" in r or "olive_error" in r for r in rows)


def latency(r: Row, name: str, digits: int) -> str:
    return f"{r[f'{name}_p50_ms']:.{digits}f} / {r[f'{name}_p95_ms']:.{digits}f}" if f"{name}_p50_ms" in r else "—"


def qualities(r: Row, names: Sequence[str]) -> str:
    return " / ".join(f"{r[f'{n}_quality']:.4f}" if f"{n}_quality" in r else "—" for n in names)


def speedup(r: Row) -> str:
    if "metainfer_p50_ms" not in r:
        return "—"
    return f"{r['fp32_p50_ms'] / r['metainfer_p50_ms']:.2f}x / {r['fp32_p95_ms'] / r['metainfer_p95_ms']:.2f}x"


def walls(r: Row, olive: bool) -> str:
    """Search wall times: metainfer / naive / (Olive) / NNCF, in seconds."""
    naive = f"{r['naive_wall_s']:.0f}" if "naive_wall_s" in r else "failed"
    olive_wall = [f"{r['olive_wall_s']:.0f}" if "olive_wall_s" in r else "—"] if olive else []
    return " / ".join([f"{r['metainfer_wall_s']:.0f}", naive, *olive_wall, f"{r.get('openvino_nncf_wall_s') or 0:.0f}"])


def peer_wins(
    rows: Sequence[Row],
    key: str,
    peers: Sequence[tuple[str, str]],
    quality_counts: Callable[[Row, str], bool],
    max_drop: float | None = None,
) -> list[str]:
    """Where a peer beats metainfer on a model: faster at p50, or better quality where ``quality_counts``. A
    faster peer whose quality (a similarity to FP32, 1 at best) drops by more than ``max_drop`` is said to be
    over the budget metainfer was held to: faster, but not at equal quality."""
    notes = []
    for r in rows:
        if "metainfer_p50_ms" not in r:
            continue
        for name, label in peers:
            if f"{name}_p50_ms" not in r:
                continue
            faster = r["metainfer_p50_ms"] / r[f"{name}_p50_ms"]
            better = r.get(f"{name}_quality", 0.0) - r.get("metainfer_quality", 0.0)
            wins = [f"{faster:.2f}x faster at p50"] if faster > 1 else []
            quality = r.get(f"{name}_quality")
            if wins and max_drop is not None and quality is not None and 1.0 - quality > max_drop:
                wins = [f"{wins[0]}, over the quality budget ({quality:.4f}; {1 - max_drop:.2f} allowed)"]
            # Below the printed precision a "+0.0000 cosine" win is the same quantized model, not better quality.
            wins += [f"{better:+.4f} cosine"] if round(better, 4) > 0 and quality_counts(r, name) else []
            if wins:
                notes.append(f"{r[key]}: {label} beats metainfer by " + " and ".join(wins))
    return notes
