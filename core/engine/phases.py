"""The phases the pipeline reports to its observer, and the observer's interface.

A phase is a name, not a sentence: detail such as the quantization mode a
sensitivity scan is for travels separately, so observers (progress bars, the
agent's status writer) can map the phase without parsing text.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from metainfer.core.engine.trial import Trial


class PipelinePhase(StrEnum):
    PROFILING = "hardware profile"
    BASELINE = "baseline"
    SEARCH = "search"
    SENSITIVITY = "sensitivity"
    VALIDATION = "validation"
    FINAL_COMPARISON = "final comparison"


class Observer(Protocol):
    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None: ...
    def advance(self, label: str) -> None: ...
    def trial(self, trial: Trial, best: Trial | None) -> None: ...


class SilentObserver:
    """The observer of a pipeline nobody watches."""

    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None:
        return None

    def advance(self, label: str) -> None:
        return None

    def trial(self, trial: Trial, best: Trial | None) -> None:
        return None
