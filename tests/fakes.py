"""The stand-ins the tests share, defined once (importable from every tier: pytest puts tests/ on the path).

- ``FakeMeasurer``: the engine's Measurer seam with latency, quality drop and memory as pure functions of the
  recipe, so which candidate wins never depends on the machine's timing. Its reference is real: validation runs
  the chosen variant for real and compares it with that.
- ``fixed_profile``: a hardware profile with nothing measured, so a search space does not depend on the machine
  running the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, Screen
from metainfer.core.engine.measurer import OnnxRuntimeMeasurer
from metainfer.core.engine.profile.types import HardwareProfile, MachineInfo, OpSupport, SupportStatus
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference
from metainfer.core.engine.trial import LatencyStats, Quality, TrialMetrics

OfRecipe = Callable[[Recipe], float]
REFERENCE_ACCURACY = 0.95


def _no_drop(recipe: Recipe) -> float:
    return 0.0


def _flat_memory(recipe: Recipe) -> float:
    return 100.0


@dataclass
class FakeMeasurer:
    """Latency (ms per batch), quality drop and peak memory (MiB) of each candidate, as functions of its recipe.

    ``final_latency_ms`` is the back-to-back re-measurement of the final comparison (None: as in the search);
    ``compared`` records the recipes of each comparison. The tail of each latency is ``p95_ratio`` and
    ``p99_ratio`` times its median.
    """

    latency_ms: OfRecipe
    drop: OfRecipe = _no_drop
    final_latency_ms: OfRecipe | None = None
    memory_mib: OfRecipe = _flat_memory
    p95_ratio: float = 1.2
    p99_ratio: float = 1.5
    runs: int = 20
    compared: list[list[Recipe]] = field(default_factory=list)

    def stats(self, ms: float, batch: int) -> LatencyStats:
        return LatencyStats(
            p50_ms=ms,
            p95_ms=self.p95_ratio * ms,
            p99_ms=self.p99_ratio * ms,
            mean_ms=ms,
            runs=self.runs,
            warmup_runs=0,
            throughput_per_s=batch * 1e3 / ms,
        )

    def reference(self, model: bytes, recipe: Recipe, data: Dataset, metric: str = "auto") -> Reference:
        return OnnxRuntimeMeasurer().reference(model, recipe, data, metric)

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
        drop = self.drop(recipe)
        quality = Quality(
            metric="top1_accuracy",
            value=REFERENCE_ACCURACY - drop,
            reference=REFERENCE_ACCURACY,
            drop=drop,
            samples=quality_data.n_samples,
        )
        return TrialMetrics(
            latency=self.stats(self.latency_ms(recipe), recipe.batch),
            quality=quality,
            peak_memory_mib=self.memory_mib(recipe),
            model_size_mib=len(variant) / (1 << 20),
        )

    def compare(
        self, contenders: Sequence[tuple[bytes, Recipe]], data: Dataset, batch: int, settings: MeasureSettings
    ) -> list[LatencyStats]:
        self.compared.append([recipe for _, recipe in contenders])
        final = self.final_latency_ms or self.latency_ms
        return [self.stats(final(recipe), batch) for _, recipe in contenders]


def fixed_profile(
    fingerprint: str = "0123456789abcdef", cores: int = 2, int8_status: SupportStatus | None = None
) -> HardwareProfile:
    """A CPU of ``cores`` cores with nothing measured; with ``int8_status``, an op matrix saying how its MatMul
    runs in fp32 (native) and int8 (``int8_status``), which history's similarity compares."""
    ops = (
        []
        if int8_status is None
        else [
            OpSupport(op_type="MatMul", dtype="fp32", provider="CPUExecutionProvider", status="native"),
            OpSupport(
                op_type="MatMulInteger",
                dtype="int8",
                variant="u8s8",
                provider="CPUExecutionProvider",
                status=int8_status,
            ),
        ]
    )
    return HardwareProfile(
        fingerprint=fingerprint,
        machine=MachineInfo(
            cpu_model="test CPU",
            arch="x86_64",
            logical_cores=cores,
            physical_cores=cores,
            total_memory_bytes=8 << 30,
            onnxruntime_version="test",
            execution_providers=["CPUExecutionProvider"],
        ),
        providers_profiled=["CPUExecutionProvider"],
        ops=ops,
        peak_gemm_gflops_fp32=100.0 * cores / 2,
        peak_gemm_gflops_int8=300.0 * cores / 2,
        memory_bandwidth_gbps=10.0,
        measured_at=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=0.0,
    )
