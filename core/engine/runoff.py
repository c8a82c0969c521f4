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

How close is close depends on whether the rival runs on the winner's runtime. Contention moves the runtimes
apart, not only the machine: ONNX Runtime's spinning intra-op threads lose more to a busy neighbour than
OpenVINO's do (issue 30 saw OpenVINO's lead grow from 1.3x to 1.8x under load), and on PP-OCRv4's detector the
search timed OpenVINO with bf16 compute more than 25 % behind ONNX Runtime FP32 in a sitting where, minutes later,
it ran 1.5x ahead. So the best of each other runtime and compute precision (``family``) gets a seat if its search
timing is within 2x of the winner's; rivals on the winner's runtime keep the 25 % margin.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from metainfer.core.engine.recipe import INT8_MODES, Recipe
from metainfer.core.engine.scoring import Constraints, Objective, rank, score, timing_score, violations
from metainfer.core.engine.trial import LatencyStats, Trial, TrialMetrics

# Rivals raced besides the winner: each one costs a share of a final comparison (a few seconds on 2 cores).
MAX_RIVALS = 4
# How far behind the winner, in search timing, a rival may be: beyond the drift seen between sittings on one
# machine, a candidate is slower, not mis-measured.
RIVAL_MARGIN = 0.25
# The same for the best of each runtime and compute precision other than the winner's on another runtime: the
# drift between two runtimes measured minutes apart reached 2x on this project's 2-core VM.
CROSS_RUNTIME_MARGIN = 1.0

Kind = tuple[str, str, str, str, str]
Family = tuple[str, str]


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


def family(recipe: Recipe) -> Family:
    """The runtime and the numbers it computes in: int8 for either quantizer, else the model's float format, and
    for OpenVINO its inference precision where that is lower (bf16 compute of an FP32 model)."""
    q, session = recipe.transform.quantization, recipe.session
    if q.mode in INT8_MODES:
        return session.runtime, "int8"
    if session.runtime == "openvino" and session.openvino.inference_precision != "f32":
        return session.runtime, session.openvino.inference_precision
    return session.runtime, q.mode


def rivals(
    ranked: Sequence[Trial],
    winner: Trial,
    baseline: TrialMetrics,
    objective: Objective,
    *,
    limit: int = MAX_RIVALS,
    margin: float = RIVAL_MARGIN,
    cross_runtime_margin: float = CROSS_RUNTIME_MARGIN,
) -> list[Trial]:
    """Up to ``limit`` trials of ``ranked`` (the search's ranking, best first) to race ``winner``, in this order:

    1. the first of each family (runtime and compute precision) other than the winner's, within
       ``cross_runtime_margin`` of the winner's timing score on another runtime, ``margin`` on its own;
    2. the first of each kind other than the winner's and those already in, within ``margin``;
    3. the runner-up of the winner's own kind, within ``margin`` (the tie-break on quality inside the noise band
       can rank a variant first that a back-to-back timing puts a quarter behind its sibling)."""
    if winner.metrics is None:
        return []
    lead = timing_score(winner.metrics, baseline, objective)

    def close(trial: Trial, allowed: float) -> bool:
        assert trial.metrics is not None
        return timing_score(trial.metrics, baseline, objective) * (1 + allowed) >= lead

    def family_margin(trial: Trial) -> float:
        return margin if trial.recipe.session.runtime == winner.recipe.session.runtime else cross_runtime_margin

    scored = [t for t in ranked if t is not winner and t.metrics is not None and t.score is not None]
    out: list[Trial] = []
    families = {family(winner.recipe)}
    for trial in scored:
        if family(trial.recipe) not in families:
            families.add(family(trial.recipe))
            if close(trial, family_margin(trial)):
                out.append(trial)
    kinds = {kind(winner.recipe), *(kind(t.recipe) for t in out)}
    for trial in scored:
        if kind(trial.recipe) not in kinds:
            kinds.add(kind(trial.recipe))
            if close(trial, margin):
                out.append(trial)
    sibling = next((t for t in scored if kind(t.recipe) == kind(winner.recipe)), None)
    if sibling is not None and close(sibling, margin):
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
