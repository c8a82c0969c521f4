"""A search checkpoint in the run's status: what a retried Job resumes from.

A Job's pod can die mid-search (node drained, OOM, preemption); its retry used
to start over and re-measure every candidate. The agent now keeps the measured
trials in ``status.checkpoint`` (gzip + base64 of their JSON, bounded), and a
retried attempt hands them to the pipeline, which replays them into the
searcher (whose asks depend only on its history) and measures only what is
left. Trials are re-scored against the retry's own FP32 baseline, so a retry on
another node of the class compares like with like.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Sequence

from pydantic import TypeAdapter, ValidationError

from metainfer.core.api.run import CHECKPOINT_MAX_CHARS, SearchCheckpoint
from metainfer.core.engine.trial import Trial

_TRIALS = TypeAdapter(list[Trial])


class CheckpointUnreadable(ValueError):
    """The checkpoint cannot be decoded (corrupt, or written by an incompatible version): start over."""


def encode(
    trials: Sequence[Trial], search_seconds: float, limit: int = CHECKPOINT_MAX_CHARS
) -> SearchCheckpoint | None:
    """The checkpoint of ``trials``, or None when it would not fit ``limit`` characters (the search then restarts
    from scratch if interrupted, which is correct, only slower)."""
    raw = _TRIALS.dump_json(list(trials), exclude_none=True)
    data = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")
    if len(data) > limit:
        return None
    return SearchCheckpoint(trials=len(trials), search_seconds=round(max(search_seconds, 0.0), 3), data=data)


def decode(checkpoint: SearchCheckpoint) -> list[Trial]:
    try:
        trials = _TRIALS.validate_json(gzip.decompress(base64.b64decode(checkpoint.data, validate=True)))
    except (ValueError, OSError, EOFError, ValidationError, json.JSONDecodeError) as exc:
        raise CheckpointUnreadable(f"status.checkpoint is unreadable ({type(exc).__name__}); starting over") from exc
    if len(trials) != checkpoint.trials:
        raise CheckpointUnreadable(f"status.checkpoint holds {len(trials)} trials, not {checkpoint.trials}")
    return trials
