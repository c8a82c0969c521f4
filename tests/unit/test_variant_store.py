"""The content-addressed variant store: a file is what its name says, or it is not used."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from metainfer.agent import variant_store


def test_a_variant_is_stored_under_its_sha256_and_read_back(tmp_path: Path) -> None:
    data = b"onnx bytes" * 1000
    sha256, path = variant_store.put(tmp_path, data)
    assert sha256 == hashlib.sha256(data).hexdigest()
    assert path == tmp_path / "sha256" / f"{sha256}.onnx" and path.read_bytes() == data
    assert variant_store.get(tmp_path, sha256) == data
    assert variant_store.put(tmp_path, data) == (sha256, path)  # a second Job with the same variant: a no-op
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file is left behind"


def test_a_corrupt_or_absent_file_is_not_used(tmp_path: Path) -> None:
    sha256, path = variant_store.put(tmp_path, b"the validated bytes")
    os.chmod(path, 0o644)
    path.write_bytes(b"the validated bytez")  # bit rot, or someone else's bytes under this name
    assert variant_store.get(tmp_path, sha256) is None
    assert variant_store.get(tmp_path, "0" * 64) is None
    assert variant_store.put(tmp_path, b"the validated bytes")[1].read_bytes() == b"the validated bytes"  # repaired


@pytest.mark.parametrize("name", ["../../etc/passwd", "A" * 64, "abc", "0" * 63 + "/"])
def test_names_that_are_not_sha256_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="sha256"):
        variant_store.get(tmp_path, name)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_store_that_cannot_be_written_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "sha256").mkdir()
    os.chmod(tmp_path / "sha256", 0o555)
    with pytest.raises(variant_store.StoreError, match="cannot write"):
        variant_store.put(tmp_path, b"x")


def test_a_store_path_that_is_a_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "sha256").write_text("not a directory")
    with pytest.raises(variant_store.StoreError, match="cannot write"):
        variant_store.put(tmp_path, b"x")


def _blobs(directory: Path) -> None:
    (directory / "1234.blob").write_bytes(b"compiled kernels")


KEY = "a" * 64


def test_a_compiled_cache_is_stored_with_a_manifest_and_found_again(tmp_path: Path) -> None:
    path = variant_store.put_compiled(tmp_path, KEY, _blobs)
    assert path == tmp_path / "openvino-cache" / KEY
    assert sorted(p.name for p in path.iterdir()) == ["1234.blob", "MANIFEST.json"]
    assert variant_store.compiled(tmp_path, KEY) == path
    assert [p.name for p in path.parent.iterdir()] == [KEY], "no staging directory is left behind"

    def must_not_compile(directory: Path) -> None:
        raise AssertionError("a valid cache is kept, not compiled again")

    assert variant_store.put_compiled(tmp_path, KEY, must_not_compile) == path


@pytest.mark.parametrize("damage", ["changed", "added", "removed", "manifest"])
def test_a_compiled_cache_that_differs_from_its_manifest_is_not_imported(tmp_path: Path, damage: str) -> None:
    path = variant_store.put_compiled(tmp_path, KEY, _blobs)
    os.chmod(path, 0o755)
    for f in path.iterdir():
        os.chmod(f, 0o644)
    if damage == "changed":
        (path / "1234.blob").write_bytes(b"compiled kernelz")
    elif damage == "added":  # a blob OpenVINO would pick up under another hash
        (path / "5678.blob").write_bytes(b"other kernels")
    elif damage == "removed":
        (path / "1234.blob").unlink()
    else:
        (path / "MANIFEST.json").write_text("{not json")
    assert variant_store.compiled(tmp_path, KEY) is None
    assert variant_store.put_compiled(tmp_path, KEY, _blobs) == path  # the next Job replaces it
    assert variant_store.compiled(tmp_path, KEY) == path


def test_a_compile_that_leaves_nothing_or_fails_stores_nothing(tmp_path: Path) -> None:
    with pytest.raises(variant_store.StoreError, match="no compiled blob"):
        variant_store.put_compiled(tmp_path, KEY, lambda directory: None)

    def fails(directory: Path) -> None:
        _blobs(directory)
        raise RuntimeError("OpenVINO could not compile")

    with pytest.raises(RuntimeError):
        variant_store.put_compiled(tmp_path, KEY, fails)
    assert list((tmp_path / "openvino-cache").iterdir()) == []
    with pytest.raises(ValueError, match="sha256"):
        variant_store.compiled(tmp_path, "../" + KEY)
