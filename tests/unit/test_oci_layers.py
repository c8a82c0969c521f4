"""Layers as a build step leaves them (hack/controlplane/oci.py): a step's layer is what it changed, and the
stack of layers unpacked in order gives the tree the step left, removals included."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from hack.controlplane import oci


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every path under ``root`` with its type, mode and contents (a link's target)."""
    found: dict[str, tuple[str, int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            found[str(path.relative_to(root))] = ("link", 0, os.readlink(path))
        elif path.is_dir():
            found[str(path.relative_to(root))] = ("dir", info.st_mode & 0o7777, "")
        else:
            found[str(path.relative_to(root))] = ("file", info.st_mode & 0o7777, path.read_text())
    return found


def _unpack(layer: Path, root: Path) -> None:
    """What a container runtime does with a layer: whiteouts remove what they name in the layers below, the rest
    is extracted over them (a layer never both adds and removes a path)."""
    with tarfile.open(layer) as tar:
        members = tar.getmembers()
        for member in members:
            marker = Path(member.name)
            if marker.name.startswith(oci.WHITEOUT):
                target = root / marker.parent / marker.name[len(oci.WHITEOUT) :]
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        for member in members:
            target = root / member.name
            if not member.isdir() and (target.is_symlink() or target.is_file()):
                target.unlink()
        tar.extractall(root, [m for m in members if not Path(m.name).name.startswith(oci.WHITEOUT)], filter="tar")


@pytest.fixture
def base(tmp_path: Path) -> Path:
    root = tmp_path / "build"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "kept").write_text("kept")
    (root / "etc" / "changed").write_text("before")
    (root / "etc" / "removed").write_text("removed")
    (root / "opt" / "tree" / "deep").mkdir(parents=True)
    (root / "opt" / "tree" / "deep" / "file").write_text("in a removed tree")
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "lib.so").write_text("library")
    return root


def _step(root: Path) -> None:
    """What a RUN does to the tree: add, change, remove a file, remove a tree, replace a file by a link, chmod."""
    (root / "etc" / "changed").write_text("after, and longer")
    (root / "etc" / "removed").unlink()
    (root / "opt" / "venv" / "bin").mkdir(parents=True)
    (root / "opt" / "venv" / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "opt" / "venv" / "bin" / "tool").chmod(0o755)
    for path in sorted((root / "opt" / "tree").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (root / "opt" / "tree").rmdir()
    (root / "usr" / "lib" / "lib.so").unlink()
    (root / "usr" / "lib" / "lib.so").symlink_to("lib.so.1")
    (root / "usr" / "lib" / "lib.so.1").write_text("library 1")


def test_the_base_and_a_steps_layer_unpacked_in_order_give_the_tree_the_step_left(base: Path, tmp_path: Path) -> None:
    oci.write_layer(base, tmp_path / "base.tar")
    before = oci.snapshot(base)
    _step(base)
    oci.write_diff_layer(base, before, tmp_path / "step.tar")

    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    _unpack(tmp_path / "base.tar", unpacked)
    _unpack(tmp_path / "step.tar", unpacked)
    assert _tree(unpacked) == _tree(base)


def test_a_steps_layer_holds_only_what_it_changed_and_one_whiteout_per_removed_tree(base: Path, tmp_path: Path) -> None:
    before = oci.snapshot(base)
    _step(base)
    oci.write_diff_layer(base, before, tmp_path / "step.tar")
    with tarfile.open(tmp_path / "step.tar") as tar:
        names = set(tar.getnames())
    assert "etc/kept" not in names  # unchanged: it stays in the layer below
    assert {"etc/changed", "opt/venv/bin/tool", "usr/lib/lib.so", "usr/lib/lib.so.1"} <= names
    assert {"opt/venv", "opt/venv/bin"} <= names  # the parents of what was added, so the layer unpacks alone
    assert {n for n in names if "/.wh." in n} == {"etc/.wh.removed", "opt/.wh.tree"}


def test_an_unchanged_tree_gives_an_empty_layer_and_the_same_tree_the_same_digest(base: Path, tmp_path: Path) -> None:
    before = oci.snapshot(base)
    oci.write_diff_layer(base, before, tmp_path / "empty.tar")
    with tarfile.open(tmp_path / "empty.tar") as tar:
        assert tar.getnames() == []
    assert oci.write_layer(base, tmp_path / "one.tar") == oci.write_layer(base, tmp_path / "two.tar")


def test_an_archive_lists_its_layers_in_order_with_their_history_and_stores_a_repeated_blob_once(
    base: Path, tmp_path: Path
) -> None:
    oci.write_layer(base, tmp_path / "base.tar")
    before = oci.snapshot(base)
    _step(base)
    oci.write_diff_layer(base, before, tmp_path / "step.tar")
    layers = [tmp_path / "base.tar", tmp_path / "step.tar", tmp_path / "base.tar"]
    archive = tmp_path / "image.oci.tar"
    digest = oci.write_archive(archive, "metainfer.local/probe:1", layers, oci.ImageConfig(), history=["a", "b", "c"])
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["digest"] == digest
        manifest = json.load(tar.extractfile("blobs/sha256/" + digest.split(":")[1]))  # type: ignore[arg-type]
        config = json.load(tar.extractfile("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))  # type: ignore[arg-type]
        blobs = [n for n in tar.getnames() if n.startswith("blobs/")]
    layer_digests = [layer["digest"] for layer in manifest["layers"]]
    assert config["rootfs"]["diff_ids"] == layer_digests and layer_digests[0] == layer_digests[2] != layer_digests[1]
    assert [h["created_by"] for h in config["history"]] == ["a", "b", "c"]
    assert len(blobs) == 4  # config, manifest and two distinct layers
    with pytest.raises(ValueError, match="2 history entries for 3 layers"):
        oci.write_archive(archive, "metainfer.local/probe:1", layers, oci.ImageConfig(), history=["a", "b"])


def test_the_archives_manifest_reads_back_as_written_and_a_missing_blob_is_named(base: Path, tmp_path: Path) -> None:
    oci.write_layer(base, tmp_path / "base.tar")
    archive = tmp_path / "image.oci.tar"
    digest = oci.write_archive(archive, "metainfer.local/probe:1", [tmp_path / "base.tar"], oci.ImageConfig())
    with tarfile.open(archive) as tar:
        manifest = oci.read_manifest(tar)
        names = tar.getnames()
    assert manifest.digest == digest and oci.blob_name(digest) in names
    assert manifest.blob_digests == [manifest.config["digest"], manifest.layers[0]["digest"]]
    assert all(oci.blob_name(d) in names for d in manifest.blob_digests)
    broken = tmp_path / "broken.oci.tar"
    with tarfile.open(archive) as source, tarfile.open(broken, "w") as out:
        for info in source.getmembers():
            if info.name != oci.blob_name(digest):
                out.addfile(info, source.extractfile(info) if info.isfile() else None)
    with tarfile.open(broken) as tar, pytest.raises(oci.ArchiveError, match=digest.split(":")[1]):
        oci.read_manifest(tar)
