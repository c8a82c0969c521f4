"""The inference runtimes' own telemetry, switched off before any of them loads.

Measured with strace on their Linux wheels:

- ONNX Runtime (1.29 on) keeps a device id and an event database under ``~/.cache/Microsoft/DeveloperTools``,
  writes ``$TMPDIR/.ses``, and resolves mobile.events.data.microsoft.com to upload the events;
- ``import openvino`` sends a Google Analytics event through ``openvino_telemetry`` (a forked process resolves and
  posts it; a client id is kept in ``~/intel``), and NNCF sends one per quantization through the same package.

metainfer's pods may talk to nothing but their cluster, and what a user adapts is hers. ONNX Runtime's switch is
its ``ORT_DISABLE_TELEMETRY`` variable, read once when the library loads; children inherit it, and a user who set
it herself keeps her value. ``openvino_telemetry`` has no switch of its own (only a consent file in the home
directory, or the variables that mark a CI job), but OpenVINO and NNCF fall back to their stubs when it cannot be
imported: this process marks it as not importable. Both run when ``metainfer.core`` is imported, which
``metainfer.agent`` and ``metainfer.operator`` do before anything else. A program that imported a runtime before
metainfer has already decided for it: it gets a warning that says so.
"""

from __future__ import annotations

import os
import sys
import warnings

ENV_OPT_OUTS = {"ORT_DISABLE_TELEMETRY": "1"}  # onnxruntime: no uploader, no device id, no event cache
READ_ON_LOAD = {"ORT_DISABLE_TELEMETRY": "onnxruntime"}  # the module whose loading latches each variable
BLOCKED_MODULES = ("openvino_telemetry",)  # what OpenVINO and NNCF send through; each has a stub without it


def opt_out() -> None:
    """Set each opt-out variable not set yet, and make each telemetry module not importable in this process unless
    it is already loaded (then it is too late: whoever imported it first chose)."""
    for name, value in ENV_OPT_OUTS.items():
        if name not in os.environ and READ_ON_LOAD.get(name) in sys.modules:
            _too_late(f"{READ_ON_LOAD[name]} was imported before metainfer and without {name}={value}")
        os.environ.setdefault(name, value)
    for module in BLOCKED_MODULES:
        if sys.modules.get(module) is not None:
            _too_late(f"{module} was imported before metainfer (import metainfer before openvino and nncf)")
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]  # None: "import fails", by the import system's rules


def _too_late(why: str) -> None:
    warnings.warn(f"{why}: its telemetry stays on in this process", RuntimeWarning, stacklevel=3)
