"""Stopping an ONNX Runtime run that passes its request's deadline.

Admission and the queue deadline bound how long a request waits, but a legal request can still be expensive
(two [64, 512] requests held both workers for about 10 s). ONNX Runtime checks ``RunOptions.terminate`` between
kernels, so one watchdog thread sets the flag of every run whose deadline has passed; the run then raises and
its worker is free again. A single thread with a heap, not a timer per run: a timer thread per request would
cost more than a batch-1 inference.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Terminable(Protocol):
    terminate: bool


class DeadlineExceeded(RuntimeError):
    """The run was stopped at its deadline; its outputs do not exist."""

    def __init__(self, ran_s: float) -> None:
        super().__init__(f"inference was stopped at its deadline after running {ran_s:.1f} s")
        self.ran_s = ran_s


class Watchdog:
    """Sets ``terminate`` on armed run options whose deadline (a ``time.perf_counter()`` value) has passed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Terminable]] = []
        self._live: set[int] = set()
        self._armed: dict[int, Terminable] = {}  # every run in progress, with a deadline or not
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self.stopped = 0  # runs stopped so far

    @contextmanager
    def armed(self, options: Terminable, deadline: float | None) -> Iterator[None]:
        """While the block runs, ``options.terminate`` is set once ``deadline`` passes (never if it is None)."""
        ident = next(self._ids)
        with self._wake:
            self._armed[ident] = options
            if deadline is not None:
                self._ensure_thread()
                self._live.add(ident)
                heapq.heappush(self._heap, (deadline, ident, options))
                self._wake.notify()
        try:
            yield
        finally:
            with self._wake:
                self._live.discard(ident)
                self._armed.pop(ident, None)

    def terminate_all(self) -> int:
        """Stop every run in progress now (the drain's timeout); returns how many there were."""
        with self._wake:
            for options in self._armed.values():
                options.terminate = True
            return len(self._armed)

    @property
    def running(self) -> int:
        with self._wake:
            return len(self._armed)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="deadline-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        with self._wake:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # finished in time: forget it
                if not self._heap:
                    self._wake.wait()
                    continue
                deadline, ident, options = self._heap[0]
                left = deadline - time.perf_counter()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(ident)
                options.terminate = True
                self.stopped += 1
