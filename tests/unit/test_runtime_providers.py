"""No silent fall back to the CPU (issue 29, item 3): a session gets the EP its recipe names or fails saying why,
and an accelerator class whose EPs cannot run on its node is refused, not adapted on the CPU."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from metainfer.core.engine.errors import FailureReason, ProviderUnavailable
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import (
    CPU_PROVIDER,
    create_session,
    provider_usability,
    require_accelerator,
)

CUDA = Recipe.model_validate({"session": {"execution_provider": "CUDAExecutionProvider"}})


def test_a_session_on_an_ep_this_build_lacks_is_refused_with_the_reason(
    digits: tuple[bytes, ModelInfo, object],
) -> None:
    base = digits[0]
    assert create_session(base, Recipe()).get_providers() == [CPU_PROVIDER]
    with pytest.raises(ProviderUnavailable) as refused:
        create_session(base, CUDA)  # ONNX Runtime alone would run it on the CPU with a warning
    assert (
        refused.value.provider == "CUDAExecutionProvider" and refused.value.reason == FailureReason.PROVIDER_UNAVAILABLE
    )
    assert f"this ONNX Runtime build ({ort.__version__}) has no CUDAExecutionProvider" in str(refused.value)


def test_an_ep_that_is_built_in_but_falls_back_is_refused_with_what_onnx_runtime_said(
    digits: tuple[bytes, ModelInfo, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA build on a node without a visible GPU lists CUDA as available and still runs on the CPU."""
    real = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real])
    with pytest.raises(ProviderUnavailable, match=r"ran the session on CPUExecutionProvider instead: .*CUDAExecution"):
        create_session(digits[0], CUDA)


def test_usability_is_measured_per_ep_and_bounded() -> None:
    usability = provider_usability([CPU_PROVIDER, "CUDAExecutionProvider", "TensorrtExecutionProvider"])
    assert usability[CPU_PROVIDER] is None
    assert all(why and len(why) <= 600 for p, why in usability.items() if p != CPU_PROVIDER)


def test_an_accelerator_class_needs_one_of_its_vendors_eps_usable_and_a_cpu_class_none() -> None:
    require_accelerator("cpu", {CPU_PROVIDER: None})
    require_accelerator("nvidia", {"CUDAExecutionProvider": None, "TensorrtExecutionProvider": "no libnvinfer"})
    with pytest.raises(ProviderUnavailable) as refused:
        require_accelerator("nvidia", {CPU_PROVIDER: None, "CUDAExecutionProvider": "no device visible"})
    message = str(refused.value)
    assert "TensorrtExecutionProvider or CUDAExecutionProvider" in message
    assert "CUDAExecutionProvider: no device visible" in message and "has no TensorrtExecutionProvider" in message
    with pytest.raises(ProviderUnavailable, match="a amd class needs one of them"):
        require_accelerator("amd", provider_usability([CPU_PROVIDER]))


def test_a_reason_keeps_onnx_runtimes_words_without_colour_codes_timestamps_or_throw_sites() -> None:
    from metainfer.core.engine.runtime import _bounded, _essence

    line = (
        "\x1b[1;31m2026-12-03 23:43:30.982171260 [E:onnxruntime:Default, provider_bridge_ort.cc:2430 operator()] "
        "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& "
        "onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library "
        "/opt/metainfer/lib/libonnxruntime_providers_cuda.so with error: libcuda.so.1: cannot open shared object "
        "file: No such file or directory\x1b[m"
    )
    assert _essence(line) == (
        "Failed to load library /opt/metainfer/lib/libonnxruntime_providers_cuda.so with error: libcuda.so.1: "
        "cannot open shared object file: No such file or directory"
    )
    assert "\x1b" not in _bounded("\x1b[0;93mwarning\x1b[m" * 200) and len(_bounded("x" * 5000)) == 600
