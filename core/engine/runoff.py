"""The final race: the search's winner against its closest rivals of other kinds, back to back.

Each search trial is timed at its own moment, and on a shared machine the same model can run 10-20 % apart a
few minutes later (measured on this project's 2-core VM: ONNX Runtime FP32 on a text detector at 41.5 ms in
one sitting and 20.5 ms in the next). Two candidates measured minutes apart are ordered by that drift as much
as by their speed: on PP-OCRv4's detector the search preferred ONNX Runtime int8 while OpenVINO FP32, measured
in the same search, was 1.09x faster when both ran interleaved. Which runtime and numeric format ship is the
decision that matters most, so the final comparison races the winner against the best candidate of each other
kind (runtime, execution provider, numeric format, quantizer, OpenVINO precision) whose search timings came
close to the winner's, and the runner-up of the winner's own kind, interleaved with FP32, and ranks them again on
those timings.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.scoring import Constraints, Objective, rank, score, timing_score, violations
from metainfer.core.engine.trial import LatencyStats, Trial, TrialMetrics

# Rivals raced besides the winner: each one costs a share of a final comparison (a few seconds on 2 cores).
MAX_RIVALS = 2
# How far behind the winner, in search timing, a rival may be: beyond the drift seen between sittings on one
# machine, a candidate is slower, not mis-measured.
RIVAL_MARGIN = 0.25

Kind = tuple[str, str, str, str, str]


class RunoffEntry(BaseModel):
    """One candidate of the final race: what the search measured and what the race measured."""

    recipe: str = Field(description="The candidate's recipe in words.")
    trial: int = Field(description="The candidate's trial index (0: the FP32 baseline).")
    search_p50_ms: float = Field(description="Median latency per batch when the search measured it.")
    p50_ms: float = Field(description="Median latency per batch in the race, interleaved with the others.")
    p95_ms: float
    shipped: bool = Field(False, description="The race's winner, validated on the full data.")


def kind(recipe: Recipe) -> Kind:
    """What tells candidates apart beyond tuning: the runtime, where it runs, and the numbers it computes in."""
    q, session = recipe.transform.quantization, recipe.session
    precision = session.openvino.inference_precision if session.runtime == "openvino" else ""
    return (session.runtime, session.execution_provider, q.mode, q.quantizer, str(precision))


def rivals(
    ranked: Sequence[Trial],
    winner: Trial,
    baseline: TrialMetrics,
    objective: Objective,
    *,
    limit: int = MAX_RIVALS,
    margin: float = RIVAL_MARGIN,
) -> list[Trial]:
    """Up to ``limit`` trials of ``ranked`` (the search's ranking, best first) to race ``winner``, each with a
    timing score within ``margin`` of the winner's: the first of each kind other than the winner's, then, while
    places are left, the runner-up of the winner's own kind (the tie-break on quality inside the noise band can
    rank a variant first that a back-to-back timing puts a quarter behind its sibling)."""
    if winner.metrics is None:
        return []
    lead = timing_score(winner.metrics, baseline, objective)

    def close(trial: Trial) -> bool:
        assert trial.metrics is not None
        return timing_score(trial.metrics, baseline, objective) * (1 + margin) >= lead

    scored = [t for t in ranked if t is not winner and t.metrics is not None and t.score is not None]
    seen = {kind(winner.recipe)}
    out: list[Trial] = []
    for trial in scored:
        if kind(trial.recipe) in seen:
            continue
        seen.add(kind(trial.recipe))
        if close(trial):
            out.append(trial)
    sibling = next((t for t in scored if kind(t.recipe) == kind(winner.recipe)), None)
    if sibling is not None and close(sibling):
        out.append(sibling)
    return out[:limit]


def race_order(
    entrants: Sequence[tuple[Trial, LatencyStats]],
    baseline: TrialMetrics,
    objective: Objective,
    constraints: Constraints,
    band: float,
) -> list[int]:
    """Indices of ``entrants`` (a trial, its latency in the race) as the race ranks them, best first, each
    re-scored against ``baseline`` (FP32 in the same race) with its search quality and memory; an entrant the
    race puts over a latency bound drops out."""
    rescored: list[Trial] = []
    for trial, latency in entrants:
        assert trial.metrics is not None
        metrics = trial.metrics.model_copy(update={"latency": latency})
        value = None if violations(metrics, constraints) else score(metrics, baseline, objective)
        rescored.append(trial.model_copy(update={"metrics": metrics, "score": value}))
    ranked = rank(rescored, baseline, objective, band)
    return [next(i for i, t in enumerate(rescored) if t is r) for r in ranked]
