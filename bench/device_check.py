"""A prepared accelerator check: one table of what each execution provider here does for metainfer (issue 29, item 5).

Run it on a machine with an accelerator, in the Python environment of that accelerator's image (the CUDA flavour
installs onnxruntime-gpu): ``make device-check``, or ``python bench/device_check.py --out FILE``. For the CPU and
each accelerator EP that ONNX Runtime knows (TensorRT, CUDA, MIGraphX, ROCm, OpenVINO, CANN) it reports:

* whether a session on it really runs there, or ONNX Runtime's reason why not (core.engine.runtime);
* peak GEMM throughput on it, fp32 and fp16 (a MatMul of n x n, best of the timed runs);
* the example model's FP32 p95 at batch 1 on it;
* a short adaptation restricted to it (``--budget-trials``, ``--time-budget-s``): the recipe chosen, its p95 and
  its speedup over CPU FP32 and over the EP's own FP32;
* a ``metainfer serve`` round trip of that variant: the largest difference between the served outputs and the
  variant's run in this process;
* peak device memory, from NVML where ``pynvml`` is installed (the GPU's, not this process's RSS).

On a machine without an accelerator it runs to completion: the accelerator EPs get a "no device" row with the
reason, so CI keeps the script honest (tests/unit/test_device_check.py). Nothing is assumed: every number is
measured here, with warm-up and repeated runs, seeds fixed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from metainfer.agent.profiles import FAST_BENCH
from metainfer.agent.zoo import build_examples
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.evaluate import MeasureSettings, measure_latency
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import load_or_measure
from metainfer.core.engine.profile.measure import measure_profile
from metainfer.core.engine.recipe import Recipe, SessionSpec
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.runtime import (
    ACCELERATOR_PROVIDERS,
    CPU_PROVIDER,
    available_providers,
    create_session,
    provider_usability,
)
from metainfer.core.engine.scoring import Constraints

QUICK = MeasureSettings(warmup_runs=3, round_runs=10, min_runs=20, max_runs=200, max_seconds=2.0)


@dataclass
class Row:
    provider: str
    usable: bool
    why_not: str = ""
    gemm_gflops_fp32: float | None = None
    gemm_gflops_fp16: float | None = None
    fp32_p95_ms: float | None = None
    recipe: str = ""
    adapted_p95_ms: float | None = None
    speedup_vs_cpu_fp32: float | None = None
    speedup_vs_own_fp32: float | None = None
    serve_max_abs_diff: float | None = None
    device_memory_mib: float | None = None
    notes: list[str] = field(default_factory=list)


def providers_to_check() -> list[str]:
    """The CPU, then every accelerator EP ONNX Runtime may offer, in the vendors' order."""
    accelerators = [p for eps in ACCELERATOR_PROVIDERS.values() for p in eps]
    return [CPU_PROVIDER, *accelerators]


def gemm_gflops(provider: str, dtype: int, n: int, runs: int = 10) -> float:
    """2n^3 / the best of ``runs`` timed runs of an n x n MatMul on ``provider`` (after 3 warm-up runs)."""
    a = helper.make_tensor_value_info("a", dtype, [n, n])
    b = helper.make_tensor_value_info("b", dtype, [n, n])
    c = helper.make_tensor_value_info("c", dtype, [n, n])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 9)
    session = create_session(model.SerializeToString(), Recipe(session=SessionSpec(execution_provider=provider)))
    numpy_type = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((n, n)).astype(numpy_type) for name in ("a", "b")}
    for _ in range(3):
        session.run(None, feeds)
    best = min(_timed(lambda: session.run(None, feeds)) for _ in range(runs))
    return 2 * n**3 / best / 1e9


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def device_memory_mib() -> float | None:
    """Memory in use on GPU 0 (NVML), None where there is no NVML."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / (1 << 20)
    except Exception:  # no driver, no device
        return None


def check_provider(
    provider: str,
    why_not: str | None,
    base: bytes,
    data: Dataset,
    cpu_fp32_p95: float | None,
    workdir: Path,
    args: argparse.Namespace,
) -> Row:
    if why_not is not None:
        return Row(provider, usable=False, why_not=f"no device: {why_not}")
    row = Row(provider, usable=True)
    gemm_n = args.gemm_n if provider != CPU_PROVIDER else min(args.gemm_n, 512)
    row.gemm_gflops_fp32 = gemm_gflops(provider, TensorProto.FLOAT, gemm_n)
    if provider == CPU_PROVIDER:
        row.notes.append("fp16 GEMM not timed on the CPU")
    else:
        try:
            row.gemm_gflops_fp16 = gemm_gflops(provider, TensorProto.FLOAT16, gemm_n)
        except Exception as exc:  # an EP without fp16 MatMul says so here
            row.notes.append(f"fp16 GEMM: {type(exc).__name__}: {str(exc)[:200]}")
    fp32 = Recipe(session=SessionSpec(execution_provider=provider), batch=1)
    row.fp32_p95_ms = measure_latency(create_session(base, fp32), data, 1, QUICK).p95_ms
    settings = AdaptSettings(
        batch=1,
        constraints=Constraints(slo_p95_ms=args.slo_p95_ms, max_quality_drop=args.max_quality_drop),
        budget_trials=args.budget_trials,
        time_budget_s=args.time_budget_s,
        seed=0,
        overrides={"execution_provider": [provider]},
    )
    report, variant = Adaptation(base, inspect_model(args.model_path), data, args.profile, settings).run()
    best = report.best
    if best is None or best.metrics is None or variant is None:
        row.notes.append("no candidate met the SLO and the quality budget")
        return row
    row.recipe = best.recipe.describe()
    row.adapted_p95_ms = best.metrics.latency.p95_ms
    if cpu_fp32_p95 and row.adapted_p95_ms:
        row.speedup_vs_cpu_fp32 = cpu_fp32_p95 / row.adapted_p95_ms
    if row.fp32_p95_ms and row.adapted_p95_ms:
        row.speedup_vs_own_fp32 = row.fp32_p95_ms / row.adapted_p95_ms
    row.serve_max_abs_diff = serve_round_trip(args.model_path, best.recipe, variant, data, workdir / provider)
    row.device_memory_mib = device_memory_mib() if provider != CPU_PROVIDER else None
    return row


def serve_round_trip(model_path: Path, recipe: Recipe, variant: bytes, data: Dataset, workdir: Path) -> float:
    """Serve ``variant`` with ``metainfer serve``, send one sample, and return the largest |served - in-process|."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "variant.onnx").write_bytes(variant)
    (workdir / "recipe.json").write_text(recipe.model_dump_json())
    port = _free_port()
    command = [
        sys.executable, "-m", "metainfer.agent.cli", "serve", "--model-uri", model_path.resolve().as_uri(),
        "--recipe", str(workdir / "recipe.json"), "--variant", str(workdir / "variant.onnx"),
        "--port", str(port), "--grpc-port", "0", "--model-name", "check",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(port, server)
        sample = data.batch(0, 1)
        body = {
            "inputs": [
                {"name": k, "shape": list(v.shape), "datatype": _datatype(v), "data": v.ravel().tolist()}
                for k, v in sample.items()
            ]
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/models/check/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            served = json.loads(response.read())["outputs"]
        expected = create_session(variant, recipe).run(None, sample)
        return max(
            float(np.max(np.abs(np.asarray(out["data"], dtype=np.float64) - np.ravel(want).astype(np.float64))))
            for out, want in zip(served, expected, strict=True)
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _datatype(array: np.ndarray) -> str:
    return {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}[str(array.dtype)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, server: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"metainfer serve exited {server.returncode}: {(server.stderr or '').read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"metainfer serve was not ready after {timeout_s:.0f} s")


def render(rows: Sequence[Row]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        "| provider | usable | GEMM fp32 GFLOP/s | GEMM fp16 GFLOP/s | FP32 p95 ms | recipe | p95 ms |"
        " vs CPU FP32 | vs own FP32 | serve max abs diff | device MiB | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = "; ".join([r.why_not, *r.notes]).strip("; ")
        lines.append(
            f"| {r.provider} | {'yes' if r.usable else 'no'} | {num(r.gemm_gflops_fp32, '.1f')} |"
            f" {num(r.gemm_gflops_fp16, '.1f')} | {num(r.fp32_p95_ms, '.2f')} | {r.recipe or '-'} |"
            f" {num(r.adapted_p95_ms, '.2f')} | {num(r.speedup_vs_cpu_fp32, '.2f')} |"
            f" {num(r.speedup_vs_own_fp32, '.2f')} | {num(r.serve_max_abs_diff, '.2e')} |"
            f" {num(r.device_memory_mib, '.0f')} | {notes.replace('|', '/')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_mini", help="bundled example to adapt (default bert_mini)")
    parser.add_argument("--budget-trials", type=int, default=8)
    parser.add_argument("--time-budget-s", type=float, default=120.0)
    parser.add_argument("--slo-p95-ms", type=float, default=1000.0)
    parser.add_argument("--max-quality-drop", type=float, default=0.01)
    parser.add_argument("--gemm-n", type=int, default=2048, help="GEMM size on accelerators (512 on the CPU)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument(
        "--quick-profile", action="store_true",
        help="a tiny hardware profile instead of the cached full one (seconds; for CI's check of this script)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metainfer-device-check-") as tmp:
        workdir = Path(tmp)
        example = build_examples(workdir / "examples", [args.model])[args.model]
        args.model_path = example.model_path
        info = inspect_model(example.model_path)
        data = load_npz(example.data_path, info)
        base = example.model_path.read_bytes()
        args.profile = measure_profile(FAST_BENCH) if args.quick_profile else load_or_measure()
        usability = provider_usability(providers_to_check())
        rows: list[Row] = []
        cpu_fp32: float | None = None
        for provider in providers_to_check():
            row = check_provider(provider, usability[provider], base, data, cpu_fp32, workdir, args)
            if provider == CPU_PROVIDER:
                cpu_fp32 = row.fp32_p95_ms
                row.speedup_vs_cpu_fp32 = row.speedup_vs_own_fp32
            rows.append(row)
            print(f"{provider}: {'checked' if row.usable else row.why_not}", file=sys.stderr, flush=True)
    offered = ", ".join(available_providers())
    print(f"ONNX Runtime offers: {offered}; model {args.model}, batch 1, budget {args.budget_trials} trials\n")
    print(render(rows))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
