"""The content-addressed variant store: ``<root>/sha256/<hex>.onnx``, written by adaptation Jobs, read by serving.
Beside it, ``<root>/openvino-cache/<key>/`` holds OpenVINO's compiled blobs for a variant on OpenVINO, so a serving
pod imports what the Job compiled instead of compiling again.

A file's name is the sha256 of its bytes, so a reader checks what it got against its name and nothing else can
be substituted: a truncated or tampered file is detected, ignored, and serving falls back to rebuilding the
variant (and checking the rebuild against the same sha256). Writes go to a temporary file in the same directory
and are renamed into place, so a Job killed mid-write never leaves a partial file under a valid name, and two
Jobs that built the same variant write the same bytes to the same name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from metainfer.core.api.pod_contract import ENV_VARIANT_STORE

log = logging.getLogger("metainfer.variants")
ENV: Final = ENV_VARIANT_STORE  # set in adaptation Jobs whose policy has serving.variantStore
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMPILED_DIR = "openvino-cache"
MANIFEST = "MANIFEST.json"  # each file of a compiled cache and its sha256: what a reader checks before importing


class StoreError(OSError):
    """The store could not be written (permissions, a full volume): serving will rebuild instead."""


def path_of(root: Path, sha256: str) -> Path:
    if not _SHA256.match(sha256):
        raise ValueError(f"not a lower-case hex sha256: {sha256[:80]!r}")
    return root / "sha256" / f"{sha256}.onnx"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(root: Path, data: bytes) -> tuple[str, Path]:
    """Store ``data`` under its sha256 (a no-op if a correct copy is there); returns (sha256, path)."""
    sha256 = sha256_of(data)
    target = path_of(root, sha256)
    if target.is_file() and _matches(target, sha256):
        return sha256, target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{sha256[:16]}-", suffix=".part", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o444)  # readable by serving pods running as another UID in the same fsGroup
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return sha256, target


def get(root: Path, sha256: str) -> bytes | None:
    """The stored bytes of ``sha256``, or None when the file is absent, unreadable or not what its name says."""
    path = path_of(root, sha256)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        log.info("variant %s is not in the store %s", sha256, root)
        return None
    except OSError as exc:
        log.warning("cannot read %s (%s): the variant will be rebuilt", path, exc.strerror or exc)
        return None
    actual = sha256_of(data)
    if actual != sha256:
        log.warning("%s holds bytes with sha256 %s, not the name's: ignored, the variant will be rebuilt", path, actual)
        return None
    return data


def _matches(path: Path, sha256: str) -> bool:
    try:
        return sha256_of(path.read_bytes()) == sha256
    except OSError:
        return False


def compiled_path(root: Path, key: str) -> Path:
    if not _SHA256.match(key):
        raise ValueError(f"not a lower-case hex sha256: {key[:80]!r}")
    return root / COMPILED_DIR / key


def compiled(root: Path, key: str) -> Path | None:
    """The compiled cache stored under ``key``, or None when it is absent or any file differs from its manifest
    (truncated, replaced, added to): OpenVINO then compiles, as it would with no cache."""
    directory = compiled_path(root, key)
    try:
        listed = json.loads((directory / MANIFEST).read_text())["files"]
        present = {f.name for f in directory.iterdir()} - {MANIFEST}
    except FileNotFoundError:
        log.info("no compiled cache %s in the store %s", key, root)
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("compiled cache %s is unreadable (%s): the variant will be compiled", directory, exc)
        return None
    if (
        not isinstance(listed, dict)
        or present != set(listed)
        or not all(_matches(directory / name, str(sha)) for name, sha in listed.items())
    ):
        log.warning("compiled cache %s does not match its manifest: ignored, the variant will be compiled", directory)
        return None
    return directory


def put_compiled(root: Path, key: str, populate: Callable[[Path], None]) -> Path:
    """Store what ``populate`` writes into an empty directory (OpenVINO compiling with that directory as its
    cache) under ``key``, with a manifest; a valid copy already there is kept. Raises StoreError."""
    final = compiled_path(root, key)
    if compiled(root, key) is not None:
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=final.parent))
        try:
            populate(staging)
            files = {f.name: sha256_of(f.read_bytes()) for f in staging.iterdir() if f.is_file()}
            if not files:
                raise StoreError(f"compiling into {staging} left no compiled blob")
            (staging / MANIFEST).write_text(json.dumps({"files": files}, sort_keys=True))
            for f in staging.iterdir():
                os.chmod(f, 0o444)
            os.chmod(staging, 0o555)
            if final.exists():  # an invalid copy (the check above failed): replaced, never imported
                _remove(final)
            try:
                os.replace(staging, final)
            except OSError:
                if compiled(root, key) is None:
                    raise
                _remove(staging)  # another Job stored the same key first
        except BaseException:
            _remove(staging)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write {final}: {exc.strerror or exc}") from exc
    return final


def _remove(directory: Path) -> None:
    if directory.exists():
        os.chmod(directory, 0o755)
        shutil.rmtree(directory, ignore_errors=True)
