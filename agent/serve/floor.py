"""serve's own memory floor in this image: a fresh process with serve's modules and runtimes loaded, no model.

The adaptation Job measures it (core.control.memory_bound): a class's serving container limit, less this floor
and the data plane's buffers, is what a variant may take. Measured in a child process from the same interpreter,
so it is this image's libraries, allocator and runtimes, not a number written down somewhere: ONNX Runtime with
one session made (its thread pools and allocator exist from the first session on), and OpenVINO when the image
has it (a variant may run on it).
"""

from __future__ import annotations

import subprocess
import sys

from metainfer.core.engine.errors import MetainferError

_CHILD = """
import importlib.util
import onnx
from onnx import TensorProto, helper
import onnxruntime
import metainfer.agent.serve.command  # everything serve imports before it loads a model
import metainfer.agent.serve.grpc_server  # its gRPC front end, imported when it starts
import metainfer.core.engine.transforms  # a pod without a variant store rebuilds the variant
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8  # opset 13's; the onnx package's newest (14) is past what older ONNX Runtime images load
session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
if importlib.util.find_spec("openvino") is not None:
    import openvino
    openvino.Core()
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) / 1024)
"""
TIMEOUT_S = 120


class FloorUnmeasured(MetainferError):
    """serve's floor could not be measured in this image."""


def serve_floor_mib() -> float:
    """The peak resident memory of a process that loaded what serve loads before its model, MiB."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise FloorUnmeasured(f"measuring serve's memory floor took over {TIMEOUT_S} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise FloorUnmeasured(f"measuring serve's memory floor failed: {done.stderr.strip()[-300:]}")
    return float(lines[-1])
