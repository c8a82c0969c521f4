"""No process of metainfer lets ONNX Runtime, OpenVINO or NNCF send telemetry: a pod may talk to nothing but its
cluster.

The telemetry shows in what it leaves on disk: ONNX Runtime's device id and event database under
``$HOME/.cache/Microsoft`` and ``$TMPDIR/.ses``, OpenVINO's client id under ``$HOME/intel`` (the same switches stop
their uploads: measured with strace, not here, where no test may try to reach the internet). Each case runs a fresh
interpreter with its own HOME and TMPDIR and without the opt-out variables this one has (it imported metainfer).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from metainfer.core.runtime_telemetry import ENV_OPT_OUTS

ONE_SESSION = """
import numpy as np, onnx.helper as h, onnxruntime as ort
graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", 1, [1, 4])],
                     [h.make_tensor_value_info("y", 1, [1, 4])])
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
session.run(None, {"x": np.ones((1, 4), np.float32)})
"""


def _files_left(code: str, home: Path) -> list[str]:
    """Run ``code`` with HOME and TMPDIR in ``home`` and no opt-out set; the files it left there."""
    (home / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ENV_OPT_OUTS and k != "PYTHONPATH"}
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), PYTHONSAFEPATH="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=home, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


@pytest.mark.parametrize("first", ["metainfer.agent.cli", "metainfer.agent.serve.model", "metainfer.operator"])
def test_importing_metainfer_first_switches_onnx_runtimes_telemetry_off(tmp_path: Path, first: str) -> None:
    """Without the switch the same script leaves ``.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,
    onnxruntime.db}`` and ``tmp/.ses`` (onnxruntime 1.32)."""
    assert _files_left(f"import {first}\n{ONE_SESSION}", tmp_path) == []


def test_importing_metainfer_first_keeps_openvino_and_nncf_from_sending(tmp_path: Path) -> None:
    """Without the switch ``import openvino`` alone writes ``intel/openvino_ga_cid`` and forks a process to post an
    event; NNCF would post one per quantization."""
    code = (
        "import metainfer.agent.cli, openvino, nncf.telemetry.wrapper as nncf_telemetry\n"
        "import openvino.tools.ovc.telemetry_utils as ovc_telemetry\n"
        "assert ovc_telemetry.tm.__name__ == 'openvino.tools.ovc.telemetry_stub', ovc_telemetry.tm\n"
        "assert type(nncf_telemetry.telemetry).__name__ != 'NNCFTelemetry', nncf_telemetry.telemetry\n"
    )
    assert _files_left(code, tmp_path) == []
