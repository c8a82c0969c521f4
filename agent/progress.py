"""Progress of the pipeline's phases (profiling, sensitivity, search), for whoever reads it.

A terminal gets live rich bars. A log nobody watches live (CI, a Job's log,
a pipe) gets plain lines instead: bars redrawn into a file are unreadable,
and one line per redraw would flood it. There, every phase start and every
finished trial is a line, and the steps in between (profiling benchmarks,
sensitivity layers) at most one line every few seconds.

Sensitivity analysis runs inside the search, when the first mixed-precision
candidate needs it: both observers keep the search's count across it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from metainfer.core.engine.phases import PipelinePhase
from metainfer.core.engine.trial import Trial

LOG_INTERVAL_S = 5.0  # the most often a log gets a line about steps inside a phase


def trial_summary(trial: Trial, best: Trial | None) -> str:
    """One finished trial in words, and the best so far: the same text in bars and in logs."""
    if trial.metrics is not None:
        m = trial.metrics
        text = f"{trial.recipe.describe()}: p50 {m.latency.p50_ms:.3g} ms, {m.quality.metric} {m.quality.value:.4f}"
        if trial.violations:
            text += f" (misses {trial.violations[0].split(':')[0]})"
        if m.early_stop == "raced":
            text += f" [raced: stopped after {m.latency.runs} runs]"
        elif m.early_stop == "quality_screen":
            text += f" [screened on {m.quality.samples} samples]"
    else:
        text = f"{trial.recipe.describe()}: failed: {trial.error}"
    if best is not None and best.metrics is not None:
        text += f" | best so far p50 {best.metrics.latency.p50_ms:.3g} ms"
    return text


class ProgressObserver(Protocol):
    """core.engine.phases.Observer plus the step callback of profiling, as a context manager."""

    def __enter__(self) -> ProgressObserver: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None: ...
    def advance(self, label: str) -> None: ...
    def on_step(self, done: int, total: int, label: str) -> None: ...
    def trial(self, trial: Trial, best: Trial | None) -> None: ...


def progress_for(console: Console) -> ProgressObserver:
    """Live bars on a terminal, plain lines anywhere else."""
    return RichObserver(console) if console.is_terminal else LogObserver(console)


class RichObserver:
    """Implements core.engine.phases.Observer: one bar per phase, the latest trial beside it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "{task.fields[label]}",
                style="dim",
                markup=False,
                table_column=Column(no_wrap=True, overflow="ellipsis"),
            ),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._search: TaskID | None = None

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish(self._task)
        self._finish(self._search)
        self.progress.stop()

    def _finish(self, task_id: TaskID | None) -> None:
        if task_id is not None and not self.progress.tasks[task_id].finished:
            task = self.progress.tasks[task_id]
            total = task.total if task.total is not None else max(task.completed, 1)
            # Stopping the task freezes its elapsed-time column at the phase's real duration.
            self.progress.update(task_id, total=total, completed=total)
            self.progress.stop_task(task_id)

    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None:
        if self._task != self._search:
            self._finish(self._task)
        if phase != PipelinePhase.SENSITIVITY:
            self._finish(self._search)
            self._search = None
        self._task = self.progress.add_task(f"{phase} ({detail})" if detail else str(phase), total=total, label="")
        if phase == PipelinePhase.SEARCH:
            self._search = self._task

    def advance(self, label: str) -> None:
        if self._task is not None:
            self.progress.update(self._task, advance=1, label=label)

    def on_step(self, done: int, total: int, label: str) -> None:
        """Adapter for callbacks of the form on_step(done, total, label)."""
        if self._task is None:
            return
        self.progress.update(self._task, completed=done, total=total, label=label)

    def trial(self, trial: Trial, best: Trial | None) -> None:
        if self._search is None:
            return
        if self._task != self._search:  # a sensitivity scan ran for this trial and is over
            self._finish(self._task)
            self._task = self._search
        self.progress.update(self._search, advance=1, label=trial_summary(trial, best))


class LogObserver:
    """Implements core.engine.phases.Observer as plain, timestamped lines for logs."""

    def __init__(
        self, console: Console, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.console, self.interval_s, self.clock = console, interval_s, clock
        self._started = clock()
        self._last_line = float("-inf")
        self._name = ""
        self._done = 0
        self._total: int | None = None
        self._search_total: int | None = None

    def __enter__(self) -> LogObserver:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def _line(self, text: str) -> None:
        now = self.clock()
        self._last_line = now
        # No markup, no highlighting, no wrapping: a log line is grepped and read as it was written.
        self.console.print(f"[{now - self._started:7.1f}s] {text}", markup=False, highlight=False, soft_wrap=True)

    def _count(self) -> str:
        return f"{self._done}/{self._total}" if self._total is not None else str(self._done)

    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None:
        self._name = f"{phase} ({detail})" if detail else str(phase)
        self._done, self._total = 0, total
        if phase == PipelinePhase.SEARCH:
            self._search_total = total
        self._line(f"{self._name}: started" + (f", {total} steps" if total is not None else ""))

    def _step(self, label: str) -> None:
        last = self._total is not None and self._done >= self._total
        if last or self.clock() - self._last_line >= self.interval_s:
            self._line(f"{self._name} {self._count()}: {label}")

    def advance(self, label: str) -> None:
        self._done += 1
        self._step(label)

    def on_step(self, done: int, total: int, label: str) -> None:
        self._done, self._total = done, total
        self._step(label)

    def trial(self, trial: Trial, best: Trial | None) -> None:
        of = f"/{self._search_total}" if self._search_total is not None else ""
        self._line(f"{PipelinePhase.SEARCH} {trial.index}{of}: {trial_summary(trial, best)}")
