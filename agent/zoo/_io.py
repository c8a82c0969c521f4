"""Byte-stable writers for example models and their data.

Recipes are keyed by the base model's sha256, so an example model must come out
byte-identical every time it is built. ``onnx.save`` and ``numpy.savez`` are not
enough for that: protobuf map ordering is only fixed with ``deterministic=True``,
and ``numpy.savez`` stamps every zip member with the current time (and zipfile
with the operating system it ran on). These helpers pin all of them.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

# Zip's epoch; any fixed value would do, this one is what reproducible-build tools use.
_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
# "Made by" Unix, which zipfile writes everywhere but on Windows (0 there), where the same archive would differ.
_ZIP_CREATE_SYSTEM_UNIX = 3


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Check ``model`` with the ONNX checker and write it with stable bytes."""
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString(deterministic=True))


def save_npz(arrays: Mapping[str, np.ndarray], path: Path) -> None:
    """Write an uncompressed ``.npz`` that ``numpy.load`` reads, with fixed timestamps.

    Members are written in sorted name order so that the mapping's insertion order
    does not leak into the bytes either.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.create_system = _ZIP_CREATE_SYSTEM_UNIX
            archive.writestr(info, buffer.getvalue())
