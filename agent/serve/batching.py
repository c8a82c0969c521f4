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
batched; any other model runs one request per run through the same queue, so
the queue wait, the deadline and the metrics are the same either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metainfer.agent.serve.deadlines import DeadlineExceeded

Arrays = dict[str, np.ndarray]
RunFn = Callable[[Arrays, list[str], float | None], Arrays]  # (inputs, outputs, deadline)


@dataclass(frozen=True)
class Outcome:
    """What one request got: its outputs (None: its deadline passed before it could run) and its timings."""

    results: Arrays | None
    waited_s: float
    compute_s: float
    batch_rows: int = 0


@dataclass
class _Pending:
    inputs: Arrays
    outputs: list[str]
    rows: int
    key: tuple[Any, ...]
    submitted: float
    deadline: float
    future: asyncio.Future[Outcome] = field(repr=False)


def compatibility(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> tuple[Any, ...]:
    """Requests with equal keys can share a run: the same outputs, and every input the same dtype and non-batch
    shape."""
    return (
        tuple(outputs),
        tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in inputs.items())),
    )


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
    ) -> None:
        self._run, self._executor = run, executor
        self.batch_rows = max(1, batch_rows) if batchable else 1
        self.max_delay_s = max_delay_s if batchable else 0.0
        self._queue: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(workers)
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: Arrays, outputs: list[str], deadline: float) -> Outcome:
        """Queue one request (``deadline``: perf_counter() time after which it must not start) and wait for it."""
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        rows = next(iter(inputs.values())).shape[0] if inputs and next(iter(inputs.values())).ndim else 1
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._queue.append(
            _Pending(inputs, outputs, rows, compatibility(inputs, outputs), time.perf_counter(), deadline, future)
        )
        self._arrived.set()
        return await future

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()

    async def _dispatch(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            await self._slots.acquire()
            await self._gather_company()
            batch = self._take()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

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
        for expired in [p for p in self._queue if p.deadline < now]:
            self._queue.remove(expired)
            if not expired.future.done():
                expired.future.set_result(Outcome(None, now - expired.submitted, 0.0))
        if not self._queue:
            return []
        first = self._queue[0]
        batch, rows = [first], first.rows
        for pending in self._queue[1:]:
            if pending.key == first.key and rows + pending.rows <= self.batch_rows:
                batch.append(pending)
                rows += pending.rows
        for pending in batch:
            self._queue.remove(pending)
        return batch

    async def _execute(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            results, compute_s = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run_batch, batch
            )
        except Exception as exc:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        finally:
            self._slots.release()
        rows = sum(p.rows for p in batch)
        for pending, result in zip(batch, results, strict=True):
            if pending.future.done():
                continue
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(Outcome(result, started - pending.submitted, compute_s, rows))

    def _run_batch(self, batch: list[_Pending]) -> tuple[list[Arrays | BaseException], float]:
        outputs = batch[0].outputs
        started = time.perf_counter()
        deadline = max(p.deadline for p in batch)  # a shared run is stopped only once every member is overdue
        if len(batch) > 1:
            inputs = {name: np.concatenate([p.inputs[name] for p in batch]) for name in batch[0].inputs}
            try:
                combined = self._run(inputs, outputs, deadline)
            except DeadlineExceeded as exc:
                return [exc] * len(batch), time.perf_counter() - started
            except Exception:  # one request's failure must not fail the others: run them alone
                pass
            else:
                splits: list[Arrays | BaseException] = []
                offset = 0
                for pending in batch:
                    splits.append({name: value[offset : offset + pending.rows] for name, value in combined.items()})
                    offset += pending.rows
                return splits, time.perf_counter() - started
        alone: list[Arrays | BaseException] = []
        for pending in batch:
            try:
                alone.append(self._run(pending.inputs, outputs, pending.deadline))
            except Exception as exc:
                alone.append(exc)
        return alone, time.perf_counter() - started
