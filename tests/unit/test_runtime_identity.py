"""Which runtime build an image runs (core.engine.runtime_identity), read from the installed distribution's metadata:
the run key includes it and the operator, which never loads a model, reads it too, so reading it must not import
ONNX Runtime."""

from __future__ import annotations


def test_the_runtime_is_read_from_the_installed_distribution_without_importing_onnxruntime() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from metainfer.core.engine.runtime_identity import runtime_identity as r; "
        "print(r()); print('onnxruntime' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import onnxruntime

    assert out[-1] == "False" and f"onnxruntime {onnxruntime.__version__}" in " ".join(out[:-1])
