"""The content-addressed variant store: ``<root>/sha256/<hex>.onnx``, written by adaptation Jobs, read by serving.

A file's name is the sha256 of its bytes, so a reader checks what it got against its name and nothing else can
be substituted: a truncated or tampered file is detected, ignored, and serving falls back to rebuilding the
variant (and checking the rebuild against the same sha256). Writes go to a temporary file in the same directory
and are renamed into place, so a Job killed mid-write never leaves a partial file under a valid name, and two
Jobs that built the same variant write the same bytes to the same name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path

log = logging.getLogger("metainfer.variants")
ENV = "METAINFER_VARIANT_STORE"  # set in adaptation Jobs whose policy has serving.variantStore
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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
