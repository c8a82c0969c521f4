"""The prepared accelerator check runs to completion on a machine without an accelerator and says so per EP
(issue 29, item 5), so CI keeps the script that a GPU machine will run honest."""

from __future__ import annotations

import json
from pathlib import Path

from bench.device_check import main, providers_to_check


def test_the_device_check_measures_the_cpu_and_names_why_each_accelerator_ep_is_absent(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    args = ["--model", "digits", "--budget-trials", "2", "--time-budget-s", "30", "--quick-profile", "--gemm-n", "128"]
    assert main([*args, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["provider"] for r in rows] == providers_to_check()
    cpu, *accelerators = rows
    assert cpu["usable"] and cpu["gemm_gflops_fp32"] > 0 and cpu["fp32_p95_ms"] > 0 and cpu["recipe"]
    assert cpu["speedup_vs_own_fp32"] > 0 and cpu["serve_max_abs_diff"] is not None
    assert cpu["serve_max_abs_diff"] < 1e-3, "serve answers what the variant computes in process"
    assert accelerators and all(not r["usable"] and r["why_not"].startswith("no device: ") for r in accelerators)
    assert all(r["gemm_gflops_fp32"] is None and r["recipe"] == "" for r in accelerators), "nothing measured on the CPU"
