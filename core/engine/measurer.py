"""The seam between the adaptation pipeline and the hardware it measures on.

The pipeline decides (constraints, scores, which winner ships); a ``Measurer``
only answers "how fast and how good is this variant here". Keeping the two
apart lets the pipeline's decisions be tested against measurements that are
pure functions of the recipe, where real timings would make the outcome
depend on machine noise, and leaves room for measuring elsewhere than in this
process. ``OnnxRuntimeMeasurer``, the default, is the engine's real
measurement code in ``evaluate``, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, Screen, evaluate, measure_interleaved, resident_mib
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, make_reference
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.trial import LatencyStats, TrialMetrics


class Measurer(Protocol):
    """What the pipeline asks of the hardware, and nothing it decides itself."""

    def reference(self, model: bytes, recipe: Recipe, data: Dataset, metric: str = "auto") -> Reference:
        """The FP32 outputs every candidate's quality is compared with, at ``recipe.batch``, and the quality metric
        ``metric`` (the policy's choice) means for them."""
        ...

    def measure(
        self,
        variant: bytes,
        recipe: Recipe,
        latency_data: Dataset,
        quality_data: Dataset,
        reference: Reference,
        settings: MeasureSettings,
        screen: Screen | None = None,
    ) -> TrialMetrics:
        """Latency, quality against ``reference``, memory and size of one variant; with ``screen``, a measurement
        may stop early (``TrialMetrics.early_stop`` says why).

        May raise: the pipeline records a candidate whose measurement fails as a
        failed trial and goes on searching.
        """
        ...

    def compare(
        self, contenders: Sequence[tuple[bytes, Recipe]], data: Dataset, batch: int, settings: MeasureSettings
    ) -> list[LatencyStats]:
        """Latency of each (variant, recipe), in order, measured so that machine drift hits all alike."""
        ...


class OnnxRuntimeMeasurer:
    """Measures in this process with ONNX Runtime: the measurement behind every real adaptation.

    One memory floor for all its candidates, taken before the first: the search
    holds more as it goes (cached variants), which no candidate should be charged.
    """

    def __init__(self) -> None:
        self._floor_mib: float | None = None

    @property
    def floor_mib(self) -> float | None:
        """The process's resident memory before the first candidate (None before it): what every candidate's
        peak_memory_mib starts from, so a memory budget for the variant alone is this plus its share."""
        return self._floor_mib

    def reference(self, model: bytes, recipe: Recipe, data: Dataset, metric: str = "auto") -> Reference:
        return make_reference(create_session(model, recipe), data, recipe.batch, metric)

    def measure(
        self,
        variant: bytes,
        recipe: Recipe,
        latency_data: Dataset,
        quality_data: Dataset,
        reference: Reference,
        settings: MeasureSettings,
        screen: Screen | None = None,
    ) -> TrialMetrics:
        if self._floor_mib is None:
            self._floor_mib = resident_mib()
        return evaluate(variant, recipe, latency_data, quality_data, reference, settings, self._floor_mib, screen)

    def compare(
        self, contenders: Sequence[tuple[bytes, Recipe]], data: Dataset, batch: int, settings: MeasureSettings
    ) -> list[LatencyStats]:
        # Every session exists before the first timed run, so loading one never lands inside another's timing.
        sessions = [create_session(variant, recipe) for variant, recipe in contenders]
        return measure_interleaved(sessions, data, batch, settings)
