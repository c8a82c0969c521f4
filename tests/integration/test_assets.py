"""The asset provider: KUBEBUILDER_ASSETS is honoured, and failures say what to do.

Placed with the integration tests because it shells out to Go and pip; it does
not need the session's control plane.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hack.controlplane import assets
from hack.controlplane.errors import AssetError


def _fake_binary(path: Path) -> None:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)


def test_kubebuilder_assets_is_used_when_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("kube-apiserver", "etcd"):
        _fake_binary(tmp_path / name)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found = assets.provide(lambda _: None)
    assert found.source == "KUBEBUILDER_ASSETS"
    assert found.kube_apiserver == tmp_path / "kube-apiserver"
    assert found.kube_controller_manager is None  # optional


def test_incomplete_kubebuilder_assets_is_an_error_naming_the_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_binary(tmp_path / "kube-apiserver")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(AssetError, match=r"lacks executable etcd"):
        assets.provide(lambda _: None)


def test_missing_go_is_an_actionable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(assets, "GO_FALLBACKS", ())
    with pytest.raises(AssetError, match=r"`go` is not on PATH.*KUBEBUILDER_ASSETS"):
        assets.find_go()


def test_failed_build_names_the_step_and_log_and_leaves_no_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METAINFER_CACHE", str(tmp_path / "cache"))
    # A module that cannot exist: resolution fails quickly, before any compile.
    broken = assets.GoBinary(
        name="nothing", module="metainfer.invalid/nothing", version="v0.0.1", package="metainfer.invalid/nothing"
    )
    out = tmp_path / "assets"
    out.mkdir()
    (out / ".nothing.tmp-1").write_text("half a binary from a killed build")
    with pytest.raises(AssetError) as info:
        assets.build(broken, out, lambda _: None)
    message = str(info.value)
    assert message.startswith("resolve modules failed")
    assert str(tmp_path / "cache" / "logs" / "build-nothing-v0.0.1.log") in message
    assert os.listdir(out) == []


def test_kubectl_is_the_pinned_client() -> None:
    import subprocess

    kubectl = assets.find_kubectl(lambda _: None)
    version = subprocess.run([str(kubectl), "version", "--client"], capture_output=True, text=True, check=True)
    minor = assets.KUBERNETES_VERSION.split(".")[1]
    assert f"v1.{minor}." in version.stdout
