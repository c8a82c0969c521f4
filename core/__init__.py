"""metainfer.core: pure, typed logic (no Kubernetes, no I/O beyond files)."""

from metainfer.core.runtime_telemetry import opt_out as _opt_out_of_runtime_telemetry

# Before any module of metainfer imports ONNX Runtime or NNCF: they read their opt-out once, when they load.
_opt_out_of_runtime_telemetry()
