"""A run's measured trials kept in its status after it ends, and read back as history by later runs.

Durable state lives in the API server, never in the operator's memory: each
ended run keeps one ``HistorySource`` (its model's and hardware's features, its
search-relevant spec and its trials, core.engine.history, bounded) in
``status.trialHistory``, gzip + base64 like the checkpoint. It is garbage-
collected with the run, so with the policy. A later run of the same policy names
the runs to learn from in ``spec.historyFrom`` (the operator picks them); the
agent reads them, and the engine ranks them by similarity and warm-starts its
search. Why the run's status and not a CRD or ConfigMaps of its own: the trials
are the run's result, owned and deleted with it; the agent may already read runs
of its namespace and nothing else; and no object has to be kept in step.
"""

from __future__ import annotations

import base64
import gzip

from pydantic import ValidationError

from metainfer.core.api.run import (
    CHECKPOINT_MAX_CHARS,
    MAX_HISTORY_SOURCES,
    AdaptationRunStatus,
    HistorySourceSummary,
    RunHistory,
    SearchCheckpoint,
)
from metainfer.core.engine.history import HistorySource, bounded_trials
from metainfer.core.engine.history_use import HistoryUse

HISTORY_MAX_CHARS = CHECKPOINT_MAX_CHARS // 4  # a quarter of the checkpoint's room: 64 trials take ~10 KB


class HistoryUnreadable(ValueError):
    """A run's trial history cannot be decoded: it is left out of the new run's history."""


def source_label(run: str, class_description: str) -> str:
    """How a run names itself as a history source; ``summary`` reads the run and class back from it."""
    return f"{run} ({class_description})"


def _run_and_class(label: str) -> tuple[str, str | None]:
    run, _, rest = label.partition(" (")
    return run, rest.removesuffix(")") or None


def encode(source: HistorySource, search_seconds: float, limit: int = HISTORY_MAX_CHARS) -> SearchCheckpoint | None:
    """``source`` as status.trialHistory, halving its trials until it fits ``limit`` (None if nothing does)."""
    trials = list(source.trials)
    while True:
        candidate = source.model_copy(update={"trials": trials})
        data = base64.b64encode(gzip.compress(candidate.model_dump_json().encode(), mtime=0)).decode("ascii")
        if len(data) <= limit:
            return SearchCheckpoint(trials=len(trials), search_seconds=round(max(search_seconds, 0.0), 3), data=data)
        if not trials:
            return None
        trials = bounded_trials(trials, len(trials) // 2)


def decode(blob: SearchCheckpoint) -> HistorySource:
    try:
        return HistorySource.model_validate_json(gzip.decompress(base64.b64decode(blob.data, validate=True)))
    except (ValueError, OSError, EOFError, ValidationError) as exc:
        raise HistoryUnreadable(f"unreadable trial history ({type(exc).__name__})") from exc


def with_history(
    status: AdaptationRunStatus, source: HistorySource | None, search_seconds: float, use: HistoryUse | None
) -> AdaptationRunStatus:
    """An ended run's status, keeping its trials for later runs and saying what its own history did."""
    kept = encode(source, search_seconds) if source is not None else None
    return status.model_copy(update={"trial_history": kept, "history": summary(use)})


def summary(use: HistoryUse | None) -> RunHistory | None:
    """The status's account of the history (kubectl get adaptationruns -o wide shows trials saved and classes)."""
    if use is None or not use.offered:
        return None
    sources = []
    for u in use.sources[:MAX_HISTORY_SOURCES]:
        run, described = _run_and_class(u.label)
        sources.append(
            HistorySourceSummary(
                run=run[:253],
                class_description=described[:256] if described else None,
                similarity=round(min(max(u.similarity.total, 0.0), 1.0), 3),
                trials=u.trials,
            )
        )
    classes = list(dict.fromkeys(s.class_description for s in sources if s.class_description))
    note = "warm start from the closest source's winner" if use.warm else "no source related enough: a cold start"
    if use.skipped_known_failures:
        note += f"; {use.skipped_known_failures} points skipped that failed on matching hardware"
    return RunHistory(
        sources=sources,
        from_classes=", ".join(classes)[:256] or None,
        trials_saved=use.trials_saved,
        note=note[:256],
    )
