"""The engine's report of one adaptation: one typed document, written and read back.

``Adaptation.run`` returns a ``Report``; ``metainfer adapt`` writes it as
report.json, the agent Job turns it into the run's status and keeps its trials
as history, and both read it back as this model (``Report.model_validate_json``),
never as a walked dict: a report.json that no longer validates is skipped with
its reason (``core.engine.history.load_reports``). It lives apart from the
pipeline so that history, the CLI and the control layer can read it without
importing the search loop; what the history did for the run is
``core.engine.history_use.HistoryUse``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.algorithms import DEFAULT_ALGORITHM, MAX_TRIAL_BUDGET, Algorithm
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.history_use import HistoryUse
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import HardwareProfile
from metainfer.core.engine.runoff import RunoffEntry
from metainfer.core.engine.scoring import Constraints, Objective, closest_misses, variant_memory
from metainfer.core.engine.sensitivity import SensitivityReport
from metainfer.core.engine.trial import Trial, TrialMetrics
from metainfer.core.engine.validate import ValidationReport

REPORT_FILE = "report.json"


class AdaptSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(1, ge=1, description="Production batch size.")
    search_batch: bool = Field(False, description="Also search the batch size (off: the batch is fixed).")
    constraints: Constraints = Constraints()
    objective: Objective = Objective()
    budget_trials: int = Field(24, ge=1, le=MAX_TRIAL_BUDGET)
    time_budget_s: float | None = Field(None, gt=0)
    algorithm: Algorithm = DEFAULT_ALGORITHM
    seed: int = 0
    measure: MeasureSettings = MeasureSettings()
    calibration_samples: int = Field(64, ge=1)
    sensitivity_layers: int = Field(16, ge=1, description="Largest layers probed for mixed precision.")
    overrides: dict[str, list[str | int | float | bool]] = Field(
        default_factory=dict, description="Restrict a search dimension to these choices."
    )


class SpaceSummary(BaseModel):
    dimensions: dict[str, list[str | int | float | bool | None]]
    allowed_points: int
    notes: list[str]


class FinalComparison(BaseModel):
    """Baseline and winner re-measured back to back, so machine noise hits both alike."""

    baseline: TrialMetrics
    best: TrialMetrics
    speedup_p50: float
    speedup_p95: float
    kept_baseline: bool = Field(
        False, description="The search's winner lost to FP32 when re-measured back to back, so FP32 was kept."
    )
    note: str = ""
    slo_percentile: str = Field(
        "p95",
        description="The tail percentile the SLO is written in (p99 where the policy bounds p99): a winner slower"
        " than FP32 there, beyond the timing noise, is never shipped.",
    )
    runoff: list[RunoffEntry] = Field(
        default_factory=list,
        description="The search's winner and its closest rivals of other kinds, raced interleaved with FP32 (empty"
        " when it had none): which one shipped, and how each timed in the search and in the race.",
    )


class RejectedCandidate(BaseModel):
    """A candidate that validation on all the data rejected, and why."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="Its trial index (0: the FP32 baseline).")
    recipe: str = Field(description="Its recipe in words.")
    failed_checks: list[str] = Field(description="The checks it failed, 'name: detail', each cut short.")

    def describe(self) -> str:
        return f"{self.recipe} failed {', '.join(self.failed_checks)}"


class SloUnmetFallback(BaseModel):
    """FP32, validated, for a cluster to keep serving when no candidate met every constraint and FP32's only misses
    are latency bounds (p95 SLO, p99 bound): never one over the memory limit (it could be OOM-killed) or the
    quality budget. ``metainfer adapt`` still reports no feasible candidate; the agent Job succeeds with it, its
    status saying which bound is unmet."""

    model_config = ConfigDict(extra="forbid")

    trial: Trial = Field(description="The FP32 candidate (the baseline, or FP32 with other session settings).")
    validation: ValidationReport

    def missed(self) -> list[str]:
        """The latency bounds it misses, measured vs limit (scoring.violations)."""
        return list(self.trial.violations)

    def describe(self) -> str:
        return f"{self.trial.recipe.describe()} (validated) misses only latency bounds: {'; '.join(self.missed())}"


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")

    started_at: datetime
    model: ModelInfo
    profile: HardwareProfile
    settings: AdaptSettings
    space: SpaceSummary
    baseline: Trial
    trials: list[Trial]
    best: Trial | None
    validation: ValidationReport | None = None
    final: FinalComparison | None = None
    sensitivity: list[SensitivityReport] = Field(default_factory=list)
    latency_noise_band: float | None = Field(
        None,
        ge=0,
        description=(
            "Relative latency difference the measurements cannot resolve: the median over the baseline and"
            " every measured candidate of what its own runs resolve (scoring.noise_band). Candidates timing"
            " within it of each other are ranked as ties, decided by memory and quality. None in reports"
            " written before it was measured."
        ),
    )
    history: HistoryUse | None = Field(
        None,
        description="What earlier runs' trials (--history, or the operator's) did for this search; None without.",
    )
    search_wall_s: float
    sensitivity_wall_s: float = Field(
        0.0,
        ge=0,
        description="Of search_wall_s, the time the mixed-precision sensitivity scans took (run once per mode,"
        " when the search first proposes keeping layers in float; not counted as trials).",
    )
    total_wall_s: float
    stop_reason: str
    rejected_by_validation: list[RejectedCandidate] = Field(
        default_factory=list,
        description="The candidates validation on all the data rejected, in the order they were tried: the"
        " best-ranked feasible ones, then FP32 fallbacks.",
    )
    fallback_note: str = Field(
        "",
        description="Set when no variant passed validation and FP32 shipped instead: which variants failed"
        " validation and why, and the FP32 session settings shipped. Empty otherwise.",
    )
    slo_unmet_fallback: SloUnmetFallback | None = Field(
        None,
        description="With no feasible candidate (best None): FP32, validated, that misses only latency bounds, for a"
        " cluster to keep serving with the SLO unmet. None when FP32 misses memory or quality, or fails validation.",
    )
    quality_granularity_note: str = Field(
        "",
        description="Set when the quality metric moves in steps coarser than the budget (a share of N samples moves"
        " by 1/N): only variants that change no sample's result could pass. Empty otherwise.",
    )

    def shipped(self) -> Trial | None:
        """What a cluster serves: the validated best, else the SLO-unmet FP32 fallback, else nothing."""
        if self.best is not None:
            return self.best
        return self.slo_unmet_fallback.trial if self.slo_unmet_fallback is not None else None

    def memory_note(self) -> str:
        """What the shipped variant weighs against FP32, and the memory bound that chose it, when there is a bound
        or the variant's weights are low-bit (else empty): why a class's variant is as small as it is."""
        shipped, fp32 = self.shipped(), self.baseline.metrics
        constraints = self.settings.constraints
        if shipped is None or shipped.metrics is None or fp32 is None:
            return ""
        bounded = constraints.max_memory_mib is not None or constraints.max_variant_memory_mib is not None
        if not bounded and not shipped.recipe.transform.weights.bits:
            return ""
        m = shipped.metrics
        parts = [
            f"variant {m.model_size_mib:.1f} MiB (FP32 {fp32.model_size_mib:.1f} MiB), taking"
            f" {variant_memory(m):.0f} MiB (FP32 {variant_memory(fp32):.0f} MiB), peak {m.peak_memory_mib:.0f} MiB"
        ]
        if (own := constraints.max_variant_memory_mib) is not None:
            over = ", which FP32 exceeds" if variant_memory(fp32) > own else ""
            parts.append(f"within the {own:.0f} MiB its serving container leaves it{over}")
        if (bound := constraints.max_memory_mib) is not None:
            over = f", which FP32's {fp32.peak_memory_mib:.0f} MiB exceeds" if fp32.peak_memory_mib > bound else ""
            parts.append(f"within the memory SLO of {bound:.0f} MiB{over}")
        return "; ".join(parts)

    def candidates(self) -> list[Trial]:
        """Every measured candidate, the FP32 baseline first."""
        return [self.baseline, *self.trials]

    def closest_misses(self) -> list[tuple[str, list[str]]]:
        """What "no feasible candidate" lists, the FP32 baseline included (``scoring.closest_misses``)."""
        return closest_misses(self.candidates(), self.settings.constraints)
