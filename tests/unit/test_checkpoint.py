"""The search checkpoint a retried Job resumes from: exact round trip, bounded, refused when corrupt."""

from __future__ import annotations

import pytest

from metainfer.core.api.run import AdaptationRunStatus, SearchCheckpoint
from metainfer.core.control.checkpoint import CheckpointUnreadable, decode, encode
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics, TrialStatus


def trial(index: int, p95: float) -> Trial:
    metrics = TrialMetrics(
        latency=LatencyStats(p50_ms=p95 * 0.8, p95_ms=p95, p99_ms=p95 * 1.1, mean_ms=p95 * 0.85, runs=50,
                             warmup_runs=5, throughput_per_s=1000 / p95),
        quality=Quality(metric="top1_accuracy", value=0.97, reference=0.975, drop=0.005, samples=200),
        peak_memory_mib=40.5, model_size_mib=0.3,
    )  # fmt: skip
    return Trial(index=index, point={"quantization": "int8_dynamic", "intra_op_threads": index % 3 + 1},
                 recipe=Recipe(batch=4), status=TrialStatus.FEASIBLE, metrics=metrics, score=1.5 + index)  # fmt: skip


def test_trials_round_trip_exactly_through_the_status() -> None:
    trials = [trial(i, 1.0 + i / 7) for i in range(1, 40)]
    saved = encode(trials, search_seconds=12.3456)
    assert saved is not None and saved.trials == 39 and saved.search_seconds == 12.346
    status = AdaptationRunStatus.model_validate(AdaptationRunStatus(checkpoint=saved).to_api())  # as stored
    assert status.checkpoint is not None and decode(status.checkpoint) == trials
    assert encode(trials, 1.0) == encode(trials, 1.0)  # no timestamp in the gzip stream


def test_a_checkpoint_too_large_for_the_status_is_not_written() -> None:
    assert encode([trial(i, 1.0 + i) for i in range(1, 200)], 1.0, limit=1000) is None


def test_a_corrupt_checkpoint_is_refused_so_the_search_starts_over() -> None:
    good = encode([trial(1, 2.0)], 1.0)
    assert good is not None
    with pytest.raises(CheckpointUnreadable):
        decode(SearchCheckpoint(trials=1, search_seconds=1.0, data="AAAA"))
    with pytest.raises(CheckpointUnreadable, match="holds 1 trials, not 2"):
        decode(good.model_copy(update={"trials": 2}))
