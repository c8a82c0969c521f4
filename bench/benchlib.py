"""What every benchmark shares: the machine it ran on, where results go, BENCHMARKS.md.

Each benchmark writes ``bench/results/<name>.json`` (machine-readable, with the
machine and the exact command); bench/render.py renders its section of
BENCHMARKS.md from that JSON alone, through the benchmark's typed record
(bench/records.py). ``write_benchmarks_md`` puts the sections in a fixed
order, so a benchmark rerun alone replaces only its own section.

The bench scripts import each other as modules of the development package
``bench`` (bench/pyproject.toml, installed editable by ``make venv``), so they
run as ``python bench/<name>.py`` with PYTHONSAFEPATH=1, which keeps the
repository root, whose ``operator/`` folder would shadow the standard library,
off the import path.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metainfer.core.engine.profile.fingerprint import detect_machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"

# Section order in BENCHMARKS.md; a name not listed here goes last, sorted.
SECTIONS = (
    "adaptation",
    "export_matrix",
    "cnn_matrix",
    "runtime_choice",
    "weights",
    "llm_peers",
    "search_efficiency",
    "warm_start",
    "operator_scale",
    "olive_peer",
    "serving",
    "pod_start",
)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine() -> dict[str, Any]:
    """The machine facts every result carries: cores, CPU flags, runtime versions, date, commit."""
    import onnx
    import onnxruntime

    info = detect_machine()
    return {
        "cpu_model": info.cpu_model,
        "arch": info.arch,
        "logical_cores": info.logical_cores,
        "physical_cores": info.physical_cores,
        "cpu_flags": info.cpu_flags,
        "memory_gib": round(info.total_memory_bytes / 2**30, 1),
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "python": sys.version.split()[0],
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(),
    }


def machine_line(facts: dict[str, Any]) -> str:
    """One markdown paragraph describing the machine (for a section header)."""
    flags = " ".join(facts["cpu_flags"]) or "none detected"
    return (
        f"Machine: {facts['cpu_model']} ({facts['arch']}), {facts['logical_cores']} logical / "
        f"{facts['physical_cores']} physical cores, {facts['memory_gib']} GiB; CPU flags: {flags}; "
        f"ONNX Runtime {facts['onnxruntime']}, onnx {facts['onnx']}, Python {facts['python']}. "
        f"Run {facts['date']} at commit {facts['commit']}."
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are str()-ed as they are (format numbers before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """The command that is running, as a person would retype it."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(ROOT)
    return shlex.join(["python", str(script), *sys.argv[1:]])


def retypeable(command: str) -> str:
    """A saved command as it is typed with the ``bench`` package installed: without a ``PYTHONPATH=bench`` prefix.

    The raw results keep the command verbatim; sections and notes show this form.
    """
    return command.removeprefix("PYTHONPATH=bench ")


def write_result(
    name: str,
    title: str,
    data: dict[str, Any],
    command: str | None = None,
    facts: dict[str, Any] | None = None,
) -> Path:
    """Save ``data`` as bench/results/<name>.json, then render BENCHMARKS.md from the saved results.

    The JSON is validated against the section's record (bench/records.py) at once, so a result its renderer
    cannot read fails here, and ``title`` must be the one bench/render.py renders. ``facts`` keeps the machine
    facts (and date) of an earlier run when a section is only rendered again from saved measurements.
    """
    from bench import render

    if name not in render.SECTIONS:
        raise ValueError(f"{name}: no section in bench/render.py renders it")
    if title != render.SECTIONS[name].title:
        raise ValueError(f"{name}: title {title!r} is not the one bench/render.py renders")
    RESULTS.mkdir(parents=True, exist_ok=True)
    facts = facts or machine()
    command = command or command_line()
    payload = {"benchmark": name, "command": command, "machine": facts, **data}
    json_path = RESULTS / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    render.load(name)
    write_benchmarks_md()
    return json_path


def merge_into_saved(name: str, rows: list[dict[str, Any]], key: str) -> tuple[list[dict[str, Any]], str]:
    """A partial rerun's rows (``--only``) merged into the saved result, and the commands of both runs.

    Rows with the same ``key`` are replaced in place, new ones appended, the others kept, so a section
    never loses the rows a rerun did not measure, and its command line says how each part was made.
    """
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return rows, command_line()
    saved = json.loads(path.read_text())
    fresh = {r[key]: r for r in rows}
    merged = [fresh.pop(r[key], r) for r in saved["rows"]] + list(fresh.values())
    return merged, f"{saved['command']} && {command_line()}"


def write_benchmarks_md() -> None:
    """BENCHMARKS.md = a fixed preamble + every saved section, in SECTIONS order (bench/render.py)."""
    from bench import render

    BENCHMARKS_MD.write_text(render.benchmarks_md())
