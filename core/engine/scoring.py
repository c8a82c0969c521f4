"""Hard constraints first, then the policy's weighted objective.

A candidate that misses any hard constraint (p95 SLO, memory, quality budget)
is infeasible whatever its speed: its score is None and its violations say
which limits it missed and by how much, so "no feasible candidate" can list
the closest misses. Feasible candidates are ranked by
``alpha * speedup + beta * relative_quality``, where speedup is the FP32
baseline's median latency over the candidate's (dimensionless, so one weight
works for any model) and relative quality is the candidate's metric over the
reference's. The median ranks; p95 (noisier at a few dozen runs) constrains.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.trial import TrialMetrics


class Constraints(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slo_p95_ms: float | None = Field(None, gt=0, description="Latency SLO on p95 per batch, ms.")
    max_quality_drop: float = Field(0.01, ge=0, description="Largest allowed quality drop vs FP32.")
    max_memory_mib: float | None = Field(None, gt=0, description="Largest allowed peak memory, MiB.")


class Objective(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_weight: float = Field(1.0, ge=0, description="alpha: weight of the speedup over FP32.")
    quality_weight: float = Field(0.1, ge=0, description="beta: weight of quality relative to FP32.")


def violations(metrics: TrialMetrics, constraints: Constraints) -> list[str]:
    out = []
    p95 = metrics.latency.p95_ms
    if constraints.slo_p95_ms is not None and p95 > constraints.slo_p95_ms:
        out.append(f"latency: p95 {p95:.2f} ms > SLO {constraints.slo_p95_ms:g} ms")
    drop = metrics.quality.drop
    # A hair of tolerance: float noise must not turn "no loss" into a violation.
    if drop > constraints.max_quality_drop + 1e-9:
        out.append(f"quality: {metrics.quality.metric} drop {drop:.4f} > budget {constraints.max_quality_drop:g}")
    mem = metrics.peak_memory_mib
    if constraints.max_memory_mib is not None and mem > constraints.max_memory_mib:
        out.append(f"memory: peak {mem:.0f} MiB > limit {constraints.max_memory_mib:g} MiB")
    return out


def score(metrics: TrialMetrics, baseline: TrialMetrics, objective: Objective) -> float:
    speedup = baseline.latency.p50_ms / max(metrics.latency.p50_ms, 1e-9)
    ref = metrics.quality.reference
    relative_quality = metrics.quality.value / ref if ref else 1.0 - metrics.quality.drop
    return objective.latency_weight * speedup + objective.quality_weight * relative_quality


def miss_distance(violation_list: list[str], metrics: TrialMetrics | None, constraints: Constraints) -> float:
    """How far a candidate is from feasible (relative overshoot summed); orders 'closest' misses."""
    if metrics is None:
        return float("inf")
    total = 0.0
    if constraints.slo_p95_ms is not None:
        total += max(0.0, metrics.latency.p95_ms / constraints.slo_p95_ms - 1)
    if constraints.max_quality_drop > 0:
        total += max(0.0, metrics.quality.drop / constraints.max_quality_drop - 1)
    elif metrics.quality.drop > 0:
        total += metrics.quality.drop * 100
    if constraints.max_memory_mib is not None:
        total += max(0.0, metrics.peak_memory_mib / constraints.max_memory_mib - 1)
    return total
