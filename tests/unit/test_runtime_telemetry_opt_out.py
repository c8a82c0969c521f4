"""The runtimes' telemetry opt-outs: set unless the user set them herself, and the senders not importable."""

from __future__ import annotations

import os
import sys

import pytest

from metainfer.core import runtime_telemetry


def test_every_opt_out_is_set_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "onnxruntime", raising=False)  # as before anything imported it
    for name in runtime_telemetry.ENV_OPT_OUTS:
        monkeypatch.delenv(name, raising=False)
    runtime_telemetry.opt_out()
    assert {name: os.environ[name] for name in runtime_telemetry.ENV_OPT_OUTS} == runtime_telemetry.ENV_OPT_OUTS


def test_a_value_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    runtime_telemetry.opt_out()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "0"


def test_a_telemetry_sender_cannot_be_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "openvino_telemetry", raising=False)
    runtime_telemetry.opt_out()
    with pytest.raises(ImportError):
        import openvino_telemetry  # noqa: F401


def test_importing_metainfer_core_has_switched_them_off() -> None:
    assert all(os.environ.get(name) for name in runtime_telemetry.ENV_OPT_OUTS)
    assert all(sys.modules.get(module, "absent") is None for module in runtime_telemetry.BLOCKED_MODULES)


def test_a_runtime_imported_before_metainfer_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime  # noqa: F401  # loaded in this process: as a program that imported it before metainfer

    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    with pytest.warns(RuntimeWarning, match="onnxruntime was imported before metainfer"):
        runtime_telemetry.opt_out()


def test_a_sender_imported_before_metainfer_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino_telemetry", sys)  # any loaded module
    with pytest.warns(RuntimeWarning, match="openvino_telemetry was imported before metainfer"):
        runtime_telemetry.opt_out()
