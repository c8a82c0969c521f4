"""Racing and quality screening: a measurement stops early only when the outcome is already clear."""

from __future__ import annotations

import numpy as np
import pytest

from metainfer.core.engine.evaluate import QUALITY_SCREEN_FACTOR, MeasureSettings, Screen, evaluate
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, make_reference
from metainfer.core.engine.runtime import create_session

FAST = MeasureSettings(warmup_runs=1, round_runs=5, min_runs=10, max_runs=40, max_seconds=0.5)
BATCH = 16


@pytest.fixture(scope="module")
def setup(digits):  # type: ignore[no-untyped-def]
    base, _, data = digits
    unlabelled = type(data)(data.inputs, None)
    reference = make_reference(create_session(base, Recipe(batch=BATCH)), unlabelled, BATCH)
    return base, unlabelled, reference


def test_a_candidate_clearly_slower_than_the_leader_stops_after_one_round(setup) -> None:  # type: ignore[no-untyped-def]
    base, data, reference = setup
    metrics = evaluate(base, Recipe(batch=BATCH), data, data, reference, FAST, screen=Screen(stop_above_ms=1e-6))
    assert metrics.early_stop == "raced"
    assert metrics.latency.runs == FAST.round_runs
    assert metrics.quality.samples == FAST.quality_screen_samples < data.n_samples  # quality stays the subset's


def test_a_candidate_clearly_over_the_quality_budget_is_screened_on_the_first_samples(setup) -> None:  # type: ignore[no-untyped-def]
    base, data, reference = setup
    opposite = Reference([-o for o in reference.outputs], None, None)  # cosine -1: a drop of 2
    budget = 0.01
    metrics = evaluate(base, Recipe(batch=BATCH), data, data, opposite, FAST, screen=Screen(max_quality_drop=budget))
    assert metrics.early_stop == "quality_screen"
    assert metrics.quality.drop > QUALITY_SCREEN_FACTOR * budget
    assert metrics.quality.samples == FAST.quality_screen_samples
    assert metrics.latency.runs == FAST.round_runs


def test_a_contender_gets_quality_on_every_sample_exactly_as_without_screening(setup) -> None:  # type: ignore[no-untyped-def]
    base, data, reference = setup
    screen = Screen(stop_above_ms=1e9, max_quality_drop=0.01)
    screened = evaluate(base, Recipe(batch=BATCH), data, data, reference, FAST, screen=screen)
    plain = evaluate(base, Recipe(batch=BATCH), data, data, reference, FAST)
    assert screened.early_stop is None
    assert screened.quality.samples == plain.quality.samples == data.n_samples
    assert screened.quality.value == plain.quality.value
    assert screened.latency.runs >= FAST.min_runs


def test_the_subset_is_whole_batches(setup) -> None:  # type: ignore[no-untyped-def]
    base, data, reference = setup
    settings = FAST.model_copy(update={"quality_screen_samples": 20})
    metrics = evaluate(base, Recipe(batch=BATCH), data, data, reference, settings, screen=Screen(stop_above_ms=1e-6))
    assert metrics.quality.samples == 2 * BATCH
    assert np.isfinite(metrics.quality.value)
