"""Rich progress bars for the pipeline's phases (profiling, sensitivity, search)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from metainfer.core.engine.phases import PipelinePhase
from metainfer.core.engine.trial import Trial


class RichObserver:
    """Implements core.engine.phases.Observer: one bar per phase, a line per notable trial."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[label]}", style="dim"),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._finish()
        self.progress.stop()

    def _finish(self) -> None:
        if self._task is not None:
            task = self.progress.tasks[self._task]
            total = task.total if task.total is not None else max(task.completed, 1)
            # Stopping the task freezes its elapsed-time column at the phase's real duration.
            self.progress.update(self._task, total=total, completed=total)
            self.progress.stop_task(self._task)

    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None:
        self._finish()
        self._task = self.progress.add_task(f"{phase} ({detail})" if detail else str(phase), total=total, label="")

    def advance(self, label: str) -> None:
        if self._task is not None:
            self.progress.update(self._task, advance=1, label=label[:60])

    def on_step(self, done: int, total: int, label: str) -> None:
        """Adapter for callbacks of the form on_step(done, total, label)."""
        if self._task is None:
            return
        self.progress.update(self._task, completed=done, total=total, label=label[:60])

    def trial(self, trial: Trial, best: Trial | None) -> None:
        if self._task is None:
            return
        if trial.metrics is not None:
            m = trial.metrics
            label = f"p50 {m.latency.p50_ms:.2f} ms, {m.quality.metric[:3]} {m.quality.value:.4f}"
        else:
            label = f"failed: {trial.error}"
        if best is not None and best.metrics is not None:
            label += f" | best p50 {best.metrics.latency.p50_ms:.2f} ms"
        self.progress.update(self._task, advance=1, label=label)
