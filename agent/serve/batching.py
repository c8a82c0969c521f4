"""Dynamic batching, as Triton's dynamic batcher does: concurrent requests share one ONNX Runtime run.

Thirty-two clients sending one sample each used to cost 32 session runs, each
paying the per-run overhead the adaptation search amortised by choosing a batch
size; they got 0.64x the items/s of one client sending batches of 32. Requests
now wait in one queue; when an inference worker is free, the oldest request and
every queued request compatible with it (same outputs asked for, same
non-batch shapes and dtypes) are concatenated along the batch axis, up to the
variant's batch size (the one the adaptation measured), run once, and split
back. A lone request waits at most ``max_delay_s`` for company; under load the
queue fills while the workers are busy, so batches form without any delay.

Only models whose inputs and outputs all have a dynamic first (batch) axis are
batched, and only while their outputs have the run's rows first (a seq-major
[steps, batch, classes] output does not: the load-time check in model.py, and
here every combined run, which is rerun request by request when it fails); any
other model runs one request per run through the same queue, so the queue
wait, the deadline and the metrics are the same either way.

The batcher can lose neither a request nor itself. A request waits for its answer at most until its deadline
(still queued then: it leaves the queue and gets no result, a 503) plus ``STUCK_GRACE_S`` once running (a run
the watchdog could not stop in time: ``RunOverdue``, a 504), so a client is answered whatever happens to the
requests it shares a run with. The queue holds requests by identity, never comparing their tensors. An
unexpected exception in the dispatcher fails the requests it held at that moment, is logged and counted, and
the dispatcher goes on; ``health`` tells the probes when no progress is possible any more (every worker
overdue, or the dispatcher gone), readiness at once and liveness once that has lasted ``stall_limit_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metainfer.agent.serve.deadlines import DeadlineExceeded

log = logging.getLogger("metainfer.serve")
Arrays = dict[str, np.ndarray]
RunFn = Callable[[Arrays, list[str], float | None], Arrays]  # (inputs, outputs, deadline)
# How long past its deadline a running request still waits for its run: the watchdog stops a run between kernels,
# so one long kernel can outlast the deadline by this much before the request is answered without it.
STUCK_GRACE_S = 2.0


@dataclass(frozen=True)
class Outcome:
    """What one request got: its outputs (None: its deadline passed before it could run) and its timings."""

    results: Arrays | None
    waited_s: float
    compute_s: float
    batch_rows: int = 0


class RunOverdue(RuntimeError):
    """The request's run went on past its deadline and the grace: it is answered without its outputs."""

    def __init__(self, overdue_s: float) -> None:
        super().__init__(f"inference was still running {overdue_s:.1f} s after the request's deadline")


class BatcherFailure(RuntimeError):
    """The batching machinery itself failed while it held the request (a bug, logged with its traceback)."""


@dataclass(frozen=True)
class Health:
    """Whether serving can make progress: ``ready`` false as soon as it cannot, ``live`` false once that has lasted
    the stall limit (the kubelet then restarts the pod); ``reason`` says why when either is false."""

    ready: bool
    live: bool
    reason: str = ""


@dataclass(eq=False)  # identity, never field equality: the fields hold numpy arrays
class _Pending:
    inputs: Arrays
    outputs: list[str]
    rows: int
    key: tuple[Any, ...]
    submitted: float
    deadline: float
    future: asyncio.Future[Outcome] = field(repr=False)
    running_since: float | None = None
    start_by: float = math.inf  # not started by then: it leaves the queue (at the latest, its deadline)


@dataclass(eq=False)
class _Run:
    started: float
    deadline: float  # the latest deadline of its members: the watchdog stops it only then


def compatibility(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> tuple[Any, ...]:
    """Requests with equal keys can share a run: the same outputs, and every input the same dtype and non-batch
    shape."""
    return (
        tuple(outputs),
        tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in inputs.items())),
    )


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's batch: the first axis of its first input (1 for a scalar or no input)."""
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


class Batcher:
    def __init__(
        self,
        run: RunFn,
        executor: Executor,
        *,
        workers: int,
        batch_rows: int,
        max_delay_s: float,
        batchable: bool,
        stall_limit_s: float = 30.0,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._run, self._executor = run, executor
        self.workers = workers
        self.batch_rows = max(1, batch_rows) if batchable else 1
        self.max_delay_s = max_delay_s if batchable else 0.0
        self.stall_limit_s = stall_limit_s
        self._on_failure = on_failure
        self._queue: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(workers)
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None], _Run] = {}
        self._stalled_since: float | None = None
        self._closed = False
        self.failures = 0  # unexpected exceptions in the batching machinery so far

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(
        self, inputs: Arrays, outputs: list[str], deadline: float, start_by: float | None = None
    ) -> Outcome:
        """Queue one request (``deadline``: perf_counter() time after which it must not start, and at which its
        run is stopped; ``start_by``, earlier: after which it must not start, its run left alone) and wait for its
        answer: its outputs, its own error, no result (``Outcome.results`` None: still queued at ``start_by``) or
        RunOverdue (its run outlasted the deadline by STUCK_GRACE_S)."""
        self._ensure_dispatcher()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        pending = _Pending(
            inputs, outputs, rows_of(inputs), compatibility(inputs, outputs), time.perf_counter(), deadline, future,
            start_by=deadline if start_by is None else min(start_by, deadline),
        )  # fmt: skip
        self._queue.append(pending)
        self._arrived.set()
        try:
            return await self._answer(pending)
        finally:
            self._forget(pending)  # an answered, timed-out or cancelled request never runs later

    async def _answer(self, pending: _Pending) -> Outcome:
        future = pending.future
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(future), max(0.0, pending.start_by - time.perf_counter()))
        now = time.perf_counter()
        if pending.running_since is None:  # never started: the deadline says it must not any more
            return Outcome(None, now - pending.submitted, 0.0)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(future), max(0.0, pending.deadline + STUCK_GRACE_S - now))
        raise RunOverdue(time.perf_counter() - pending.deadline)

    def _forget(self, pending: _Pending) -> None:
        self._queue = [p for p in self._queue if p is not pending]
        if not pending.future.done():
            pending.future.cancel()

    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is None or self._dispatcher.done():
            if self._dispatcher is not None and not self._dispatcher.cancelled() and self._dispatcher.exception():
                log.error("batching dispatcher had died (%r); restarted", self._dispatcher.exception())
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(), name="batching-dispatcher")

    def close(self) -> None:
        self._closed = True
        if self._dispatcher is not None:
            self._dispatcher.cancel()

    def health(self, now: float | None = None) -> Health:
        """Progress is impossible while every worker runs past its deadline and the grace (ONNX Runtime did not
        stop them), or while requests wait and the dispatcher is gone."""
        now = time.perf_counter() if now is None else now
        overdue = sum(1 for run in self._running.values() if now > run.deadline + STUCK_GRACE_S)
        reason = ""
        if overdue >= self.workers:
            reason = f"all {self.workers} inference worker(s) are running past their requests' deadlines"
        elif self._queue and not self._closed and (self._dispatcher is None or self._dispatcher.done()):
            reason = f"{len(self._queue)} request(s) queued and the batching dispatcher is not running"
        if not reason:
            self._stalled_since = None
            return Health(True, True)
        if self._stalled_since is None:
            self._stalled_since = now
        stalled_for = now - self._stalled_since
        return Health(False, stalled_for < self.stall_limit_s, f"{reason} (for {stalled_for:.0f} s)")

    async def _dispatch(self) -> None:
        while True:
            before: list[_Pending] = []
            slot = False
            try:
                while not self._queue:
                    self._arrived.clear()
                    await self._arrived.wait()
                await self._slots.acquire()
                slot = True
                await self._gather_company()
                before = list(self._queue)
                held = self._take()
                if not held:
                    continue
                task = asyncio.get_running_loop().create_task(self._execute(held))
                slot = False  # the run releases it
                self._running[task] = _Run(time.perf_counter(), max(p.deadline for p in held))
                task.add_done_callback(self._finished)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must fail what it held, never the requests after it
                queued = {id(p) for p in self._queue}
                self._failed(exc, [p for p in before if id(p) not in queued])  # taken out, never started
                await asyncio.sleep(0)  # no busy loop if the failure repeats
            finally:
                if slot:
                    self._slots.release()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)

    def _failed(self, exc: BaseException, held: list[_Pending]) -> None:
        self.failures += 1
        log.error("batching failed holding %d request(s); they are answered 500", len(held), exc_info=exc)
        if self._on_failure is not None:
            self._on_failure(exc)
        for pending in held:
            if not pending.future.done():
                pending.future.set_exception(BatcherFailure(f"batching failed ({type(exc).__name__})"))

    async def _gather_company(self) -> None:
        """Wait (at most until the oldest request's delay is up) while a batch could still grow."""
        while self._queue and self.max_delay_s > 0:
            first = self._queue[0]
            if self._compatible_rows(first) >= self.batch_rows:
                return
            remaining = first.submitted + self.max_delay_s - time.perf_counter()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _compatible_rows(self, first: _Pending) -> int:
        return sum(p.rows for p in self._queue if p.key == first.key)

    def _take(self) -> list[_Pending]:
        """The oldest request, and the compatible ones after it that fit the batch; expired ones are answered."""
        now = time.perf_counter()
        live: list[_Pending] = []
        for pending in self._queue:
            if pending.future.done():
                continue  # answered already (cancelled by its client)
            if pending.start_by < now:
                pending.future.set_result(Outcome(None, now - pending.submitted, 0.0))
                continue
            live.append(pending)
        if not live:
            self._queue = []
            return []
        first = live[0]
        batch, rows = [first], first.rows
        for pending in live[1:]:
            if pending.key == first.key and rows + pending.rows <= self.batch_rows:
                batch.append(pending)
                rows += pending.rows
        taken = {id(p) for p in batch}
        self._queue = [p for p in live if id(p) not in taken]
        for pending in batch:
            pending.running_since = now
        return batch

    async def _execute(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            results, compute_s = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run_batch, batch
            )
            rows = sum(p.rows for p in batch)
            for pending, result in zip(batch, results, strict=True):
                if pending.future.done():
                    continue
                if isinstance(result, BaseException):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(Outcome(result, started - pending.submitted, compute_s, rows))
        except Exception as exc:
            self._failed(exc, batch)
        finally:
            self._slots.release()

    def _stop_batching(self, combined: Arrays, rows: int) -> None:
        """A combined run whose outputs do not have its rows first cannot be split back by request (a seq-major
        [steps, batch, classes] output the load-time check could not see): from now on every request runs alone."""
        shapes = {name: list(value.shape) for name, value in combined.items()}
        log.warning("outputs %s of a run of %d rows do not have the rows first: each request now runs alone",
                    str(shapes)[:300], rows)  # fmt: skip
        self.batch_rows, self.max_delay_s = 1, 0.0

    def _run_batch(self, batch: list[_Pending]) -> tuple[list[Arrays | BaseException], float]:
        outputs = batch[0].outputs
        started = time.perf_counter()
        live = [p for p in batch if not p.future.done()]  # a client that left meanwhile costs no compute
        deadline = max((p.deadline for p in live), default=started)  # a shared run stops once all are overdue
        if len(live) > 1:
            combined: Arrays | None = None
            inputs = {name: np.concatenate([p.inputs[name] for p in live]) for name in live[0].inputs}
            try:
                combined = self._run(inputs, outputs, deadline)
            except DeadlineExceeded as exc:
                return [exc] * len(batch), time.perf_counter() - started
            except Exception:  # one request's failure must not fail the others: run them alone
                pass
            else:
                rows = sum(p.rows for p in live)
                if any(not value.ndim or value.shape[0] != rows for value in combined.values()):
                    self._stop_batching(combined, rows)
                    combined = None
            if combined is not None:
                by_request: dict[int, Arrays | BaseException] = {}
                offset = 0
                for pending in live:
                    by_request[id(pending)] = {
                        name: value[offset : offset + pending.rows] for name, value in combined.items()
                    }
                    offset += pending.rows
                gone = DeadlineExceeded(0.0)
                return [by_request.get(id(p), gone) for p in batch], time.perf_counter() - started
        alone: list[Arrays | BaseException] = []
        for pending in batch:
            if pending.future.done():
                alone.append(DeadlineExceeded(0.0))  # never delivered: its client is gone
                continue
            try:
                alone.append(self._run(pending.inputs, outputs, pending.deadline))
            except Exception as exc:
                alone.append(exc)
        return alone, time.perf_counter() - started
