"""The ``metainfer`` command as a person meets it: flags, errors, version, progress in logs."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from metainfer.agent.cli import ALGORITHM_HELP, build_parser, main
from metainfer.agent.progress import LogObserver, RichObserver, progress_for
from metainfer.core.engine.algorithms import ALGORITHM_NAMES
from metainfer.core.engine.phases import PipelinePhase
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.report import Report
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics, TrialStatus

# What a model run imports and a flag or path error must not wait for.
HEAVY = {"onnx", "onnxruntime", "numpy", "scipy", "sklearn", "skopt", "matplotlib"}
ENV = {"PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metainfer.agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        cwd=cwd,
    )


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"metainfer {version('metainfer')}"


def test_adapt_help_describes_every_algorithm_and_weight() -> None:
    assert set(ALGORITHM_HELP) == set(ALGORITHM_NAMES)
    sub = build_parser()._subparsers._group_actions[0].choices["adapt"]  # type: ignore[union-attr]
    text = sub.format_help()
    for name in ALGORITHM_NAMES:
        assert re.search(rf"^\s+{name}\s+\S", text, re.MULTILINE), f"--help does not describe {name}"
    for flag in ("--latency-weight", "--throughput-weight", "--memory-weight", "--quality-weight", "--algorithm"):
        assert flag in text


ADAPT = ["adapt", "m.onnx", "--data", "d.npz", "--out", "o"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([*ADAPT, "--batch", "abc"], "argument --batch: expected a whole number, got 'abc'"),
        ([*ADAPT, "--batch", "0"], "argument --batch: must be >= 1, got 0"),
        ([*ADAPT, "--budget-trials", "5000"], "argument --budget-trials: must be <= 2000, got 5000"),
        ([*ADAPT, "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        ([*ADAPT, "--seed", "x"], "argument --seed: expected a whole number, got 'x'"),
        ([*ADAPT, "--slo-p95-ms", "fast"], "argument --slo-p95-ms: expected a number, got 'fast'"),
        ([*ADAPT, "--max-accuracy-drop", "nan"], "argument --max-accuracy-drop: expected a finite number"),
        ([*ADAPT, "--time-budget-s", "0.5"], "argument --time-budget-s: must allow at least 1 s of search"),
        ([*ADAPT, "--memory-weight", "-1"], "argument --memory-weight: must be >= 0, got -1"),
        ([*ADAPT, "--algorithm", "annealing"], "argument --algorithm: invalid choice: 'annealing'"),
        (["adapt"], "the following arguments are required: MODEL, --out"),
        (["examples", "make", "x"], "argument ACTION: invalid choice: 'make'"),
        (["serve", "--model-uri", "x", "--recipe", "r", "--port", "http"], "argument --port: expected a whole number"),
    ],
)
def test_flag_errors_name_the_flag_not_the_code(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _usage_error(capsys, argv)
    assert needle in err, err
    # Python's names for the converters and types are not what the user typed.
    assert not re.search(r"_\w+ value|invalid (int|float) value|Error\b|dest|Namespace", err), err


def _loaded_at_exit(proc: subprocess.CompletedProcess[str]) -> tuple[set[str], list[str]]:
    """The top-level packages ``-X importtime`` logged, and the other stderr lines."""
    imported, rest = set(), []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
        elif line.strip():
            rest.append(line)
    return imported, rest


ALL_WEIGHTS_ZERO = ["--latency-weight", "0", "--quality-weight", "0"]


@pytest.mark.parametrize(
    ("make_args", "needle"),
    [
        (lambda d: ["missing.onnx", "--data", str(d / "d.npz"), "--out", str(d / "o")], "missing.onnx: no such file"),
        (lambda d: [str(d / "m.onnx"), "--data", "nope.npz", "--out", str(d / "o")], "nope.npz: no such file"),
        (lambda d: [str(d / "empty.onnx"), "--data", str(d / "d.npz"), "--out", str(d / "o")], "file is empty"),
        (lambda d: [str(d / "m.onnx"), "--data", str(d / "d.npz"), "--out", str(d / "m.onnx")], "not a directory"),
        (
            lambda d: [str(d / "m.onnx"), "--data", str(d / "d.npz"), "--out", str(d / "m.onnx" / "o")],
            "cannot create the directory",
        ),
        (
            lambda d: [str(d / "m.onnx"), "--data", str(d / "d.npz"), "--out", "o", *ALL_WEIGHTS_ZERO],
            "at least one objective weight must be > 0",
        ),
        (
            lambda d: [str(d / "m.onnx"), "--data", str(d / "d.npz"), "--history", "gone", "--out", "o"],
            "--history gone: no such file or directory",
        ),
        (
            lambda d: [str(d / "m.onnx"), "--data", str(d / "d.npz"), "--history", str(d), "--out", "o"],
            "no report.json under this directory",
        ),
    ],
)
def test_path_and_flag_errors_come_before_the_inference_stack_loads(
    make_args: Callable[[Path], list[str]], needle: str, tmp_path: Path
) -> None:
    (tmp_path / "m.onnx").write_bytes(b"not checked before the paths are")
    (tmp_path / "d.npz").write_bytes(b"nor this")
    (tmp_path / "empty.onnx").write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "metainfer.agent.cli", "adapt", *make_args(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=tmp_path,
    )
    imported, lines = _loaded_at_exit(proc)
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
    assert "metainfer" in imported, "the import log is empty: -X importtime did not apply"
    assert not imported & HEAVY, f"loaded {sorted(imported & HEAVY)} before reporting: {lines[0]}"


# -- progress -------------------------------------------------------------------------------------


def _trial(index: int, threads: int, p50: float) -> Trial:
    return Trial(
        index=index,
        point={},
        recipe=Recipe(
            transform=TransformSpec(quantization=QuantizationSpec(mode="int8_static")),
            session=SessionSpec(intra_op_num_threads=threads),
        ),
        status=TrialStatus.FEASIBLE,
        metrics=TrialMetrics(
            latency=LatencyStats(
                p50_ms=p50, p95_ms=p50, p99_ms=p50, mean_ms=p50, runs=20, warmup_runs=1, throughput_per_s=1e3 / p50
            ),
            quality=Quality(metric="top1_accuracy", value=0.97, reference=0.98, drop=0.01, samples=10),
            peak_memory_mib=200.0,
            model_size_mib=1.0,
        ),
        score=1.0,
    )


def test_terminals_get_bars_and_logs_get_lines() -> None:
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=True)), RichObserver)
    assert isinstance(progress_for(Console(file=io.StringIO())), LogObserver)


def test_a_log_gets_a_line_per_trial_and_steps_at_most_every_interval() -> None:
    now = [0.0]
    buffer = io.StringIO()
    observer = LogObserver(Console(file=buffer, width=80), interval_s=5.0, clock=lambda: now[0])
    with observer:
        observer.phase(PipelinePhase.PROFILING, None)
        for step in range(1, 101):  # 100 benchmark steps over 20 s: one line per 5 s, not 100
            now[0] += 0.2
            observer.on_step(step, 100, f"bench {step}")
        observer.phase(PipelinePhase.SEARCH, 3)
        now[0] += 0.1
        observer.trial(_trial(1, 1, 2.0), None)
        observer.phase(PipelinePhase.SENSITIVITY, 16, detail="int8_static")  # inside the search, on demand
        now[0] += 0.1
        observer.advance("layer fc1")
        observer.trial(_trial(2, 4, 1.5), _trial(2, 4, 1.5))
    lines = buffer.getvalue().splitlines()
    profiling = [line for line in lines if "hardware profile " in line and "started" not in line]
    assert 4 <= len(profiling) <= 6 and profiling[-1].endswith("100/100: bench 100")
    trials = [line for line in lines if re.search(r"\] search \d", line)]
    assert len(trials) == 2
    assert "search 1/3: int8 static per-tensor, 1 thread: p50 2 ms, top1_accuracy 0.9700" in trials[0]
    # The sensitivity scan in between does not take over the search's count.
    assert "search 2/3: int8 static per-tensor, 4 threads" in trials[1] and "best so far p50 1.5 ms" in trials[1]
    assert all(len(line) > 80 for line in trials), "a log line is one line, not wrapped at the console width"
    assert not any("\x1b[" in line for line in lines)


# -- a whole run, as a CI log shows it -------------------------------------------------------------


def test_adapt_in_a_log_warns_about_a_batch_larger_than_the_data(examples: dict[str, Path], tmp_path: Path) -> None:
    model = examples["digits"]
    with np.load(model.parent / "data.npz") as npz:
        np.savez(tmp_path / "few.npz", **{k: npz[k][:6] for k in npz.files})
    out = tmp_path / "out"
    proc = _run(
        "adapt",
        str(model),
        "--data",
        str(tmp_path / "few.npz"),
        "--batch",
        "16",
        "--budget-trials",
        "2",
        "--algorithm",
        "random",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    assert "warning: --batch 16 is larger than the 6 samples" in err
    # Plain lines (stderr is a pipe here): one per finished trial, labelled in words, no bars or escapes.
    assert len(re.findall(r"^\[\s*[\d.]+s\] search \d/2: ", err, re.MULTILINE)) == 2, err
    assert "\x1b[" not in err and "━" not in err
    assert re.search(r"timing noise band ±\d+\.\d%", proc.stdout), proc.stdout
    report = Report.model_validate_json((out / "report.json").read_text())
    assert report.latency_noise_band is not None and report.latency_noise_band > 0
    # The peak memory column is the process's peak, not a growth that rounds to 0.
    assert report.baseline.metrics is not None
    peak = report.baseline.metrics.peak_memory_mib
    assert peak > 20 and f"{peak:.1f}" in proc.stdout


def test_bars_keep_the_search_count_across_a_sensitivity_scan() -> None:
    observer = RichObserver(Console(file=io.StringIO(), force_terminal=True, width=200))
    with observer:
        observer.phase(PipelinePhase.SEARCH, 3)
        observer.trial(_trial(1, 1, 2.0), None)
        observer.phase(PipelinePhase.SENSITIVITY, 16, detail="int8_static")
        observer.advance("layer fc1")
        observer.trial(_trial(2, 4, 1.5), None)
        observer.trial(_trial(3, 2, 1.7), None)
        search, sensitivity = observer.progress.tasks
        assert (search.completed, search.total) == (3, 3)
        assert sensitivity.finished  # closed when the search resumed, not left at 1/16
        assert "int8 static per-tensor, 2 threads: p50 1.7 ms" in search.fields["label"]
        observer.phase(PipelinePhase.VALIDATION, 1)
        assert search.finished and len(observer.progress.tasks) == 3


def test_a_history_file_that_is_no_report_is_named(
    examples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = examples["digits"]
    (tmp_path / "notes.json").write_text('{"hello": "world"}')
    notes, data = str(tmp_path / "notes.json"), str(model.parent / "data.npz")
    code = main(["adapt", str(model), "--data", data, "--history", notes, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and f"--history {tmp_path / 'notes.json'}: not a readable metainfer report.json" in err, err
