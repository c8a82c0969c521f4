"""The local pipeline on the digits model, timed for real by ONNX Runtime, in-process and through `metainfer adapt`.

An integration test: what it measures depends on the machine, so it asserts only what holds whatever the timings
(the decisions themselves are unit-tested against tests/fakes.py's FakeMeasurer in tests/unit/test_pipeline.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.report import AdaptSettings, Report
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.transforms.build import build_variant

Digits = tuple[bytes, ModelInfo, Dataset]
FAST = MeasureSettings(warmup_runs=1, round_runs=5, min_runs=10, max_runs=30, max_seconds=0.3)
BATCH = 32
FP32 = Recipe(batch=BATCH)


def _run(
    digits: Digits, profile: HardwareProfile, constraints: Constraints | None = None
) -> tuple[Report, bytes | None]:
    base, info, data = digits
    settings = AdaptSettings(
        batch=BATCH, budget_trials=6, seed=3, measure=FAST, constraints=constraints or Constraints()
    )
    return Adaptation(base, info, data, profile, settings).run()


def test_adaptation_finds_a_valid_variant(digits: Digits, quick_profile: HardwareProfile) -> None:
    report, variant = _run(digits, quick_profile)
    assert len(report.trials) == 6
    assert report.best is not None and variant is not None
    assert report.best.score is not None and report.best.metrics is not None
    assert report.validation is not None and report.validation.passed
    assert report.best.metrics.quality.drop <= report.settings.constraints.max_quality_drop
    assert report.baseline.metrics is not None
    lat = report.baseline.metrics.latency
    assert 0 < lat.p50_ms <= lat.p95_ms <= lat.p99_ms and FAST.min_runs <= lat.runs <= FAST.max_runs
    final = report.final
    assert final is not None and final.speedup_p50 > 0
    assert final.baseline.quality == report.baseline.metrics.quality  # re-measured for latency only
    # Whatever the timings: what ships is FP32, or a variant not slower than FP32 back to back beyond the
    # timing noise; FP32 is kept only for a winner that re-measured slower, or faster only within the noise, or
    # slower beyond the noise at the percentile the SLO is written in (p95 here: CI saw a winner 1.18x faster at
    # p50 kept back for its p95, which this assertion had ignored).
    band = report.latency_noise_band
    assert band is not None and band > 0
    assert report.best.index == 0 or final.speedup_p50 >= 1 / (1 + band)
    assert final.slo_percentile == "p95"
    slower_in_the_tail = final.speedup_p95 < 1 / (1 + band)
    assert not final.kept_baseline or (
        report.best.recipe == FP32 and (final.speedup_p50 < 1 + band or slower_in_the_tail)
    )
    # The variant returned is runnable as is with the recipe's session settings.
    _, _, data = digits
    out = create_session(variant, report.best.recipe).run(None, data.batch(0, 4))
    assert out[0].shape == (4, 10)


def test_impossible_slo_yields_no_best(digits: Digits, quick_profile: HardwareProfile) -> None:
    report, variant = _run(digits, quick_profile, Constraints(slo_p95_ms=1e-6))
    assert report.best is None and variant is None
    assert all(t.status in ("infeasible", "failed") for t in report.trials)
    assert report.baseline.violations


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
    report = Report.model_validate_json((out / "report.json").read_text())
    assert len(report.trials) == 5 and report.baseline.metrics is not None
    assert report.baseline.metrics.latency.p95_ms > 0
    assert report.profile.fingerprint and report.search_wall_s > 0
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
        (["adapt", "{model}", "--input-shape", "nope=-1,3", "--out", "{out}"], "['nope'] are not model inputs"),
        (["adapt", "{model}", "--input-shape", "input=-1,x", "--out", "{out}"], "with whole dims"),
        (["adapt", "{model}", "--data", "{npz}", "--input-shape", "input=-1,64", "--out", "{out}"], "without --data"),
        (["adapt", "{model}", "--data-sha256", "0" * 64, "--out", "{out}"], "no --data was given"),
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


def test_cli_without_data_adapts_on_random_inputs_and_names_the_axes_it_had_to_guess(tmp_path: Path) -> None:
    """A policy without data adapts on seeded random inputs; `metainfer adapt` required --data, though the same
    pipeline runs either way. Open axes other than the batch get length 1, and the note says which."""
    from onnx import helper, numpy_helper

    kernel = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "K")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "K"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["c"], ["g"]),
            helper.make_node("Flatten", ["g"], ["y"]),
        ],
        "dynamic_image",
        [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["N", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])],
        [kernel],
    )
    model = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(model))
    guessed = _cli("adapt", str(model), "--budget-trials", "2", "--out", str(tmp_path / "guessed"))
    assert guessed.returncode == 0, guessed.stderr[-2000:]
    said = " ".join((guessed.stdout + guessed.stderr).split())
    assert "no --data: quality measured against FP32's outputs on 128 seeded random inputs" in said
    assert "image axis 2 (height), image axis 3 (width)" in said and "--input-shape" in said
    shaped = tmp_path / "shaped"
    proc = _cli("adapt", str(model), "--input-shape", "image=-1,3,32,32", "--budget-trials", "2", "--out", str(shaped))
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "no --data" in said and "leaves open" not in said
    report = Report.model_validate_json((shaped / "report.json").read_text())
    assert report.baseline.metrics is not None and report.baseline.metrics.quality.samples == 128


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


def test_a_detector_with_its_nms_adapts_on_its_boxes_and_the_report_says_what_was_left_out(
    quick_profile: HardwareProfile, tmp_path: Path
) -> None:
    """The detections non-max suppression keeps are the run's, not a sample's: before, validation crashed comparing
    (35, 3) with (38, 3) rows; now the boxes carry the quality budget and the report names what was not compared."""
    from odd_exports import detector

    from metainfer.core.engine.modelinfo import inspect_model

    model = detector()
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    data = Dataset({"x": np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)})
    settings = AdaptSettings(batch=8, budget_trials=3, seed=0, measure=FAST)
    report, variant = Adaptation(model, inspect_model(path), data, quick_profile, settings).run()
    assert report.best is not None and variant is not None
    assert report.validation is not None and report.validation.passed, report.validation
    notes = report.space.notes
    assert any("'selected' left out of the quality comparison" in note for note in notes), notes


def test_a_model_that_takes_one_image_without_a_samples_axis_adapts_calibration_included(
    quick_profile: HardwareProfile, tmp_path: Path
) -> None:
    """Data of [samples, 3, H, W] for a model of [3, H, W] (torchvision's detectors): each sample is one run, and
    static int8's calibration reads the same feeds."""
    from odd_exports import unbatched_conv

    from metainfer.core.engine.data import make_dataset
    from metainfer.core.engine.modelinfo import inspect_model

    path = tmp_path / "model.onnx"
    path.write_bytes(unbatched_conv())
    info = inspect_model(path)
    data = make_dataset({"x": np.random.default_rng(1).standard_normal((48, 3, 8, 8)).astype(np.float32)}, info)
    settings = AdaptSettings(batch=1, budget_trials=3, seed=0, measure=FAST)
    report, variant = Adaptation(path.read_bytes(), info, data, quick_profile, settings).run()
    assert report.best is not None and variant is not None
    assert report.validation is not None and report.validation.passed, report.validation
    # Static int8 directly, whatever the search chose to measure: its calibration reads one sample per run.
    static = TransformSpec(quantization=QuantizationSpec(mode="int8_static"))
    built = build_variant(path.read_bytes(), static, data.head(16))
    (out,) = create_session(built, FP32.model_copy(update={"batch": 1})).run(None, data.batch(0, 1))
    assert out.shape == (4, 8, 8)
