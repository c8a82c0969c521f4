"""The whole local pipeline on the digits model, in-process and through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.pipeline import Adaptation, AdaptSettings
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints

FAST = MeasureSettings(warmup_runs=1, round_runs=5, min_runs=10, max_runs=30, max_seconds=0.3)


def _run(digits, profile: HardwareProfile, **kw):
    base, info, data = digits
    settings = AdaptSettings(batch=32, budget_trials=6, seed=3, measure=FAST, **kw)
    return Adaptation(base, info, data, profile, settings).run()


def test_adaptation_finds_a_valid_variant(digits, quick_profile: HardwareProfile) -> None:
    report, variant = _run(digits, quick_profile)
    assert len(report.trials) == 6
    assert report.best is not None and variant is not None
    assert report.best.score is not None
    assert report.final is not None and report.final.speedup_p50 > 0
    if report.final.kept_baseline:
        # FAST timing on a 0.05 ms model: the winner can re-measure slower than FP32, which then stays.
        assert report.best.recipe == report.baseline.recipe and report.final.speedup_p50 < 1.0
    else:
        assert all(report.best.score >= t.score for t in report.trials if t.score is not None)
    assert report.validation is not None and report.validation.passed
    assert report.best.metrics is not None
    assert report.best.metrics.quality.drop <= report.settings.constraints.max_quality_drop
    # The variant written is runnable as is with the recipe's session settings.
    _, _, data = digits
    out = create_session(variant, report.best.recipe).run(None, data.batch(0, 4))
    assert out[0].shape == (4, 10)


def test_same_seed_starts_with_the_same_candidate(digits, quick_profile: HardwareProfile) -> None:
    # Later asks depend on measured scores (timing noise); the first depends on the seed alone.
    a, _ = _run(digits, quick_profile)
    b, _ = _run(digits, quick_profile)
    assert a.trials[0].point == b.trials[0].point


def test_impossible_slo_yields_no_best(digits, quick_profile: HardwareProfile) -> None:
    report, variant = _run(digits, quick_profile, constraints=Constraints(slo_p95_ms=1e-6))
    assert report.best is None and variant is None
    assert all(t.status in ("infeasible", "failed") for t in report.trials)
    assert report.baseline.violations


def test_a_winner_slower_than_fp32_back_to_back_is_not_shipped(
    digits, quick_profile: HardwareProfile, monkeypatch
) -> None:
    real = Adaptation._final_comparison
    compared: list[int] = []

    def slower(self, baseline, best, variant):  # type: ignore[no-untyped-def]
        compared.append(best.index)
        return real(self, baseline, best, variant).model_copy(update={"speedup_p50": 0.5})

    monkeypatch.setattr(Adaptation, "_final_comparison", slower)
    report, variant = _run(digits, quick_profile)
    assert compared, "the final comparison always runs when a candidate validates"
    if compared[0] == 0:  # the search's own winner was FP32: nothing to fall back from
        assert report.final is not None and not report.final.kept_baseline
        return
    assert report.final is not None and report.final.kept_baseline
    assert "0.50x of FP32" in report.final.note
    assert report.best is not None and report.best.index == 0 and report.best.recipe == Recipe(batch=32)
    assert report.validation is not None and report.validation.passed
    assert variant is not None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metainfer.agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )


@pytest.fixture(scope="module")
def adapted(examples: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("adapt")
    model = examples["digits"]
    proc = _cli(
        "adapt",
        str(model),
        "--data",
        str(model.parent / "data.npz"),
        "--batch",
        "16",
        "--budget-trials",
        "5",
        "--max-accuracy-drop",
        "0.02",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model, out


def test_cli_writes_the_four_outputs(adapted: tuple[Path, Path]) -> None:
    _, out = adapted
    assert {p.name for p in out.iterdir()} >= {"model.onnx", "recipe.json", "report.json", "pareto.png"}
    recipe_doc = json.loads((out / "recipe.json").read_text())
    assert set(recipe_doc["session_options"]) >= {
        "graph_optimization_level",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "execution_mode",
    }
    assert recipe_doc["providers"][-1] == "CPUExecutionProvider"
    recipe = Recipe.model_validate(recipe_doc)
    onnx.checker.check_model(onnx.load(str(out / "model.onnx")))
    report = json.loads((out / "report.json").read_text())
    assert len(report["trials"]) == 5 and report["baseline"]["metrics"]["latency"]["p95_ms"] > 0
    assert report["profile"]["fingerprint"] and report["search_wall_s"] > 0
    assert recipe.batch == 16
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["adapt", "/nonexistent.onnx", "--data", "x.npz", "--out", "o"], "no such file"),
        (["adapt", "{model}", "--data", "{wrong_npz}", "--out", "{out}"], "not model inputs"),
        (["adapt", "{text}", "--data", "{npz}", "--out", "{out}"], "not an ONNX model"),
        (["adapt", "{model}", "--data", "{npz}", "--budget-trials", "0", "--out", "{out}"], "must be >= 1"),
        (["adapt", "{model}", "--data", "{npz}", "--max-accuracy-drop", "2", "--out", "{out}"], "between 0 and 1"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    args: list[str], needle: str, examples: dict[str, Path], tmp_path: Path
) -> None:
    model = examples["digits"]
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, pixels=np.zeros((4, 64), np.float32))
    text = tmp_path / "model.onnx"
    text.write_text("hello")
    values = {
        "model": str(model),
        "npz": str(model.parent / "data.npz"),
        "wrong_npz": str(wrong),
        "text": str(text),
        "out": str(tmp_path / "out"),
    }
    proc = _cli(*(a.format(**values) for a in args))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_cli_no_feasible_candidate_exits_3(examples: dict[str, Path], tmp_path: Path) -> None:
    model = examples["digits"]
    proc = _cli(
        "adapt",
        str(model),
        "--data",
        str(model.parent / "data.npz"),
        "--slo-p95-ms",
        "0.000001",
        "--budget-trials",
        "3",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "no feasible candidate" in proc.stderr and "latency: p95" in proc.stderr
    assert (tmp_path / "report.json").exists() and not (tmp_path / "model.onnx").exists()
