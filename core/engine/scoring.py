"""Hard constraints first, then the policy's weighted objective, with timing noise as a tie.

A candidate that misses any hard constraint (p95 SLO, memory, quality budget)
is infeasible whatever its speed: its score is None and its violations say
which limits it missed and by how much, so "no feasible candidate" can list
the closest misses.

Feasible candidates are scored by a weighted sum of four terms, each the
candidate over the FP32 baseline measured the same way, so that 1.0 means "as
FP32", above is better, and one set of weights works for any model:

- latency: speedup, the baseline's median latency per batch over the candidate's;
- throughput: the candidate's items/s over the baseline's (equal to the speedup
  at a fixed batch; it differs when the batch is searched);
- memory: the baseline's peak memory over the candidate's;
- quality: the candidate's quality metric over the reference's.

The median ranks; p95 (noisier at a few dozen runs) constrains.

Timing noise: two medians measured at different moments differ even for the
same variant. ``noise_band`` derives, from the runs of the measurements
themselves, the relative difference they cannot resolve, and ``rank`` treats candidates
whose timings are within it as tied on the timing terms: among them the other
terms decide (memory and quality by their weights, then plain accuracy), so the
default never spends the accuracy budget on a latency gain that is only noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from metainfer.core.engine.quality_choice import CHOICE_PATTERN
from metainfer.core.engine.trial import LatencyStats, Trial, TrialMetrics, TrialStatus

# The default weights everywhere (CLI flags, AdaptSettings, the policy's spec.objective): latency
# decides, quality breaks what remains close; ties inside the noise band go to quality regardless.
DEFAULT_LATENCY_WEIGHT = 1.0
DEFAULT_THROUGHPUT_WEIGHT = 0.0
DEFAULT_MEMORY_WEIGHT = 0.0
DEFAULT_QUALITY_WEIGHT = 0.1

# What "no feasible candidate" lists: the infeasible candidates nearest to feasible, then the first failures.
CLOSEST_SHOWN = 5
FAILURES_SHOWN = 3

# Two-sided 95% normal quantile; and the factor turning (p95 - p50) into a standard deviation
# (exact for a normal distribution, an overestimate for the right-skewed ones latency has: conservative).
_Z95 = 1.959964
_P95_SIGMAS = 1.644854
# Standard error of a sample median = this * sigma / sqrt(n), for normally distributed samples.
_MEDIAN_SE = math.sqrt(math.pi / 2)


class Constraints(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slo_p95_ms: float | None = Field(None, gt=0, description="Latency SLO on p95 per batch, ms.")
    slo_p99_ms: float | None = Field(None, gt=0, description="Latency bound on p99 per batch, ms (optional).")
    max_quality_drop: float = Field(0.01, ge=0, description="Largest allowed quality drop vs FP32.")
    quality_metric: str = Field(
        "auto",
        pattern=CHOICE_PATTERN,
        description="The metric max_quality_drop is written in (core.engine.quality_metrics): auto decides from the"
        " data's labels and the outputs' shape.",
    )
    max_memory_mib: float | None = Field(None, gt=0, description="Largest allowed peak memory, MiB.")
    max_variant_memory_mib: float | None = Field(
        None,
        gt=0,
        description="Largest allowed memory of the variant itself (TrialMetrics.variant_memory_mib): what a serving "
        "container's limit leaves it once serve's own floor and its data plane's buffers are taken "
        "(core.control.memory_bound).",
    )


class Objective(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_weight: float = Field(
        DEFAULT_LATENCY_WEIGHT, ge=0, description="Weight of the speedup: FP32's median latency over the candidate's."
    )
    throughput_weight: float = Field(
        DEFAULT_THROUGHPUT_WEIGHT, ge=0, description="Weight of the candidate's items/s over FP32's."
    )
    memory_weight: float = Field(
        DEFAULT_MEMORY_WEIGHT, ge=0, description="Weight of FP32's peak memory over the candidate's."
    )
    quality_weight: float = Field(
        DEFAULT_QUALITY_WEIGHT, ge=0, description="Weight of the candidate's quality over FP32's."
    )

    @model_validator(mode="after")
    def _something_to_maximise(self) -> Objective:
        if self.latency_weight + self.throughput_weight + self.memory_weight + self.quality_weight <= 0:
            raise ValueError("at least one objective weight must be positive")
        return self


def violations(metrics: TrialMetrics, constraints: Constraints) -> list[str]:
    out = []
    p95 = metrics.latency.p95_ms
    if constraints.slo_p95_ms is not None and p95 > constraints.slo_p95_ms:
        out.append(f"latency: p95 {p95:.2f} ms > SLO {constraints.slo_p95_ms:g} ms")
    p99 = metrics.latency.p99_ms
    if constraints.slo_p99_ms is not None and p99 > constraints.slo_p99_ms:
        out.append(f"latency: p99 {p99:.2f} ms > bound {constraints.slo_p99_ms:g} ms")
    drop = metrics.quality.drop
    # A hair of tolerance: float noise must not turn "no loss" into a violation.
    if drop > constraints.max_quality_drop + 1e-9:
        out.append(f"quality: {metrics.quality.metric} drop {drop:.4f} > budget {constraints.max_quality_drop:g}")
    mem = metrics.peak_memory_mib
    if constraints.max_memory_mib is not None and mem > constraints.max_memory_mib:
        out.append(f"memory: peak {mem:.0f} MiB > limit {constraints.max_memory_mib:g} MiB")
    own = variant_memory(metrics)
    if constraints.max_variant_memory_mib is not None and own > constraints.max_variant_memory_mib:
        out.append(
            f"memory: the variant takes {own:.0f} MiB > the {constraints.max_variant_memory_mib:.0f} MiB its serving"
            " container leaves it"
        )
    return out


def variant_memory(metrics: TrialMetrics) -> float:
    """The variant's own memory; a report written before it was measured has only the process's peak."""
    return metrics.variant_memory_mib if metrics.variant_memory_mib is not None else metrics.peak_memory_mib


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / max(denominator, 1e-9)


def timing_score(metrics: TrialMetrics, baseline: TrialMetrics, objective: Objective) -> float:
    """The part of the score that comes from timings: what the noise band can make a tie."""
    speedup = _ratio(baseline.latency.p50_ms, metrics.latency.p50_ms)
    throughput = _ratio(metrics.latency.throughput_per_s, baseline.latency.throughput_per_s)
    return objective.latency_weight * speedup + objective.throughput_weight * throughput


def other_score(metrics: TrialMetrics, baseline: TrialMetrics, objective: Objective) -> float:
    """The part of the score that timing noise does not touch: memory and quality."""
    memory = _ratio(baseline.peak_memory_mib, metrics.peak_memory_mib)
    ref = metrics.quality.reference
    relative_quality = metrics.quality.value / ref if ref else 1.0 - metrics.quality.drop
    return objective.memory_weight * memory + objective.quality_weight * relative_quality


def score(metrics: TrialMetrics, baseline: TrialMetrics, objective: Objective) -> float:
    return timing_score(metrics, baseline, objective) + other_score(metrics, baseline, objective)


def measurement_noise(latency: LatencyStats, stable_rel: float) -> float:
    """The relative difference between two medians that one measurement's runs cannot tell from noise.

    Two parts, the larger wins. The measurer stops once a round moves the
    median by less than ``stable_rel``, so each median is known to that, and
    two of them to twice that. And from the run-to-run spread of ``latency``:
    the half-width of a 95% interval on the difference of two medians of
    ``runs`` samples each, with the spread taken from p95 - p50.
    """
    if latency.p50_ms <= 0:
        return 2 * stable_rel
    sigma_rel = max(0.0, latency.p95_ms - latency.p50_ms) / _P95_SIGMAS / latency.p50_ms
    sampling = _Z95 * math.sqrt(2) * _MEDIAN_SE * sigma_rel / math.sqrt(latency.runs)
    return max(2 * stable_rel, sampling)


def noise_band(latencies: Sequence[LatencyStats], stable_rel: float) -> float:
    """The timing noise of a search: the median of its measurements' own (``measurement_noise``).

    The median, because one measurement can be far noisier than the machine
    usually is (the first of a process, a burst from a neighbour), and one
    such outlier would otherwise turn every real speedup into a tie.
    """
    if not latencies:
        return 2 * stable_rel
    return statistics.median(measurement_noise(latency, stable_rel) for latency in latencies)


def within_noise(a: LatencyStats, b: LatencyStats, band: float) -> bool:
    """Whether ``a`` and ``b`` time the same within ``band``, per batch and per item."""

    def close(x: float, y: float) -> bool:
        low, high = sorted((x, y))
        return high <= low * (1 + band)

    return close(a.p50_ms, b.p50_ms) and close(a.throughput_per_s, b.throughput_per_s)


T = TypeVar("T", bound=Trial)


def rank(
    trials: Sequence[T], baseline: TrialMetrics, objective: Objective, band: float, limit: int | None = None
) -> list[T]:
    """The scored (feasible) trials, best first, timing differences inside ``band`` counting as ties.

    Each place goes to the highest-scoring trial left unless others time the
    same within the band; then, among those, to the best on memory and quality
    by their weights, then to the most accurate, then to the faster. Ranking
    by plain score instead would let a few percent of timing noise buy any
    loss of accuracy the budget allows. ``limit``: only the first places.
    """
    pool = [t for t in trials if t.score is not None and t.metrics is not None]
    ordered: list[T] = []
    while pool and (limit is None or len(ordered) < limit):
        winner = _first(pool, baseline, objective, band)
        ordered.append(winner)
        pool = [t for t in pool if t is not winner]
    return ordered


def _first(pool: list[T], baseline: TrialMetrics, objective: Objective, band: float) -> T:
    leader = max(pool, key=lambda t: t.score or 0.0)
    assert leader.metrics is not None
    lead = leader.metrics.latency
    tied = [t for t in pool if t.metrics is not None and within_noise(t.metrics.latency, lead, band)]

    def tie_break(t: T) -> tuple[float, float, float]:
        assert t.metrics is not None
        return (other_score(t.metrics, baseline, objective), t.metrics.quality.value, t.score or 0.0)

    return max(tied, key=tie_break)


def miss_distance(violation_list: list[str], metrics: TrialMetrics | None, constraints: Constraints) -> float:
    """How far a candidate is from feasible (relative overshoot summed); orders 'closest' misses."""
    if metrics is None:
        return float("inf")
    total = 0.0
    if constraints.slo_p95_ms is not None:
        total += max(0.0, metrics.latency.p95_ms / constraints.slo_p95_ms - 1)
    if constraints.slo_p99_ms is not None:
        total += max(0.0, metrics.latency.p99_ms / constraints.slo_p99_ms - 1)
    if constraints.max_quality_drop > 0:
        total += max(0.0, metrics.quality.drop / constraints.max_quality_drop - 1)
    elif metrics.quality.drop > 0:
        total += metrics.quality.drop * 100
    if constraints.max_memory_mib is not None:
        total += max(0.0, metrics.peak_memory_mib / constraints.max_memory_mib - 1)
    if constraints.max_variant_memory_mib is not None:
        total += max(0.0, variant_memory(metrics) / constraints.max_variant_memory_mib - 1)
    return total


def by_closeness(trials: Sequence[T], constraints: Constraints) -> list[T]:
    """The unscored trials that were measured (infeasible, not failed), nearest to feasible first; ties by index."""
    missed = (t for t in trials if t.score is None and t.status != TrialStatus.FAILED)
    return sorted(missed, key=lambda t: (miss_distance(t.violations, t.metrics, constraints), t.index))


def closest_misses(trials: Sequence[Trial], constraints: Constraints) -> list[tuple[str, list[str]]]:
    """The candidates nearest to feasible and what each missed, then the first few failures with their error.

    The one ranking of "closest candidates": ``metainfer adapt`` and the agent Job both list it when no candidate
    met every constraint (through ``Report.closest_misses``), so the CLI and the run's status agree.
    """
    nearest = [t for t in by_closeness(trials, constraints) if t.status == TrialStatus.INFEASIBLE][:CLOSEST_SHOWN]
    failed = sorted((t for t in trials if t.status == TrialStatus.FAILED), key=lambda t: t.index)[:FAILURES_SHOWN]
    rows = [(t.recipe.describe(), t.violations) for t in nearest]
    return rows + [(t.recipe.describe(), [f"failed: {t.error}"]) for t in failed]
