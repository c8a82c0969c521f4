"""Hardware profile: real ONNX Runtime on tiny sizes, so the whole file takes a few seconds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from metainfer.core.engine.profile import (
    BenchConfig,
    HardwareProfile,
    OpSupport,
    detect_machine,
    fingerprint,
    int8_variant,
    load_cached,
    load_or_measure,
    measure_profile,
    save,
)
from metainfer.core.engine.profile.cache import cache_path
from metainfer.core.engine.profile.fingerprint import relevant_flags
from metainfer.core.engine.profile.microbench import classify, compute_providers, kernel_us_per_run

CPU = "CPUExecutionProvider"
SMALL = BenchConfig(
    op_warmup=1,
    op_runs=2,
    gemm_n=128,
    gemm_repeats=2,
    gemm_min_seconds=0,
    bandwidth_mib=4,
    bandwidth_repeats=2,
    providers=[CPU],
)
TINY = SMALL.model_copy(update={"op_types": ["MatMul"]})
FLOAT_OPS = [
    "MatMul",
    "Gemm",
    "Conv",
    "Softmax",
    "LayerNormalization",
    "Gelu",
    "Erf",
    "Attention",
    "MatMulNBits",
]
INT8_OPS = ["MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "Cast"]


@pytest.fixture(scope="module")
def profile() -> HardwareProfile:
    steps: list[tuple[int, int, str]] = []
    result = measure_profile(SMALL, on_step=lambda d, t, label: steps.append((d, t, label)))
    assert steps and steps[-1][0] == steps[-1][1], "progress must end at total"
    assert [d for d, _, _ in steps] == list(range(1, len(steps) + 1))
    return result


def _entry(p: HardwareProfile, op: str, dtype: str, variant: str | None = None) -> OpSupport:
    return next(o for o in p.ops if (o.op_type, o.dtype, o.variant, o.provider) == (op, dtype, variant, CPU))


def test_fingerprint_is_stable_and_covers_identity() -> None:
    m = detect_machine()
    fp = fingerprint(m)
    assert fp == fingerprint(detect_machine())
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fingerprint(m.model_copy(update={"cpu_flags": list(reversed(m.cpu_flags))})) == fp
    assert fingerprint(m.model_copy(update={"total_memory_bytes": 1})) == fp
    assert fingerprint(m.model_copy(update={"onnxruntime_version": "0.0.1"})) != fp
    assert fingerprint(m.model_copy(update={"execution_providers": ["CUDAExecutionProvider", CPU]})) != fp


def test_relevant_flags_keeps_inference_isa_only() -> None:
    assert relevant_flags("fpu sse4_2 avx2 avx512f avx512_vnni amx_int8 rdrand") == [
        "amx_int8", "avx2", "avx512_vnni", "avx512f", "sse4_2",
    ]  # fmt: skip
    assert relevant_flags("fp asimd asimddp asimdhp i8mm sve crc32") == [
        "dotprod",
        "fp16",
        "i8mm",
        "neon",
        "sve",
    ]


def test_every_listed_op_runs_natively_in_fp32_on_cpu(profile: HardwareProfile) -> None:
    for op in FLOAT_OPS:
        entry = _entry(profile, op, "fp32", "q4" if op == "MatMulNBits" else None)
        assert entry.status == "native", (op, entry.detail)
        assert entry.latency_us is not None and entry.latency_us >= 0
    assert _entry(profile, "Cast", "fp32").status == "native"


def test_int8_ops_run_natively_in_the_default_u8s8_format(profile: HardwareProfile) -> None:
    measured = {o.op_type for o in profile.ops if o.dtype == "int8" and o.provider == CPU}
    assert set(INT8_OPS) <= measured
    for op in ("MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul"):
        assert _entry(profile, op, "int8", "u8s8").status == "native", op
    assert _entry(profile, "DynamicQuantizeLinear", "int8", "u8").status == "native"
    for op in ("QuantizeLinear", "DequantizeLinear"):
        assert _entry(profile, op, "int8", "u8").status == _entry(profile, op, "int8", "s8").status == "native"
    assert _entry(profile, "Cast", "int8").status == "native"


def test_each_timed_op_keeps_its_fastest_run_beside_its_median(profile: HardwareProfile) -> None:
    timed = [o for o in profile.ops if o.latency_us is not None]
    assert timed
    for op in timed:
        assert op.best_us is not None and 0 < op.best_us <= op.latency_us, op


def test_fp16_without_cpu_kernel_is_fallback_not_native(profile: HardwareProfile) -> None:
    # Measured on ORT 1.32: the CPU EP has no fp16 MatMul; ORT wraps it in Casts and runs fp32.
    entry = _entry(profile, "MatMul", "fp16")
    assert entry.status == "fallback"
    assert "inserted Casts" in (entry.detail or "")


def test_known_unsupported_combination_is_unsupported(profile: HardwareProfile) -> None:
    # Measured: QLinearConv with int8 activations and uint8 weights has no CPU kernel.
    entry = _entry(profile, "QLinearConv", "int8", "s8u8")
    assert entry.status == "unsupported"
    assert entry.latency_us is None
    assert "QLinearConv" in (entry.detail or "") and "\n" not in (entry.detail or "")


def test_peak_numbers_are_positive(profile: HardwareProfile) -> None:
    assert profile.peak_gemm_gflops_fp32 > 0
    assert profile.peak_gemm_gflops_int8 > 0
    assert profile.memory_bandwidth_gbps > 0
    assert profile.duration_s > 0
    assert profile.providers_profiled == [CPU]


def test_json_round_trip(profile: HardwareProfile) -> None:
    again = HardwareProfile.model_validate_json(profile.model_dump_json())
    assert again == profile
    assert json.loads(again.model_dump_json())["fingerprint"] == profile.fingerprint


def test_support_and_unsupported_ops(profile: HardwareProfile) -> None:
    s8u8 = int8_variant("int8", "uint8")
    assert s8u8 == "s8u8"
    assert profile.support("QLinearConv", "int8", CPU, s8u8) == "unsupported"
    assert profile.support("QLinearConv", "int8", CPU) == "native"  # best variant answers
    assert profile.support("NotMeasuredOp", "fp32", CPU) == "native"  # CPU default
    assert profile.support("MatMul", "fp32", "CUDAExecutionProvider") == "unsupported"  # not profiled
    ops = ["Conv", "QLinearConv", "Relu", "QLinearConv"]
    assert profile.unsupported_ops(ops, "int8", CPU, s8u8) == ["QLinearConv"]
    assert profile.unsupported_ops(ops, "int8", CPU, "u8s8") == []
    assert profile.unsupported_ops(ops, "fp32", "CUDAExecutionProvider") == ["Conv", "QLinearConv", "Relu"]
    gpu = profile.model_copy(update={"providers_profiled": [CPU, "CUDAExecutionProvider"]})
    assert gpu.support("Relu", "fp16", "CUDAExecutionProvider") == "fallback"  # unknown on a non-CPU EP


def test_summary_rows(profile: HardwareProfile) -> None:
    rows = profile.summary_rows()
    assert len(rows) == len(profile.ops)
    assert ("QLinearConv", "int8", "s8u8", "CPU", "unsupported", "") in rows
    assert all(len(r) == 6 for r in rows)


def test_schema_is_crd_friendly() -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "array":
                assert "maxItems" in node, node
            assert not isinstance(node.get("additionalProperties"), dict), node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(HardwareProfile.model_json_schema())


def test_classify_sees_cpu_placement_on_another_ep() -> None:
    def node(name: str, op: str, provider: str, ts: int) -> dict[str, object]:
        args = {"op_name": op, "provider": provider}
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": 5, "args": args}

    cuda = "CUDAExecutionProvider"
    events = [
        node("mm", "MatMul", cuda, 10),
        node("sm", "Softmax", CPU, 20),
        node("cp", "MemcpyToHost", CPU, 30),
    ]
    status, detail = classify(events, "MatMul", "fp16", cuda)
    assert status == "fallback" and "Softmax" in (detail or "") and "Memcpy" not in (detail or "")
    assert classify(events[:1], "MatMul", "fp16", cuda) == ("native", None)
    runs = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 15},
        {"name": "model_run", "ts": 18, "dur": 20},
    ]
    assert kernel_us_per_run(events + runs, skip=0) == [5.0, 10.0]
    assert kernel_us_per_run(events + runs, skip=1) == [10.0]


def test_non_compute_providers_are_not_profiled() -> None:
    assert compute_providers(["AzureExecutionProvider", CPU]) == [CPU]
    assert compute_providers(["CUDAExecutionProvider", CPU], wanted=[CPU]) == [CPU]


def test_cache_miss_then_hit(tmp_path: Path) -> None:
    calls: list[int] = []
    first = load_or_measure(tmp_path, config=TINY, on_step=lambda d, t, label: calls.append(d))
    assert calls, "a miss measures"
    assert cache_path(tmp_path, first.fingerprint).is_file()
    calls.clear()
    second = load_or_measure(tmp_path, config=TINY, on_step=lambda d, t, label: calls.append(d))
    assert not calls and second == first
    # another config is another measurement, not this one
    assert load_cached(first.fingerprint, tmp_path, config=SMALL) is None
    refreshed = load_or_measure(tmp_path, config=TINY, refresh=True)
    assert refreshed.measured_at > first.measured_at


def test_cache_freshness(tmp_path: Path) -> None:
    profile = measure_profile(TINY)
    save(profile, tmp_path)
    fp = profile.fingerprint
    assert load_cached(fp, tmp_path, max_age_s=60) == profile
    later = datetime.now(UTC) + timedelta(hours=2)
    assert load_cached(fp, tmp_path, max_age_s=3600, now=later) is None
    assert load_cached(fp, tmp_path, max_age_s=None, now=later) == profile
    naive = json.loads(profile.model_dump_json())
    naive["measured_at"] = profile.measured_at.replace(tzinfo=None).isoformat()
    cache_path(tmp_path, fp).write_text(json.dumps(naive))
    assert load_cached(fp, tmp_path) is None  # an age that cannot be compared is no cache hit


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"fingerprint": "x"}', b"\xff\xfe\x00"])
def test_corrupt_cache_is_remeasured_not_a_crash(tmp_path: Path, content: bytes) -> None:
    fp = fingerprint(detect_machine())
    path = cache_path(tmp_path, fp)
    path.write_bytes(content)
    assert load_cached(fp, tmp_path) is None
    profile = load_or_measure(tmp_path, config=TINY)
    assert profile.fingerprint == fp
    assert HardwareProfile.model_validate_json(path.read_bytes()) == profile


def test_cache_for_another_machine_is_ignored(tmp_path: Path) -> None:
    profile = measure_profile(TINY)
    other = "0" * 16 if profile.fingerprint != "0" * 16 else "1" * 16
    cache_path(tmp_path, other).write_text(profile.model_dump_json())
    assert load_cached(other, tmp_path) is None


def test_probe_models_are_deterministic() -> None:
    import numpy as np

    from metainfer.core.engine.profile.opcases import op_cases

    for case in op_cases():
        a = case.build(np.random.default_rng(0))[0].SerializeToString()
        b = case.build(np.random.default_rng(0))[0].SerializeToString()
        assert a == b, case
