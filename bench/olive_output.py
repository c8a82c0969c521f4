"""What a search produced, and how Olive's output folder is read.

One job: from the files Olive's workflow runner leaves (output/model.onnx,
model_config.json, footprint.json and its log) recover its best model, the
session options its tuning pass chose, the quantization behind it (ranked as
Olive ranks its outputs) and what its search did; and map Olive's settings to
ONNX Runtime's SessionOptions the way Olive applies them, with the short
descriptions the tables show.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import metainfer.core  # noqa: F401  # first: it switches ONNX Runtime's telemetry off before the library loads

# isort: split
import onnxruntime as ort

# ORT's SessionOptions enums as Olive writes them (plain ints) -> ORT's names.
ORT_OPT_LEVELS = {0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED", 99: "ORT_ENABLE_ALL"}
ORT_EXEC_MODES = {0: "ORT_SEQUENTIAL", 1: "ORT_PARALLEL"}


@dataclass
class SearchOutcome:
    """What one search produced: the model file, the session options it chose, its wall time."""

    tool: str
    wall_s: float
    model_path: Path | None = None
    session_options: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def read_olive_output(output: Path, wall: float, log: Path) -> SearchOutcome:
    """Olive's best model (output/model.onnx) and the inference settings its tuning pass chose for it."""
    model = output / "model.onnx"
    config_path = output / "model_config.json"
    if not model.exists() or not config_path.exists():
        why = why_olive_failed(log.read_text())
        return SearchOutcome("olive", wall, error=f"Olive produced no output model: {why}")
    settings = json.loads(config_path.read_text()).get("config", {}).get("inference_settings") or {}
    detail: dict[str, Any] = {"inference_settings": settings, "log": str(log)}
    detail.update(olive_search_stats(output / "footprint.json", log.read_text()))
    detail["quantization"] = olive_best_quantization(output / "footprint.json")
    return SearchOutcome("olive", wall, model, settings.get("session_options") or {}, detail)


# "[2026-12-04 06:07:20,357] [WARNING] [engine.py:237:run] message": Olive's log line prefix.
_OLIVE_LINE = re.compile(r"^\[[^\]]*\] \[(?P<level>[A-Z]+)\] \[[^\]]*\] (?P<message>.*)$")


def why_olive_failed(log_text: str, most: int = 3) -> str:
    """The last few distinct warnings, errors and exception lines of Olive's log, without their prefixes (its
    last lines are its run history, which says nothing of why); its last lines when it has none."""
    found: list[str] = []
    in_traceback = False
    for raw in log_text.splitlines():
        line = raw.strip()
        match = _OLIVE_LINE.match(line)
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if in_traceback and raw[:1].isspace():
            continue
        if in_traceback:  # the first unindented line after a traceback is its exception
            in_traceback, message = False, line
        elif match and match["level"] in ("WARNING", "ERROR", "CRITICAL") and match["message"].strip():
            message = match["message"].strip()
        else:
            continue
        if message in found:
            found.remove(message)
        found.append(message[:200])
    if not found:
        return " | ".join(log_text.strip().splitlines()[-4:])
    return " | ".join(found[-most:])


def olive_search_stats(footprint: Path, log_text: str) -> dict[str, Any]:
    """What Olive's search did: candidates evaluated (footprint nodes with metrics, less the input model),
    steps that failed, and the metrics Olive itself measured for each candidate."""
    nodes = json.loads(footprint.read_text()) if footprint.exists() else {}
    evaluated = [n for n in nodes.values() if n.get("metrics") and n.get("parent_model_id")]
    values = [n["metrics"].get("value", {}) for n in evaluated]
    return {
        "olive_candidates_evaluated": len(evaluated),
        "olive_candidates_meeting_goal": sum(1 for n in evaluated if n["metrics"].get("if_goals_met")),
        "olive_steps_failed": log_text.count("... FAILED."),
        "olive_candidate_metrics": [{k: v.get("value") for k, v in value.items()} for value in values],
    }


QUANT_KEYS = (
    "quant_mode",
    "precision",
    "per_channel",
    "reduce_range",
    "quant_preprocess",
    "calibrate_method",
    "quant_format",
    "activation_type",
)


def olive_best_quantization(footprint: Path) -> dict[str, Any]:
    """The quantization config behind Olive's best candidate, ranked as Olive ranks its outputs.

    Olive sorts candidates that meet the goals by its objectives in priority
    order (p50 latency, then quality); the quantization settings sit on the
    best candidate's parent node (the tuning pass only adds session options).
    """
    if not footprint.exists():
        return {}
    nodes = json.loads(footprint.read_text())
    ok = [n for n in nodes.values() if n.get("parent_model_id") and (n.get("metrics") or {}).get("if_goals_met")]
    if not ok:
        return {}

    def rank(node: dict[str, Any]) -> tuple[float, float]:
        value = node["metrics"]["value"]
        return (value["latency-p50"]["value"], -value["quality-quality"]["value"])

    best = min(ok, key=rank)
    parent = nodes.get(best["parent_model_id"], {})
    config = parent.get("pass_run_config") or {}
    # Parameters a dynamic run ignores stay as unresolved search-space dicts in the footprint: leave them out.
    return {k: config[k] for k in QUANT_KEYS if k in config and not isinstance(config[k], dict)}


def describe_olive_quantization(q: dict[str, Any]) -> str:
    if not q:
        return "quantization unknown"
    parts = [f"int8 {q.get('quant_mode')}"]
    parts.append("per-channel" if q.get("per_channel") else "per-tensor")
    parts.append(f"w {q.get('precision')}")
    if q.get("quant_mode") == "static":
        parts.append(f"a {q.get('activation_type')}, {q.get('quant_format')}, {q.get('calibrate_method')}")
    if q.get("reduce_range"):
        parts.append("reduce_range")
    if not q.get("quant_preprocess"):
        parts.append("no preprocess")
    return ", ".join(parts)


def olive_session_options(settings: dict[str, Any]) -> ort.SessionOptions:
    """ORT SessionOptions from Olive's inference settings, as olive.common.ort_inference applies them."""
    so = ort.SessionOptions()
    if settings.get("inter_op_num_threads"):
        so.inter_op_num_threads = int(settings["inter_op_num_threads"])
    if settings.get("intra_op_num_threads"):
        so.intra_op_num_threads = int(settings["intra_op_num_threads"])
    if settings.get("execution_mode") is not None:
        so.execution_mode = getattr(ort.ExecutionMode, ORT_EXEC_MODES[int(settings["execution_mode"])])
    if settings.get("graph_optimization_level") is not None:
        so.graph_optimization_level = ort.GraphOptimizationLevel(int(settings["graph_optimization_level"]))
    for key, value in (settings.get("extra_session_config") or {}).items():
        so.add_session_config_entry(key, str(value))
    so.log_severity_level = 3
    return so


def describe_olive_settings(settings: dict[str, Any]) -> str:
    if not settings:
        return "ORT defaults"
    parts = []
    if settings.get("graph_optimization_level") is not None:
        parts.append(
            ORT_OPT_LEVELS.get(int(settings["graph_optimization_level"]), str(settings["graph_optimization_level"]))
        )
    if settings.get("execution_mode") is not None:
        parts.append(ORT_EXEC_MODES.get(int(settings["execution_mode"]), str(settings["execution_mode"])))
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        if settings.get(key) is not None:
            parts.append(f"{key.split('_')[0]}={settings[key]}")
    return ", ".join(parts)
