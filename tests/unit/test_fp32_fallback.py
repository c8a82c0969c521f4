"""FP32 is always a valid answer (issue 65): what ships when validation rejects every ranked variant, what a
cluster keeps serving when FP32 misses only a latency bound, and the note for a quality budget finer than the
metric can move.

The pipeline runs on the digits model with ``FakeMeasurer`` (latency and memory pure functions of the recipe)
over a small space searched exhaustively; validation is real for what passes it, and a stand-in reports the
failures a test chooses (the real OCR recogniser failed at the largest batch and in shared runs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import FakeMeasurer, OfRecipe, fixed_profile

from metainfer.core.api.conditions import get_condition
from metainfer.core.api.run import AdaptationRunStatus
from metainfer.core.control import runstatus
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.pipeline import FP32_FALLBACK_ATTEMPTS, MAX_VALIDATION_ATTEMPTS, Adaptation
from metainfer.core.engine.quality_metrics import coarse_budget_note, quality_step
from metainfer.core.engine.recipe import INT8_MODES, Recipe, TransformSpec
from metainfer.core.engine.report import AdaptSettings, Report
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.trial import Quality, Trial
from metainfer.core.engine.validate import Check, ValidationReport

Digits = tuple[bytes, ModelInfo, Dataset]

BATCH = 32
BASELINE = Recipe(batch=BATCH)
SPACE: dict[str, list[str | int | float | bool]] = {
    "quantization": ["fp32", "int8_dynamic"],
    "keep_float": [0],
    "graph_optimization_level": ["all"],
    "execution_mode": ["sequential"],
}
# What the real OCR recogniser's int8 variants failed (issue 65).
FAILED_CHECK = Check(
    name="quality at batch 64 (largest)", passed=False, detail="argmax_agreement drop 0.0312 > budget 0.01"
)


def latency_ms(recipe: Recipe) -> float:
    """int8 four times as fast as FP32; more threads faster."""
    ms = 1.0 if recipe.transform.quantization.mode in INT8_MODES else 4.0
    return ms / (1 + 0.25 * recipe.session.intra_op_num_threads)


def is_fp32(recipe: Recipe) -> bool:
    return recipe.transform == TransformSpec()


@dataclass
class Validations:
    """Validation that fails every recipe ``fails`` names (with FAILED_CHECK) and runs for real otherwise;
    ``tried`` records the order."""

    fails: Callable[[Recipe], bool]
    tried: list[Recipe]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = Adaptation._validate

        def validate(adaptation: Adaptation, variant: bytes, recipe: Recipe) -> ValidationReport:
            self.tried.append(recipe)
            if not self.fails(recipe):
                return real(adaptation, variant, recipe)
            quality = Quality(metric="top1_accuracy", value=0.9, reference=0.95, drop=0.05, samples=64)
            return ValidationReport(passed=False, full_data_quality=quality, checks=[FAILED_CHECK])

        monkeypatch.setattr(Adaptation, "_validate", validate)


def _adapt(
    digits: Digits, constraints: Constraints, latency: OfRecipe = latency_ms
) -> tuple[Report, bytes | None, FakeMeasurer]:
    base, info, data = digits
    settings = AdaptSettings(batch=BATCH, budget_trials=256, algorithm="grid", overrides=SPACE, constraints=constraints)
    fake = FakeMeasurer(latency_ms=latency)  # every candidate peaks at 100 MiB
    report, variant = Adaptation(base, info, data, fixed_profile(), settings, measurer=fake).run()
    return report, variant, fake


def _fastest_fp32(report: Report) -> Trial:
    """The fastest FP32 trial with tuned session settings (the baseline left out), by the fake's latency."""
    return min((t for t in report.trials if is_fp32(t.recipe)), key=lambda t: latency_ms(t.recipe))


def _flat(text: str) -> str:
    return " ".join(text.split())


# -- every ranked variant fails validation: FP32 ships -------------------------------------------------------


def test_fp32_with_the_best_session_settings_ships_when_every_ranked_variant_fails_validation(
    digits: Digits, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 65: the top candidates failed validation, the attempts ran out before FP32, and the run reported no
    feasible candidate although FP32 with tuned session options was feasible."""
    validations = Validations(fails=lambda recipe: not is_fp32(recipe), tried=[])
    validations.install(monkeypatch)
    report, variant, fake = _adapt(digits, Constraints(max_quality_drop=0.05))
    tuned = _fastest_fp32(report)
    assert tuned.score is not None and tuned.recipe != BASELINE
    assert report.best is not None and report.best.recipe == tuned.recipe and variant is not None
    assert report.validation is not None and report.validation.passed
    # The ranked candidates (all int8: faster) were tried first and rejected; FP32 did not count against them.
    ranked = validations.tried[:MAX_VALIDATION_ATTEMPTS]
    assert not any(is_fp32(r) for r in ranked) and validations.tried[MAX_VALIDATION_ATTEMPTS] == tuned.recipe
    assert [r.recipe for r in report.rejected_by_validation][:MAX_VALIDATION_ATTEMPTS] == [r.describe() for r in ranked]
    assert all(
        r.failed_checks == [f"{FAILED_CHECK.name}: {FAILED_CHECK.detail}"] for r in report.rejected_by_validation
    )
    note = report.fallback_note
    assert note.startswith("no variant passed validation on all the data")
    assert all(r.describe() in note for r in ranked) and FAILED_CHECK.detail in note
    assert note.endswith(
        f"the FP32 model is shipped, with the session settings that passed it: {tuned.recipe.describe()}"
    )
    # What validation rejected does not race again in the final comparison.
    assert fake.compared and not set(fake.compared[0]) & set(ranked)
    # The CLI and the run's status say it.
    from metainfer.agent.commands import _print_summary

    _print_summary(report)
    assert _flat(note) in _flat(capsys.readouterr().out)
    done = runstatus.mark_succeeded(AdaptationRunStatus(), 1, report, [], variant_sha256="a" * 64)
    succeeded = get_condition(done.conditions, "Succeeded")
    assert done.phase == "Succeeded" and done.best_recipe == tuned.recipe
    assert succeeded is not None and note in succeeded.message


def test_the_fp32_baseline_ships_when_fp32_with_tuned_settings_fails_validation_too(
    digits: Digits, monkeypatch: pytest.MonkeyPatch
) -> None:
    validations = Validations(fails=lambda recipe: recipe != BASELINE, tried=[])
    validations.install(monkeypatch)
    report, variant, _ = _adapt(digits, Constraints(max_quality_drop=0.05))
    assert report.best is not None and report.best.index == 0 and variant is not None
    # Up to FP32_FALLBACK_ATTEMPTS tuned FP32 settings after the ranked candidates, then the baseline.
    tuned = [r for r in validations.tried if is_fp32(r) and r != BASELINE]
    assert 0 < len(tuned) <= FP32_FALLBACK_ATTEMPTS
    assert validations.tried[: MAX_VALIDATION_ATTEMPTS + len(tuned) + 1][-1] == BASELINE
    assert len(report.rejected_by_validation) == MAX_VALIDATION_ATTEMPTS + len(tuned)
    assert 0 not in {r.trial for r in report.rejected_by_validation}
    assert report.fallback_note.endswith(
        f"the FP32 model is shipped, with the session settings that passed it: {BASELINE.describe()}"
    )
    assert all(r.describe() in report.fallback_note for r in tuned)


def test_no_fallback_note_when_a_ranked_variant_passes(digits: Digits, monkeypatch: pytest.MonkeyPatch) -> None:
    validations = Validations(fails=lambda recipe: False, tried=[])
    validations.install(monkeypatch)
    report, _, _ = _adapt(digits, Constraints(max_quality_drop=0.05))
    assert report.best is not None and not is_fp32(report.best.recipe)
    assert report.fallback_note == "" and report.rejected_by_validation == [] and report.slo_unmet_fallback is None


# -- FP32 misses a hard bound and nothing is feasible --------------------------------------------------------


def test_fp32_missing_only_the_p95_slo_is_the_fallback_a_cluster_keeps_serving(digits: Digits, tmp_path: Path) -> None:
    # p95 is 1.2x the fake's median, at least 0.6 ms: every candidate misses a 0.5 ms SLO.
    report, variant, _ = _adapt(digits, Constraints(slo_p95_ms=0.5, max_quality_drop=0.05))
    assert report.best is None and variant is None, "adapt's outcome is unchanged: no feasible candidate"
    fallback = report.slo_unmet_fallback
    assert fallback is not None and fallback.validation.passed
    # FP32 nearest the SLO: the tuned settings of the fastest FP32 trial.
    assert fallback.trial.recipe == _fastest_fp32(report).recipe and report.shipped() is fallback.trial
    assert fallback.missed() and all(v.startswith("latency: p95") for v in fallback.missed())
    assert "> SLO 0.5 ms" in fallback.describe()
    # `metainfer adapt` exits 3, saying what FP32 measured against the SLO.
    from metainfer.agent.commands import _infeasible_message

    message = _infeasible_message(report, tmp_path)
    assert message.startswith("none of") and fallback.missed()[0] in message and "SLO unmet" in message
    # The agent Job succeeds serving FP32, its status saying first which bound is unmet.
    done = runstatus.mark_succeeded(AdaptationRunStatus(), 1, report, [], variant_sha256="b" * 64)
    succeeded = get_condition(done.conditions, "Succeeded")
    assert done.phase == "Succeeded" and done.best_recipe == fallback.trial.recipe
    assert done.best_variant_sha256 == "b" * 64 and done.best_metrics is not None
    assert succeeded is not None and succeeded.message.startswith("SLO unmet: ")
    assert fallback.missed()[0] in succeeded.message
    # The report reads back with it.
    assert Report.model_validate_json(report.model_dump_json()) == report


@pytest.mark.parametrize(
    "constraints",
    [Constraints(max_memory_mib=50, max_quality_drop=0.05), Constraints(slo_p95_ms=0.5, max_memory_mib=50)],
    ids=["memory", "memory-and-p95"],
)
def test_no_fallback_for_fp32_over_the_memory_limit(digits: Digits, constraints: Constraints) -> None:
    """Serving a model measured over the memory limit could get it OOM-killed: nothing ships."""
    report, variant, _ = _adapt(digits, constraints)  # every candidate peaks at 100 MiB
    assert report.best is None and variant is None
    assert any(v.startswith("memory:") for v in report.baseline.violations)
    assert report.slo_unmet_fallback is None and report.shipped() is None
    assert runstatus.infeasible_error(report).closest


# -- the quality metric's granularity ------------------------------------------------------------------------


def test_a_budget_finer_than_a_sample_counting_metrics_step_gets_a_note() -> None:
    assert quality_step("argmax_agreement", 64) == pytest.approx(1 / 64)
    assert quality_step("top1_accuracy", 200, outputs=1) == pytest.approx(0.005)
    assert quality_step("cosine_similarity", 64) is None and quality_step("user_metric", 64) is None
    note = coarse_budget_note("argmax_agreement", 64, 0.01)
    assert note is not None
    assert "0.01 is finer than argmax_agreement's step over 64 samples (0.0156" in note
    assert "only variants that change no sample's result pass" in note
    assert note.endswith("allow a drop of at least 0.0157")  # rounded up: 0.0156 would still reject one sample
    assert coarse_budget_note("argmax_agreement", 64, 1 / 64) is None  # one sample's change is allowed
    assert coarse_budget_note("argmax_agreement", 64, 0.02) is None
    assert coarse_budget_note("argmax_agreement", 64, 0.0) is None  # no change was asked for
    assert coarse_budget_note("cosine_similarity", 64, 0.001) is None  # moves continuously
    assert coarse_budget_note("argmax_agreement", 64, 0.01, outputs=2) is None  # averaged: steps of 1/128
    assert coarse_budget_note("top1_accuracy", 1000, 0.001) is None
    assert coarse_budget_note("top1_accuracy", 1000, 0.0005) is not None


def test_the_report_and_the_cli_carry_the_granularity_note(
    digits: Digits, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, data = digits
    budget = 0.5 / data.n_samples  # half a sample's share of top-1 accuracy
    report, _, _ = _adapt(digits, Constraints(max_quality_drop=budget), latency=lambda recipe: 4.0)
    samples = report.baseline.metrics.quality.samples if report.baseline.metrics is not None else 0
    assert report.quality_granularity_note == coarse_budget_note("top1_accuracy", samples, budget)
    assert "top1_accuracy's step" in report.quality_granularity_note
    from metainfer.agent.commands import _print_summary

    _print_summary(report)
    assert _flat(report.quality_granularity_note) in _flat(capsys.readouterr().out)
    done = runstatus.mark_succeeded(AdaptationRunStatus(), 1, report, [])
    succeeded = get_condition(done.conditions, "Succeeded")
    assert succeeded is not None and report.quality_granularity_note in succeeded.message
    infeasible = report.model_copy(update={"best": None})
    assert report.quality_granularity_note in str(runstatus.infeasible_error(infeasible))
