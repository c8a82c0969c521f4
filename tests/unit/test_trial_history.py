"""A run's trials kept in its status (bounded) and read back as history; the status's account of the history."""

from __future__ import annotations

import pytest

from metainfer.core.api.run import SearchCheckpoint
from metainfer.core.control import trial_history
from metainfer.core.engine.history import HardwareFeatures, HistorySource, HistoryTrial, ModelFeatures
from metainfer.core.engine.history_use import HistoryUse, Similarity, SourceUse
from metainfer.core.engine.trial import TrialStatus


def source(trials: int) -> HistorySource:
    return HistorySource(
        model=ModelFeatures(sha256="a" * 64, op_counts={"MatMul": 12, "Add": 30}),
        hardware=HardwareFeatures(fingerprint="0123456789abcdef", logical_cores=2, physical_cores=2),
        label="digits-run (cpu Xeon, amd64 AVX2)",
        trials=[
            HistoryTrial(
                point={"quantization": "int8_dynamic", "intra_op_num_threads": i % 3, "tag": f"t{i}-" + "x" * 40},
                status=TrialStatus.FEASIBLE if i % 5 else TrialStatus.FAILED,
                score=None if i % 5 == 0 else 1 + i / 100,
                failure="error" * 30 if i % 5 == 0 else None,
            )
            for i in range(trials)
        ],
    )


def test_a_source_round_trips_through_the_status() -> None:
    kept = trial_history.encode(source(20), 12.5)
    assert kept is not None and kept.trials == 20 and kept.search_seconds == 12.5
    assert trial_history.decode(SearchCheckpoint.model_validate(kept.to_api())) == source(20)


def test_a_history_too_large_keeps_its_best_trials_within_the_bound() -> None:
    kept = trial_history.encode(source(64), 1.0, limit=700)
    assert kept is not None and len(kept.data) <= 700 and kept.trials < 64
    back = trial_history.decode(kept)
    best = sorted((t.score for t in source(64).trials if t.score is not None), reverse=True)
    assert max(t.score or 0 for t in back.trials) == best[0], "halving keeps the best trials"
    assert trial_history.encode(source(64), 1.0, limit=10) is None


@pytest.mark.parametrize("data", ["bm90IGd6aXA=", "aGVsbG8", ""])
def test_unreadable_histories_are_refused_with_a_reason(data: str) -> None:
    with pytest.raises(trial_history.HistoryUnreadable, match="unreadable"):
        trial_history.decode(SearchCheckpoint(trials=1, search_seconds=0, data=data))


def test_the_status_says_where_the_history_came_from_and_what_it_saved() -> None:
    assert trial_history.summary(None) is None and trial_history.summary(HistoryUse()) is None
    use = HistoryUse(
        offered=2,
        sources=[
            SourceUse(
                label="run-a (cpu Xeon, amd64 AVX2)", model_sha256="a" * 64, hardware_fingerprint="f" * 16, batch=8,
                similarity=Similarity(total=0.91, hardware=0.9, model=1.0, spec=1.0), trials=12,
            ),
            SourceUse(
                label="run-b (nvidia A100, driver 550)", model_sha256="a" * 64, hardware_fingerprint="e" * 16,
                batch=8, similarity=Similarity(total=0.3, hardware=0.2, model=1.0, spec=1.0), trials=9,
            ),
        ],
        warm=True,
        trials_saved=7,
        skipped_known_failures=2,
    )  # fmt: skip
    status = trial_history.summary(use)
    assert status is not None and status.trials_saved == 7
    assert [s.run for s in status.sources] == ["run-a", "run-b"] and status.sources[0].similarity == 0.91
    assert status.from_classes == "cpu Xeon, amd64 AVX2, nvidia A100, driver 550"
    assert "warm start" in (status.note or "") and "2 points skipped" in (status.note or "")
