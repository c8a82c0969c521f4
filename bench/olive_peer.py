"""Peer comparison: Microsoft Olive vs metainfer on the same ONNX model, same data, same candidate budget.

Why: to answer whether metainfer's search finds a variant at least as fast
as what Olive (olive-ai, installed from the package registry) finds with its
ONNX quantization pass and its session-parameter tuning pass, at equal or
better quality, and how long each search takes.

How:

1. Olive runs in its own virtual environment (``--olive-venv``, built from
   bench/requirements-olive.txt when missing), so its pins (torch,
   transformers, ...) never touch the project's environment.
2. Both searches get the same FP32 model, the same NPZ samples, the same
   accuracy budget (quality drop <= 0.01 against FP32) and the same number of
   candidate evaluations K: metainfer's ``--budget-trials K`` and Olive's joint
   search with ``max_iter K`` (one sample = one quantization config plus one
   session-parameter setting, evaluated for latency and quality). Olive's
   search space is its own passes restricted to the knobs metainfer also
   searches (dynamic/static int8, per-channel, weight and activation types,
   calibration method; optimisation level, intra-op threads, execution mode).
3. The searches run one after the other, never together. Then every output is
   measured again here with metainfer's code (core.engine.evaluate): FP32 with
   default SessionOptions, Olive's model with the session options Olive chose,
   metainfer's variant with its recipe's session options, timed in alternating
   rounds so background load hits all three alike; quality against FP32 on all
   samples (top-1 with labels, mean-pooled cosine for a transformer).

    PYTHONSAFEPATH=1 .venv/bin/python bench/olive_peer.py [--quick]

``--quick``: bert_mini only, K=4, fewer timing rounds (about 5 minutes on an
idle 2-core machine once the Olive environment exists; 10 under heavy load).
Without it: bert_mini and digits, K=24 (Olive needs about 30-90 s per
bert_mini candidate here, so plan most of an hour).

Olive's sampler counts a suggestion its own search space rules invalid (for
example QOperator with int8 activations) against ``max_samples`` without
evaluating it, so Olive may evaluate fewer than K candidates; the table says
how many it did.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench import benchlib
from metainfer.agent.zoo.build import ExampleModel, build_examples
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import (
    MeasureSettings,
    make_reference,
    mean_pooled,
    measure_interleaved,
    quality_of,
    run_all,
)
from metainfer.core.engine.profile.fingerprint import detect_machine
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import Report
from metainfer.core.engine.runtime import create_session

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REQUIREMENTS = BENCH / "requirements-olive.txt"
USER_SCRIPT = BENCH / "olive_peer_user_script.py"
DRIVER = BENCH / "olive_peer_driver.py"
DEFAULT_VENV = Path.home() / ".cache" / "metainfer" / "olive-venv"
METAINFER = Path(sys.executable).parent / "metainfer"

MAX_DROP = 0.01
SEED = 0
CALIBRATION_SAMPLES = 64  # what metainfer's pipeline calibrates with (PipelineSettings.calibration_samples)
# Olive's latency metric: runs per evaluation, about what one metainfer trial takes at minimum (min_runs 20).
OLIVE_WARMUP, OLIVE_REPEAT = 3, 20

# Production batch per example model (the batch both searches optimise for).
BATCHES = {"bert_mini": 8, "digits": 64}

# ORT's SessionOptions enums as Olive writes them (plain ints) -> ORT's names.
ORT_OPT_LEVELS = {0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED", 99: "ORT_ENABLE_ALL"}
ORT_EXEC_MODES = {0: "ORT_SEQUENTIAL", 1: "ORT_PARALLEL"}


class OliveUnavailable(RuntimeError):
    """Olive could not be installed or imported; the message says exactly why."""


@dataclass
class SearchOutcome:
    """What one search produced: the model file, the session options it chose, its wall time."""

    tool: str
    wall_s: float
    model_path: Path | None = None
    session_options: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


# ---------------------------------------------------------------- Olive environment


def _olive_env() -> dict[str, str]:
    """Environment for Olive's processes: no telemetry, no hub access, stdlib not shadowed by operator/."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        {
            "PYTHONSAFEPATH": "1",
            "OLIVE_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def olive_version(venv: Path) -> str | None:
    """Olive's version if the venv imports olive and torch, else None."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    probe = "import torch, onnxruntime, olive.workflows; print(olive.__version__)"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=_olive_env(), cwd="/")
    return out.stdout.strip() if out.returncode == 0 else None


def ensure_olive(venv: Path, requirements: Path) -> dict[str, Any]:
    """Reuse or build Olive's venv from the pinned requirements; raises OliveUnavailable with the cause."""
    version = olive_version(venv)
    if version:
        return {"venv": str(venv), "olive": version, "installed_now": False}
    print(f"building Olive's environment in {venv} from {requirements.relative_to(ROOT)} ...", flush=True)
    started = time.monotonic()
    failure = benchlib.build_venv(venv, requirements, _olive_env())
    if failure is not None:
        raise OliveUnavailable(failure)
    version = olive_version(venv)
    if not version:
        python = venv / "bin" / "python"
        probe = subprocess.run(
            [str(python), "-c", "import torch, olive.workflows"], capture_output=True, text=True, env=_olive_env()
        )
        tail = probe.stderr.strip().splitlines()[-3:]
        raise OliveUnavailable(f"Olive installed but does not import: {' | '.join(tail)}")
    return {
        "venv": str(venv),
        "olive": version,
        "installed_now": True,
        "install_s": round(time.monotonic() - started, 1),
    }


# ---------------------------------------------------------------- shared inputs


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
    else:
        np.savez(path, outputs=ref.outputs[0])


def thread_choices() -> list[int]:
    """The intra-op thread counts metainfer's space offers on this machine (core.engine.candidates.thread_choices)."""
    info = detect_machine()
    return sorted({1, max(1, info.physical_cores // 2), info.physical_cores, info.logical_cores})


# ---------------------------------------------------------------- Olive's search


def olive_workflow(
    example: ExampleModel, batch: int, budget: int, reference: Path, work: Path, threads: list[int]
) -> dict[str, Any]:
    """An Olive run config: its ONNX quantization and session-tuning passes, searched jointly for K samples.

    The quantization pass searches Olive's own default space (quant_mode,
    precision, per_channel, reduce_range, quant_preprocess, and for static:
    calibrate_method, quant_format, activation_type). The session tuning pass,
    whose default space is empty, gets metainfer's choices for optimisation
    level, intra-op threads and execution mode. One search sample is one
    candidate: a quantized model with one session setting, measured by the
    evaluator for p50 latency (objective) and quality (goal: drop <= 0.01).
    """

    def data_config(name: str, samples: int) -> dict[str, Any]:
        return {
            "name": name,
            "user_script": str(USER_SCRIPT),
            "load_dataset_config": {
                "type": "metainfer_npz_dataset",
                "params": {"data_path": str(example.data_path), "max_samples": samples},
            },
            "dataloader_config": {"batch_size": batch},
        }

    return {
        "input_model": {"type": "ONNXModel", "model_path": str(example.model_path)},
        "systems": {
            "local_system": {
                "type": "LocalSystem",
                "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}],
            }
        },
        "data_configs": [
            data_config("calibration_data", CALIBRATION_SAMPLES),
            data_config("latency_data", batch),
            data_config("quality_data", example.samples),
        ],
        "evaluators": {
            "peer_evaluator": {
                "metrics": [
                    {
                        "name": "latency",
                        "type": "latency",
                        "data_config": "latency_data",
                        "sub_types": [
                            {
                                "name": "p50",
                                "priority": 1,
                                "metric_config": {"warmup_num": OLIVE_WARMUP, "repeat_test_num": OLIVE_REPEAT},
                            }
                        ],
                    },
                    {
                        "name": "quality",
                        "type": "custom",
                        "data_config": "quality_data",
                        "sub_types": [
                            {
                                "name": "quality",
                                "priority": 2,
                                "higher_is_better": True,
                                "goal": {"type": "max-degradation", "value": MAX_DROP},
                            }
                        ],
                        "user_config": {
                            "user_script": str(USER_SCRIPT),
                            "metric_func": "quality_metric",
                            "metric_func_kwargs": {"reference_path": str(reference)},
                        },
                    },
                ]
            }
        },
        "passes": {
            "quantization": {
                "type": "OnnxQuantization",
                "data_config": "calibration_data",
            },
            "session_params_tuning": {
                "type": "OrtSessionParamsTuning",
                "data_config": "latency_data",
                "opt_level_list": [99, 2, 1],
                "intra_thread_num_list": threads,
                "execution_mode_list": [0, 1],
            },
        },
        "search_strategy": {
            "execution_order": "joint",
            "sampler": "tpe",
            "sampler_config": {"max_samples": budget, "seed": SEED},
        },
        "evaluator": "peer_evaluator",
        "host": "local_system",
        "target": "local_system",
        "evaluate_input_model": True,
        "cache_dir": str(work / "cache"),
        "output_dir": str(work / "output"),
        "log_severity_level": 1,
    }


def run_olive(venv: Path, config: dict[str, Any], work: Path, timeout_s: float) -> SearchOutcome:
    """Olive's workflow runner in Olive's venv; wall time is the whole command, as for ``metainfer adapt``."""
    work.mkdir(parents=True, exist_ok=True)
    config_path = work / "olive_config.json"
    config_path.write_text(json.dumps(config, indent=2))
    log = work / "olive.log"
    started = time.monotonic()
    try:
        with log.open("w") as out:
            code = subprocess.call(
                [str(venv / "bin" / "python"), str(DRIVER), str(config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_olive_env(),
                cwd=work,
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired:
        return SearchOutcome("olive", time.monotonic() - started, error=f"olive run exceeded {timeout_s:.0f} s")
    wall = time.monotonic() - started
    if code != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        return SearchOutcome("olive", wall, error=f"olive run exited {code}: {tail}")
    return read_olive_output(work / "output", wall, log)


def read_olive_output(output: Path, wall: float, log: Path) -> SearchOutcome:
    """Olive's best model (output/model.onnx) and the inference settings its tuning pass chose for it."""
    model = output / "model.onnx"
    config_path = output / "model_config.json"
    if not model.exists() or not config_path.exists():
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        return SearchOutcome("olive", wall, error=f"Olive produced no output model: {tail}")
    settings = json.loads(config_path.read_text()).get("config", {}).get("inference_settings") or {}
    detail: dict[str, Any] = {"inference_settings": settings, "log": str(log)}
    detail.update(olive_search_stats(output / "footprint.json", log.read_text()))
    detail["quantization"] = olive_best_quantization(output / "footprint.json")
    return SearchOutcome("olive", wall, model, settings.get("session_options") or {}, detail)


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


# ---------------------------------------------------------------- Olive as one contender of the matrices

# Olive's graph optimisation levels (ORT's enum values) -> the names bench/peers_driver.py takes.
PEER_OPT_LEVELS = {0: "disabled", 1: "basic", 2: "extended", 99: "all"}


def olive_contender(
    name: str, model_path: Path, data_path: Path, batch: int, budget: int, work: Path, timeout_s: float
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Olive's search (the same workflow as this benchmark's) on any ONNX model and NPZ of its inputs.

    Returns the contender for bench/peers_driver.py (None when Olive failed) and what the matrices report:
    wall time, Olive's recipe, candidates evaluated, or the error.
    """
    try:
        ensure_olive(DEFAULT_VENV, REQUIREMENTS)
    except OliveUnavailable as exc:
        return None, {"olive_error": f"Olive unavailable: {exc}"[:300]}
    with np.load(data_path, allow_pickle=False) as npz:
        inputs = tuple(k for k in npz.files if k != "labels")
        samples = int(npz[inputs[0]].shape[0])
    example = ExampleModel(
        name=name,
        model_path=model_path,
        data_path=data_path,
        sha256=hashlib.sha256(model_path.read_bytes()).hexdigest(),
        data_sha256=hashlib.sha256(data_path.read_bytes()).hexdigest(),
        input_names=inputs,
        samples=samples,
        has_labels=False,
        fixed_batch=None,
        description=f"{name} (a matrix model)",
    )
    work.mkdir(parents=True, exist_ok=True)
    reference = work / "olive_reference.npz"
    write_olive_reference(example, load_dataset(example), batch, reference)
    config = olive_workflow(example, batch, budget, reference, work / "olive", thread_choices())
    outcome = run_olive(DEFAULT_VENV, config, work / "olive", timeout_s)
    row: dict[str, Any] = {"olive_wall_s": outcome.wall_s}
    if outcome.error is not None or outcome.model_path is None:
        return None, row | {"olive_error": (outcome.error or "no model")[:300]}
    settings = outcome.session_options
    session: dict[str, Any] = {
        "intra_op_num_threads": int(settings.get("intra_op_num_threads") or 0),
        "inter_op_num_threads": int(settings.get("inter_op_num_threads") or 0),
        "graph_optimization_level": PEER_OPT_LEVELS.get(int(settings.get("graph_optimization_level", 99)), "all"),
        "execution_mode": "parallel" if int(settings.get("execution_mode") or 0) == 1 else "sequential",
    }
    row["olive_recipe"] = (
        f"{describe_olive_quantization(outcome.detail.get('quantization', {}))}; {describe_olive_settings(settings)}"
    )
    row["olive_candidates"] = outcome.detail.get("olive_candidates_evaluated")
    contender = {"name": "olive", "kind": "ort", "model": str(outcome.model_path), "session": session}
    return contender, row


# ---------------------------------------------------------------- metainfer's search


def run_metainfer(example: ExampleModel, batch: int, budget: int, work: Path, timeout_s: float) -> SearchOutcome:
    """``metainfer adapt`` with the same data, batch, accuracy budget and number of candidates."""
    out = work / "metainfer"
    if out.exists():
        shutil.rmtree(out)
    command = [
        str(METAINFER),
        "adapt",
        str(example.model_path),
        "--data",
        str(example.data_path),
        "--batch",
        str(batch),
        "--max-accuracy-drop",
        str(MAX_DROP),
        "--budget-trials",
        str(budget),
        "--seed",
        str(SEED),
        "--out",
        str(out),
    ]
    work.mkdir(parents=True, exist_ok=True)
    log = work / "metainfer.log"
    started = time.monotonic()
    try:
        with log.open("w") as sink:
            code = subprocess.call(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONSAFEPATH": "1"},
                timeout=timeout_s,
            )
    except subprocess.TimeoutExpired:
        return SearchOutcome(
            "metainfer", time.monotonic() - started, error=f"metainfer adapt exceeded {timeout_s:.0f} s"
        )
    wall = time.monotonic() - started
    if code != 0 or not (out / "recipe.json").exists():
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        return SearchOutcome("metainfer", wall, error=f"metainfer adapt exited {code}: {tail}")
    recipe = Recipe.model_validate_json((out / "recipe.json").read_text())
    report = Report.model_validate_json((out / "report.json").read_text())
    detail = {
        "recipe": json.loads((out / "recipe.json").read_text()),
        "trials": len(report.trials),
        "search_wall_s": report.search_wall_s,
        "stop_reason": report.stop_reason,
        "log": str(log),
    }
    return SearchOutcome("metainfer", wall, out / "model.onnx", recipe.session_options, detail)


# ---------------------------------------------------------------- independent measurement


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


# ---------------------------------------------------------------- verdict and report

QUALITY_TIE = 0.001  # quality within a tenth of the accuracy budget counts as equal


def verdict(rows: list[Measured]) -> tuple[bool | None, str]:
    """Target: metainfer's variant at least as fast as Olive's (p50), at equal or better quality."""
    by_name = {r.name: r for r in rows}
    ours, olive = by_name.get("metainfer best"), by_name.get("Olive best")
    if ours is None or olive is None:
        missing = "metainfer" if ours is None else "Olive"
        return None, f"not judged: {missing} produced no model (see above)"
    faster = ours.p50_ms <= olive.p50_ms
    quality_ok = ours.drop <= olive.drop + QUALITY_TIE
    ratio = olive.p50_ms / ours.p50_ms
    text = (
        f"metainfer p50 {_ms(ours.p50_ms)} ms vs Olive {_ms(olive.p50_ms)} ms ({ratio:.2f}x), "
        f"quality drop {ours.drop:.4f} vs {olive.drop:.4f}"
    )
    if faster and quality_ok:
        return True, f"**met**: {text}"
    why = []
    if not faster:
        why.append("Olive's variant is faster")
    if not quality_ok:
        why.append(f"metainfer's quality drop is more than {QUALITY_TIE} worse")
    return False, f"**missed** ({'; '.join(why)}): {text}"


def _ms(value: float) -> str:
    """Milliseconds with three significant digits, so a 0.06 ms MLP does not print as 0.1 for every model."""
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _fmt_row(r: Measured, fp32_p50: float, wall: str, evaluated: str) -> list[str]:
    return [
        r.name,
        r.options,
        _ms(r.p50_ms),
        _ms(r.p95_ms),
        f"{fp32_p50 / r.p50_ms:.2f}x",
        f"{r.quality:.4f}",
        f"{r.drop:.4f}",
        f"{r.size_mib:.1f}",
        wall,
        evaluated,
    ]


def render_model(name: str, result: dict[str, Any]) -> str:
    """One model's markdown: the table, what each search did, the verdict."""
    header = [
        "model",
        "what it is",
        "p50 ms",
        "p95 ms",
        "vs FP32",
        "quality",
        "drop",
        "MiB",
        "search wall s",
        "candidates evaluated",
    ]
    rows = [Measured(**r) for r in result["measured"]]
    fp32_p50 = rows[0].p50_ms
    olive, ours = result["olive"], result["metainfer"]
    search = {
        "Olive best": (
            f"{olive['wall_s']:.0f}",
            f"{olive['detail'].get('olive_candidates_evaluated', '?')} of {result['budget']}",
        ),
        "metainfer best": (f"{ours['wall_s']:.0f}", f"{ours['detail'].get('trials', '?')} of {result['budget']}"),
    }
    table = benchlib.markdown_table(header, [_fmt_row(r, fp32_p50, *search.get(r.name, ("-", "-"))) for r in rows])
    lines = [
        f"### {name} (batch {result['batch']}, {result['samples']} samples, quality = {rows[0].metric})",
        table,
    ]
    for label, outcome in (("Olive", olive), ("metainfer", ours)):
        if outcome.get("error"):
            lines.append(f"{label} failed: `{outcome['error']}`")
    if not olive.get("error"):
        d = olive["detail"]
        lines.append(
            f"Olive's search: {d.get('olive_candidates_evaluated', '?')} candidates evaluated "
            f"({d.get('olive_candidates_meeting_goal', '?')} within the quality budget, "
            f"{d.get('olive_steps_failed', 0)} steps failed) out of {result['budget']} samples requested; "
            f"Olive's log: `{d.get('log')}`."
        )
    if not ours.get("error"):
        d = ours["detail"]
        search_s = d.get("search_wall_s")
        lines.append(
            f"metainfer's run: {d.get('trials', '?')} trials ({d.get('stop_reason')}); its search loop took "
            f"{search_s:.0f} s of the {ours['wall_s']:.0f} s command (the rest: hardware profile, cached after "
            f"the first run on a machine, FP32 baseline, sensitivity scan, validation)."
            if isinstance(search_s, (int, float))
            else f"metainfer's run: {d.get('trials', '?')} trials."
        )
    lines.append(f"Verdict: {result['verdict_text']}")
    if result.get("verdict") is False:
        lines.append(why_slower(rows, ours))
    return "\n\n".join(lines)


def why_slower(rows: list[Measured], ours: dict[str, Any]) -> str:
    """For a missed verdict: the size of the gap, and how metainfer's own trials ranked the same kind of variant."""
    by_name = {r.name: r for r in rows}
    mine, theirs = by_name.get("metainfer best"), by_name.get("Olive best")
    if mine is None or theirs is None:
        return ""
    gap_ms = mine.p50_ms - theirs.p50_ms
    text = f"Why: Olive's variant measured {gap_ms * 1000:.1f} µs ({gap_ms / theirs.p50_ms:.0%}) faster per batch here."
    report_path = Path(ours.get("model_path") or "").parent / "report.json"
    olive_per_channel = "per-channel" in theirs.options
    if not report_path.is_file():
        return text
    report = Report.model_validate_json(report_path.read_text())
    trials = [t for t in report.trials if t.score and t.metrics is not None]
    same_kind = [
        t
        for t in trials
        if t.recipe.transform.quantization.mode != "fp32"
        and t.recipe.transform.quantization.per_channel == olive_per_channel
    ]
    best = max(trials, key=lambda t: t.score or 0.0, default=None)
    closest = max(same_kind, key=lambda t: t.score or 0.0, default=None)
    if best is None or closest is None or closest is best or best.metrics is None or closest.metrics is None:
        return text
    chosen_ms = best.metrics.latency.p50_ms
    other_ms = closest.metrics.latency.p50_ms
    granularity = "per-channel" if olive_per_channel else "per-tensor"
    return (
        f"{text} metainfer's search had measured its chosen variant at {chosen_ms * 1000:.1f} µs and its best "
        f"{granularity} int8 variant (Olive's granularity) at {other_ms * 1000:.1f} µs "
        f"({other_ms / chosen_ms - 1:+.0%}), so its trials and this measurement rank the two granularities "
        "oppositely: at a few microseconds per batch the order is within this shared machine's timing noise, "
        "and the search keeps whichever measured fastest in its own trials."
    )


def render(results: dict[str, Any]) -> str:
    env = results.get("olive_env", {})
    intro = (
        f"Olive {env.get('olive', '?')} (olive-ai, from the package registry, in its own virtual environment "
        f"built from `bench/requirements-olive.txt`) and metainfer search the same FP32 ONNX model with the same "
        f"samples, the same accuracy budget (quality drop <= {MAX_DROP} against FP32) and the same number K of "
        f"candidate evaluations: `metainfer adapt --budget-trials K` vs Olive's joint search "
        f"(`OnnxQuantization` with Olive's own default search space, then `OrtSessionParamsTuning` over "
        f"metainfer's optimisation levels, intra-op threads {results['threads']} and execution modes; "
        f"TPE sampler, `max_samples` K, seed {SEED}); one Olive sample is one quantized model with one session "
        f"setting, evaluated for p50 latency (objective, {OLIVE_REPEAT} runs) and the same quality score (goal). "
        f"Olive's tuning pass also times a baseline and the tuned setting inside each sample, so Olive measures "
        f"about three latencies per candidate where metainfer measures one. The searches run one after the "
        f"other. Afterwards every output is measured here with metainfer's code: FP32 with ORT's default "
        f"SessionOptions, Olive's best model with the session options Olive chose, metainfer's variant with its "
        f"recipe's session options; timed in {results['rounds']} alternating rounds, quality on all samples. "
        f"Search wall time is each whole command (`metainfer adapt`, Olive's workflow run), start to exit."
    )
    notes = (
        "Olive needed three things to run here, each recorded in `bench/requirements-olive.txt` or "
        "`bench/olive_peer_driver.py`: olive-ai hard-requires torch, and the registry has only the CUDA build "
        "for Linux (about 3 GiB of CUDA libraries, never loaded on this CPU run); pydantic is pinned to 2.13.5 "
        "because 2.14 breaks Olive's enum validation; and olive-ai 0.13.0 cannot run a custom metric through "
        "its workflow runner (two serializers call `None.model_dump()` and the metric's user config is dropped "
        "when the config is round-tripped), which the driver works around without touching Olive's search, "
        "passes or evaluator."
    )
    load = (
        f"Load average (1 min) at start {results['load_start']}, at end {results['load_end']} on "
        f"{os.cpu_count()} logical cores; other work on the machine slows all three models of a table alike "
        "(interleaved timing) but makes the search wall times noisier."
    )
    parts = [intro, notes, load]
    parts += [render_model(name, result) for name, result in results["models"].items()]
    judged = [r["verdict"] for r in results["models"].values() if r["verdict"] is not None]
    if judged and all(judged):
        overall = "met on every model"
    elif judged:
        overall = "missed on " + ", ".join(n for n, r in results["models"].items() if r["verdict"] is False)
    else:
        overall = "not judged"
    parts.append(
        f"**Target** (adapted variant at least as fast as Olive's at equal or better quality; quality counts as "
        f"equal within {QUALITY_TIE}): {overall}."
    )
    return "\n\n".join(parts)


def render_unavailable(reason: str, results: dict[str, Any]) -> str:
    return (
        "Olive could not be installed or run on this machine, so there is no comparison.\n\n"
        f"Reason: `{reason}`\n\n"
        f"**Target** (adapted variant at least as fast as Olive's at equal or better quality): not judged, "
        f"because Olive did not run. Environment tried: `{results.get('olive_venv')}`."
    )


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bert_mini only, K=4, short timing")
    parser.add_argument("--models", nargs="+", choices=sorted(BATCHES), help="default: bert_mini digits")
    parser.add_argument("--budget", type=int, help="K, candidate evaluations per search (default 24, quick 4)")
    parser.add_argument("--rounds", type=int, help="alternating timing rounds (default 10, quick 5)")
    parser.add_argument("--seconds", type=float, help="timing seconds per model per round (default 2, quick 1)")
    parser.add_argument("--olive-venv", type=Path, default=DEFAULT_VENV, help=f"default {DEFAULT_VENV}")
    parser.add_argument("--work", type=Path, help="keep models, configs and logs here (default: a temp dir)")
    parser.add_argument("--timeout-s", type=float, default=3600, help="limit for each search")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the section from bench/results/olive_peer.json (same numbers, command and machine facts)",
    )
    args = parser.parse_args(argv)
    if args.render_only:
        saved = json.loads((benchlib.RESULTS / "olive_peer.json").read_text())
        data = {k: v for k, v in saved.items() if k not in ("benchmark", "command", "machine")}
        benchlib.write_result(
            "olive_peer", "Peer comparison: Microsoft Olive", data, render(data), saved["command"], saved["machine"]
        )
        return 0
    models = args.models or (["bert_mini"] if args.quick else ["bert_mini", "digits"])
    budget = args.budget or (4 if args.quick else 24)
    rounds = args.rounds or (5 if args.quick else 10)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    work = args.work or Path(tempfile.mkdtemp(prefix="olive_peer_"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "quick": args.quick,
        "budget": budget,
        "rounds": rounds,
        "max_accuracy_drop": MAX_DROP,
        "seed": SEED,
        "threads": thread_choices(),
        "olive_venv": str(args.olive_venv),
        "work": str(work),
        "load_start": _load(),
        "models": {},
    }
    title = "Peer comparison: Microsoft Olive"
    try:
        results["olive_env"] = ensure_olive(args.olive_venv, REQUIREMENTS)
    except OliveUnavailable as exc:
        print(f"Olive unavailable: {exc}", file=sys.stderr)
        results["olive_unavailable"] = str(exc)
        benchlib.write_result("olive_peer", title, results, render_unavailable(str(exc), results))
        return 1
    print(f"Olive {results['olive_env']['olive']} in {args.olive_venv}; work dir {work}", flush=True)
    examples = build_examples(work / "examples", models)
    for name in models:
        example, batch = examples[name], BATCHES[name]
        model_work = work / name
        model_work.mkdir(parents=True, exist_ok=True)
        reference = model_work / "olive_reference.npz"
        write_olive_reference(example, load_dataset(example), batch, reference)
        config = olive_workflow(example, batch, budget, reference, model_work / "olive", results["threads"])
        print(f"[{name}] Olive search, K={budget} ...", flush=True)
        olive = run_olive(args.olive_venv, config, model_work / "olive", args.timeout_s)
        print(f"[{name}] Olive: {olive.wall_s:.0f} s {olive.error or ''}", flush=True)
        print(f"[{name}] metainfer search, K={budget} ...", flush=True)
        ours = run_metainfer(example, batch, budget, model_work, args.timeout_s)
        print(f"[{name}] metainfer: {ours.wall_s:.0f} s {ours.error or ''}", flush=True)
        rows = measure(example, batch, [olive, ours], rounds, seconds)
        met, text = verdict(rows)
        for r in rows:
            print(f"[{name}] {r.name:<28} p50 {r.p50_ms:8.1f} ms  p95 {r.p95_ms:8.1f} ms  quality {r.quality:.4f}")
        print(f"[{name}] {text}", flush=True)
        results["models"][name] = {
            "batch": batch,
            "samples": example.samples,
            "budget": budget,
            "measured": [r.__dict__ for r in rows],
            "olive": {k: v for k, v in olive.__dict__.items() if k != "tool"},
            "metainfer": {k: v for k, v in ours.__dict__.items() if k != "tool"},
            "verdict": met,
            "verdict_text": text,
        }
        # Written after each model, so a long run that is stopped still leaves the models it finished.
        results["load_end"] = _load()
        benchlib.write_result("olive_peer", title, results, render(results))
    print(f"wrote bench/results/olive_peer.json and .md; work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
