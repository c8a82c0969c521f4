"""What one machine can do for inference, as plain data.

These models are embedded in the AdaptationRun CRD schema, so they stay plain:
Literal enums, bounded lists, no dict-of-unions. The search asks them one
question, "may this op run in this dtype on this EP?", through ``support``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

Dtype = Literal["fp32", "fp16", "int8"]
SupportStatus = Literal["native", "fallback", "unsupported"]
CPU_PROVIDER = "CPUExecutionProvider"
# 2: NhwcConv probed (the NHWC layout candidate depends on it); 3: OpenVINO probed; 4: each op's fastest run kept
# (the int8 type-variant pruning compares those).
SCHEMA_VERSION = 4
_RANK: dict[str, int] = {"native": 0, "fallback": 1, "unsupported": 2}


def int8_variant(activation_type: str, weight_type: str) -> str:
    """Variant tag of an integer op: ``("uint8", "int8") -> "u8s8"`` (activations first)."""
    tag = {"uint8": "u8", "int8": "s8"}
    return tag[activation_type] + tag[weight_type]


class _Plain(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpSupport(_Plain):
    """How one op type in one dtype (and type variant) behaves on one execution provider."""

    op_type: str = Field(max_length=64, description="ONNX op type, e.g. MatMul, QLinearConv.")
    dtype: Dtype = Field(description="Compute dtype: float type of activations, int8 for integer ops.")
    variant: str | None = Field(
        None,
        max_length=16,
        description="Type combination of integer ops: u8s8 = uint8 activations x int8 weights.",
    )
    provider: str = Field(max_length=64)
    status: SupportStatus = Field(
        description="native: runs on the provider in this dtype; fallback: runs, but on CPU or emulated "
        "in fp32 behind inserted Casts; unsupported: the session cannot be created or run."
    )
    latency_us: float | None = Field(None, ge=0, description="Median summed kernel time per run.")
    best_us: float | None = Field(
        None,
        ge=0,
        description="Fastest run's summed kernel time: what the kernel costs, which another process on the "
        "machine can only inflate (profiles before schema 4 lack it).",
    )
    detail: str | None = Field(None, max_length=300, description="Why fallback/unsupported (first error line).")


class MachineInfo(_Plain):
    """Inference-relevant identity of the machine; the fingerprint hashes a subset."""

    cpu_model: str = Field(max_length=128)
    arch: str = Field(max_length=32, description="Normalised: x86_64 or aarch64 (else as platform reports).")
    logical_cores: int = Field(ge=1, description="Cores this process may use (affinity / cgroup aware).")
    physical_cores: int = Field(ge=1)
    cpu_flags: list[str] = Field(
        default_factory=list, max_length=64, description="Sorted ISA features relevant to inference."
    )
    total_memory_bytes: int = Field(ge=0)
    onnxruntime_version: str = Field(max_length=32)
    execution_providers: list[str] = Field(
        default_factory=list, max_length=32, description="As onnxruntime.get_available_providers()."
    )


class BenchConfig(_Plain):
    """Sizes and repeats of the micro-benchmarks; tests shrink them, the default fits in ~30 s."""

    seed: int = 0
    op_warmup: int = Field(2, ge=0)
    op_runs: int = Field(20, ge=1)
    gemm_n: int = Field(1024, ge=16, description="Square GEMM size for peak compute.")
    gemm_repeats: int = Field(10, ge=1, description="Peak = best of at least this many runs.")
    gemm_min_seconds: float = Field(
        1.0,
        ge=0,
        description="...and of runs for at least this long: the first runs after idle come in up to 40 % slow "
        "(measured back to back on a quiet 2-core VM: 245 then 288-318 GFLOP/s), and a peak read low inflates "
        "every roofline fraction.",
    )
    bandwidth_mib: int = Field(64, ge=1, description="Size of each tensor of the bandwidth Add.")
    bandwidth_repeats: int = Field(10, ge=1)
    intra_op_num_threads: int = Field(0, ge=0, description="0 lets ONNX Runtime decide.")
    providers: list[str] | None = Field(
        None, max_length=32, description="EPs to profile; None = every available compute EP."
    )
    op_types: list[str] | None = Field(None, max_length=64, description="Probe only these ops; None = all.")


class UnusableProvider(_Plain):
    """An EP offered by ONNX Runtime that does not run on this machine, and why (core.engine.runtime)."""

    provider: str = Field(max_length=64)
    reason: str = Field(max_length=600)


class OpenVinoAvailability(_Plain):
    """Whether OpenVINO, the second runtime, can compile a model on this node; the runtime knob reads it."""

    version: str | None = Field(None, max_length=64, description="OpenVINO's version; None: not installed.")
    devices: list[str] = Field(default_factory=list, max_length=16, description="OpenVINO's available devices.")
    unusable_reason: str | None = Field(
        None, max_length=600, description="Why OpenVINO's CPU device cannot be used here; None: it can."
    )

    @property
    def usable(self) -> bool:
        return self.version is not None and self.unusable_reason is None


class HardwareProfile(_Plain):
    """The measured capabilities of one hardware class, cached by ``fingerprint``."""

    schema_version: int = SCHEMA_VERSION
    fingerprint: str = Field(pattern=r"^[0-9a-f]{16}$")
    machine: MachineInfo
    config: BenchConfig = BenchConfig()
    providers_profiled: list[str] = Field(default_factory=list, max_length=32)
    unusable_providers: list[UnusableProvider] = Field(
        default_factory=list,
        max_length=32,
        description="EPs this ONNX Runtime build offers that do not run here (no device visible, a driver mismatch),"
        " with ONNX Runtime's reason; never profiled or searched.",
    )
    openvino: OpenVinoAvailability = Field(
        OpenVinoAvailability(unusable_reason="not probed"),
        description="OpenVINO on this node: offered to the search as a runtime only where it compiles a model.",
    )
    ops: list[OpSupport] = Field(default_factory=list, max_length=512)
    peak_gemm_gflops_fp32: float = Field(ge=0, description="fp32 MatMul n^3, 2n^3 FLOP / best time.")
    peak_gemm_gflops_int8: float = Field(
        ge=0, description="MatMulInteger u8s8 n^3, 2n^3 integer ops / best time (GOP/s)."
    )
    memory_bandwidth_gbps: float = Field(ge=0, description="Add of two large tensors: 3 x bytes / best time.")
    measured_at: AwareDatetime = Field(description="UTC; naive times are rejected so ages compare.")
    duration_s: float = Field(ge=0)

    def support(self, op_type: str, dtype: Dtype, provider: str, variant: str | None = None) -> SupportStatus:
        """Status of ``op_type`` in ``dtype`` on ``provider``.

        With no ``variant`` the best measured variant answers: a transform can pick it.
        Ops that were not measured default to ``native`` on the CPU EP, because it is
        ONNX Runtime's reference provider with a kernel for every standard op (dtypes
        it lacks are emulated, i.e. they still run); on another profiled EP to
        ``fallback``, since ORT then places the node on CPU. A provider that was not
        profiled is ``unsupported``: nothing here vouches for it.
        """
        if provider not in self.providers_profiled:
            return "unsupported"
        found = [
            o.status
            for o in self.ops
            if o.op_type == op_type
            and o.dtype == dtype
            and o.provider == provider
            and (variant is None or o.variant == variant)
        ]
        if found:
            return min(found, key=_RANK.__getitem__)
        return "native" if provider == CPU_PROVIDER else "fallback"

    def unsupported_ops(
        self, op_types: list[str] | set[str], dtype: Dtype, provider: str, variant: str | None = None
    ) -> list[str]:
        """Sorted op types of a model that cannot run at all on ``provider`` in ``dtype``."""
        return sorted({op for op in op_types if self.support(op, dtype, provider, variant) == "unsupported"})

    def summary_rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """Rows of ``SUMMARY_COLUMNS``, sorted by provider, dtype, op, for a table."""
        order = {"fp32": 0, "fp16": 1, "int8": 2}
        ops = sorted(self.ops, key=lambda o: (o.provider, order[o.dtype], o.op_type, o.variant or ""))
        return [
            (
                o.op_type,
                o.dtype,
                o.variant or "",
                o.provider.removesuffix("ExecutionProvider"),
                o.status,
                "" if o.latency_us is None else f"{o.latency_us:.1f}",
            )
            for o in ops
        ]


SUMMARY_COLUMNS = ("op", "dtype", "variant", "provider", "status", "latency_us")
