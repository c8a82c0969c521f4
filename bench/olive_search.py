"""The two searches, run one after the other: Olive's workflow in Olive's venv, and ``metainfer adapt``.

One job: run each search as a user would (the whole command, timed start to
exit) and return what it produced (bench/olive_output.py's SearchOutcome).
Olive's venv comes from testkit/peer_env.py (``peer_env.OLIVE``). Olive is also
one contender of the peer matrices (bench/export_matrix.py, bench/cnn_matrix.py):
``olive_contender`` runs the same workflow on any ONNX model and turns its
output into a contender for bench/peers_driver.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.olive_measure import load_dataset, write_olive_reference
from bench.olive_output import (
    SearchOutcome,
    describe_olive_quantization,
    describe_olive_settings,
    read_olive_output,
    why_olive_failed,
)
from bench.olive_workflow import MAX_DROP, SEED, olive_workflow, thread_choices
from metainfer.agent.zoo.build import ExampleModel
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import Report
from testkit import peer_env

DRIVER = Path(__file__).resolve().parent / "olive_peer_driver.py"
DEFAULT_VENV = peer_env.OLIVE.venv
METAINFER = Path(sys.executable).parent / "metainfer"


class OliveUnavailable(RuntimeError):
    """Olive could not be installed or imported; the message says exactly why."""


def _olive_env() -> dict[str, str]:
    """Environment for Olive's processes: no telemetry, no hub access, stdlib not shadowed by operator/."""
    return peer_env.subprocess_env(
        OLIVE_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )


def olive_version(venv: Path) -> str | None:
    """Olive's version if the venv imports olive and torch, else None."""
    probe = "import torch, onnxruntime, olive.workflows; print(olive.__version__)"
    return peer_env.probe_output(venv / "bin" / "python", probe)


def ensure_olive(venv: Path = DEFAULT_VENV) -> dict[str, Any]:
    """Reuse or build Olive's venv from its lock (testkit/peer_env.py); raises OliveUnavailable with the cause."""
    try:
        ready = peer_env.ensure(replace(peer_env.OLIVE, venv=venv))
    except peer_env.PeerEnvUnavailable as exc:
        raise OliveUnavailable(str(exc)) from exc
    version = olive_version(venv)
    if not version:
        raise OliveUnavailable(f"Olive in {venv} does not report its version")
    if not ready.built_now:
        return {"venv": str(venv), "olive": version, "installed_now": False}
    return {"venv": str(venv), "olive": version, "installed_now": True, "install_s": ready.install_s}


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
        return SearchOutcome("olive", wall, error=f"olive run exited {code}: {why_olive_failed(log.read_text())}")
    return read_olive_output(work / "output", wall, log)


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
        ensure_olive(DEFAULT_VENV)
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
