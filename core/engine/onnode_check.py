"""The short check a provisional variant passes on a new node before it serves there.

A class with no adapted variant of its own serves the most similar class's (core.control.provisional); that
variant was validated on other hardware. Before a pod serves it, the pod measures it where it will run: quality
against the FP32 model on the same samples, and p95 latency at the policy's batch size, each held to the policy's
SLO. A variant that misses either, or cannot be built or loaded here (another runtime, an execution provider this
node lacks), is replaced by the FP32 model, which has no quality to lose. What was found travels to the operator
as the check's result (core.engine.onnode_result), so the class's status says what its pods serve and why.

The check is short by design (a few seconds: it delays the first Ready pod of the class); the class's own
adaptation run measures the same things thoroughly.
"""

from __future__ import annotations

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, measure_latency
from metainfer.core.engine.onnode_result import CheckBudget, OnNodeCheck, Serves, bounded
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import make_reference, quality_of, run_all
from metainfer.core.engine.runtime import create_session

# Short: the check delays the class's first Ready pod. min_runs keeps the p95 a percentile of something.
CHECK_MEASURE = MeasureSettings(warmup_runs=3, round_runs=10, min_runs=20, max_runs=200, max_seconds=1.5)
CHECK_SAMPLES = 64


def check_variant(
    base: bytes,
    variant: bytes,
    recipe: Recipe,
    data: Dataset,
    budget: CheckBudget,
    *,
    variant_sha256: str | None = None,
    settings: MeasureSettings = CHECK_MEASURE,
) -> OnNodeCheck:
    """Measure ``variant`` here against the FP32 ``base`` on (the head of) ``data``; ``serves`` says whether it
    passed. An error while loading or running it counts as a refusal, with the error as the reason."""
    samples = data.head(min(CHECK_SAMPLES, data.n_samples))
    found: dict[str, object] = {"budget": budget, "variant_sha256": variant_sha256, "samples": samples.n_samples}
    try:
        fp32 = create_session(base, Recipe(batch=recipe.batch))
        reference = make_reference(fp32, samples, recipe.batch, budget.quality_metric)
        session = create_session(variant, recipe)
        quality = quality_of(run_all(session, samples, recipe.batch), reference)
        found |= {"quality_metric": quality.metric, "quality_drop": quality.drop}
        latency = measure_latency(session, samples, recipe.batch, settings)
        found["latency_p95_ms"] = latency.p95_ms
    except Exception as exc:  # ONNX Runtime raises several unrelated types; any of them means "not here"
        reason = f"it does not run on this node: {type(exc).__name__}: {exc}"
        return OnNodeCheck.model_validate({**found, "serves": "fp32", "reason": bounded(reason)})
    misses = []
    if not quality.drop <= budget.max_quality_drop:  # NaN misses too
        misses.append(f"quality drop {quality.drop:.4f} over the budget {budget.max_quality_drop:g}")
    if not latency.p95_ms <= budget.latency_p95_ms:
        misses.append(f"p95 {latency.p95_ms:.2f} ms over the SLO {budget.latency_p95_ms:g} ms")
    serves: Serves = "fp32" if misses else "variant"
    return OnNodeCheck.model_validate({**found, "serves": serves, "reason": bounded("; ".join(misses))})


def fp32_recipe(recipe: Recipe) -> Recipe:
    """What serves when the variant is refused: the base model untransformed, at the same batch, with the
    variant's session settings (threads, execution provider) where they work here (``fp32_session_recipes``)."""
    return Recipe(session=recipe.session, batch=recipe.batch)


def fp32_session_recipes(recipe: Recipe) -> tuple[Recipe, ...]:
    """FP32 recipes to try in order: the variant's session settings, then ONNX Runtime's defaults (the CPU)."""
    tuned, plain = fp32_recipe(recipe), Recipe(batch=recipe.batch)
    return (tuned,) if tuned == plain else (tuned, plain)
