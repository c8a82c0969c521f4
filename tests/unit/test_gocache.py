"""Dropping Go's caches after `make assets`: the pause image is built first, both caches go, the bytes are counted."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hack.controlplane import assets, gocache, pause


def test_both_go_caches_are_dropped_after_the_pause_image_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METAINFER_CACHE", str(tmp_path))
    (tmp_path / "go" / "build" / "ab").mkdir(parents=True)
    (tmp_path / "go" / "build" / "ab" / "obj-d").write_bytes(b"x" * 1000)
    module = tmp_path / "go" / "mod" / "k8s.io" / "api@v0.35.0"
    module.mkdir(parents=True)
    (module / "go.mod").write_bytes(b"y" * 24)
    binary = tmp_path / "assets" / "kube-apiserver"
    binary.parent.mkdir()
    binary.write_bytes(b"elf")
    order: list[str] = []
    monkeypatch.setattr(pause, "archive", lambda log: order.append("pause") or tmp_path / "pause.tar")
    monkeypatch.setattr(gocache.shutil, "which", lambda name: None)  # no go: removed by hand

    assert gocache.trim(lambda message: order.append(message)) == 1024
    assert order[0] == "pause" and "Go's build and module caches" in order[1]
    assert not (tmp_path / "go" / "build").exists() and not (tmp_path / "go" / "mod").exists()
    assert binary.read_bytes() == b"elf"  # the tools themselves stay
    assert gocache.trim(lambda message: order.append(message)) == 0 and order[2:] == ["pause"]  # nothing to say


def test_a_trim_waits_for_one_already_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both lanes of `make test` run `make assets`: the second trim must not drop the caches under the first."""
    monkeypatch.setenv("METAINFER_CACHE", str(tmp_path))
    calls: list[str] = []
    monkeypatch.setattr(pause, "archive", lambda log: calls.append("pause") or tmp_path / "pause.tar")
    monkeypatch.setattr(gocache.shutil, "which", lambda name: None)
    with assets.lock(tmp_path / "go-trim.lock"):
        trimming = threading.Thread(target=gocache.trim, args=(lambda message: None,))
        trimming.start()
        trimming.join(timeout=0.5)
        assert trimming.is_alive() and calls == []  # held back while the other trim runs
    trimming.join(timeout=10)
    assert not trimming.is_alive() and calls == ["pause"]
