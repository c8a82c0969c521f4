"""Measure a variant: latency (warm-up, repeat until stable), quality, memory.

Latency is per batch at the production batch size. Runs repeat in rounds until
the median of the newest round is within ``stable_rel`` of the running median,
or a cap on runs or seconds is hit, so fast models get many samples and slow
ones do not stall the search. Quality is always compared with the FP32 model's
outputs on the same samples (``core.engine.reference``), computed once per adaptation.

Peak memory is the process's: what it held before the variant (the floor) plus
the most that loading and running the variant added. Memory that earlier work
freed is handed back to the OS first; otherwise the allocator reuses it, the
variant's growth reads as zero and whichever candidate ran after a larger one
looks free.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.memory import track_peak_memory
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, quality_of, run_all
from metainfer.core.engine.runtime import Session, create_session
from metainfer.core.engine.trial import EarlyStop, LatencyStats, TrialMetrics


class MeasureSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    warmup_runs: int = Field(3, ge=0)
    round_runs: int = Field(10, ge=1, description="Runs per round; stability is checked after each round.")
    min_runs: int = Field(20, ge=1)
    max_runs: int = Field(300, ge=1)
    max_seconds: float = Field(3.0, gt=0, description="Time cap for the timed runs of one trial.")
    stable_rel: float = Field(0.02, gt=0, description="Stop when a round's median moves less than this.")
    quality_samples: int = Field(512, ge=1, description="Samples used for quality during search.")
    racing: bool = Field(
        True,
        description="Stop timing a candidate once its running median is clearly slower than the best so far"
        " (the pipeline decides when racing is sound for the objective).",
    )
    quality_screen_samples: int = Field(
        16,
        ge=1,
        description="Quality is first measured on this many samples; a candidate that clearly misses the quality"
        " budget there is not timed in full, and the rest of the samples are measured only for the others.",
    )


# A candidate whose subset quality drop exceeds the budget by this factor is screened out: clearly infeasible.
QUALITY_SCREEN_FACTOR = 2.0


@dataclass(frozen=True)
class Screen:
    """What lets one candidate's measurement stop early (racing, quality first on a subset).

    ``stop_above_ms``: a running median above this is clearly slower than the best so far, so its timing stops
    after one round; None: no racing. ``max_quality_drop``: the policy's quality budget; None: no screening.
    """

    stop_above_ms: float | None = None
    max_quality_drop: float | None = None


def measure_latency(session: Session, data: Dataset, batch: int, settings: MeasureSettings) -> LatencyStats:
    return latency_stats(time_runs(session, data, batch, settings), batch, settings.warmup_runs)


def time_runs(
    session: Session,
    data: Dataset,
    batch: int,
    settings: MeasureSettings,
    stop_above_s: float | None = None,
) -> np.ndarray:
    """Seconds per run after warm-up, repeated until the median is stable or a cap is hit; with ``stop_above_s``,
    also as soon as a full round's median is above it (racing: clearly slower than what it competes with)."""
    feeds = [data.batch(i * batch, batch) for i in range(max(1, min(4, data.n_samples // batch)))]
    for i in range(settings.warmup_runs):
        session.run(None, feeds[i % len(feeds)])
    times: list[float] = []
    started = time.perf_counter()
    previous_median: float | None = None
    while len(times) < settings.max_runs:
        for _ in range(settings.round_runs):
            t0 = time.perf_counter()
            session.run(None, feeds[len(times) % len(feeds)])
            times.append(time.perf_counter() - t0)
        median = float(np.median(times))
        if stop_above_s is not None and median > stop_above_s:
            break
        enough = len(times) >= settings.min_runs
        if enough and previous_median is not None and abs(median - previous_median) <= settings.stable_rel * median:
            break
        if enough and time.perf_counter() - started >= settings.max_seconds:
            break
        previous_median = median
    return np.asarray(times)


def latency_stats(seconds: np.ndarray, batch: int, warmup_runs: int) -> LatencyStats:
    ms = seconds * 1e3
    p50 = float(np.percentile(ms, 50))
    return LatencyStats(
        p50_ms=p50,
        p95_ms=float(np.percentile(ms, 95)),
        p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(ms.mean()),
        runs=len(ms),
        warmup_runs=warmup_runs,
        throughput_per_s=batch * 1e3 / p50 if p50 > 0 else 0.0,
    )


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


def resident_mib() -> float:
    """The process's resident memory once what earlier work freed is back with the OS, MiB."""
    gc.collect()  # sessions and arrays of earlier trials in reference cycles
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return float(psutil.Process().memory_info().rss) / (1 << 20)


def evaluate(
    model_bytes: bytes,
    recipe: Recipe,
    latency_data: Dataset,
    quality_data: Dataset,
    reference: Reference,
    settings: MeasureSettings,
    floor_mib: float | None = None,
    screen: Screen | None = None,
) -> TrialMetrics:
    """Load the variant with the recipe's session settings and measure everything.

    ``floor_mib``: what the process holds apart from the variant (``resident_mib()`` taken once, before the
    first candidate), so that what the search itself holds by then (cached variants) is not charged to a
    candidate; None takes the process as it is now.

    With a ``screen``, quality is measured on ``settings.quality_screen_samples`` first: a candidate clearly
    over the quality budget there gets one short timing round and its subset quality (``early_stop``
    "quality_screen"). Otherwise it is timed, stopping after a round whose median is above
    ``screen.stop_above_ms`` ("raced": its quality stays the subset's), and only the remaining contenders have
    their quality measured on every sample.
    """
    now_mib = resident_mib()
    early: EarlyStop | None = None
    with track_peak_memory() as peak:
        session = create_session(model_bytes, recipe)
        # Whole batches only: a model with a fixed batch dimension runs nothing else.
        screen_samples = -(-settings.quality_screen_samples // recipe.batch) * recipe.batch
        screened = screen is not None and screen_samples < quality_data.n_samples
        head = quality_data.head(screen_samples) if screened else quality_data
        outputs = run_all(session, head, recipe.batch)
        quality = quality_of(outputs, reference.head(head.n_samples))
        budget = None if screen is None else screen.max_quality_drop
        if screened and budget is not None and quality.drop > QUALITY_SCREEN_FACTOR * budget:
            early = "quality_screen"
            one_round = settings.model_copy(update={"min_runs": settings.round_runs, "max_runs": settings.round_runs})
            latency = measure_latency(session, latency_data, recipe.batch, one_round)
        else:
            stop_above_s = None if screen is None or screen.stop_above_ms is None else screen.stop_above_ms / 1e3
            times = time_runs(session, latency_data, recipe.batch, settings, stop_above_s)
            latency = latency_stats(times, recipe.batch, settings.warmup_runs)
            if stop_above_s is not None and float(np.median(times)) > stop_above_s:
                early = "raced"
            elif screened:  # a contender: quality on every sample, reusing the subset's outputs
                rest = quality_data.tail(head.n_samples)
                tail_outputs = run_all(session, rest, recipe.batch)
                whole = [np.concatenate([a, b]) for a, b in zip(outputs, tail_outputs, strict=True)]
                quality = quality_of(whole, reference)
    return TrialMetrics(
        latency=latency,
        quality=quality,
        peak_memory_mib=(now_mib if floor_mib is None else floor_mib) + peak.mib,
        model_size_mib=len(model_bytes) / (1 << 20),
        variant_memory_mib=peak.mib,
        early_stop=early,
    )


def measure_interleaved(
    sessions: list[Session], data: Dataset, batch: int, settings: MeasureSettings, rounds: int = 5
) -> list[LatencyStats]:
    """Latency of several sessions timed in alternating rounds, so machine drift hits all alike."""
    per_round = settings.model_copy(
        update={
            "max_seconds": settings.max_seconds / rounds,
            "min_runs": max(1, settings.min_runs // rounds),
            "max_runs": max(1, settings.max_runs // rounds),
        }
    )
    times: list[list[np.ndarray]] = [[] for _ in sessions]
    for _ in range(rounds):
        for i, session in enumerate(sessions):
            times[i].append(time_runs(session, data, batch, per_round))
    return [latency_stats(np.concatenate(t), batch, settings.warmup_runs * rounds) for t in times]
