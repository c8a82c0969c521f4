"""Sample data for calibration, quality and latency, checked against the model.

NPZ arrays are named after the model inputs, first axis = samples; an optional
``labels`` array turns on top-1 accuracy. Mismatches are caught here, with the
array and the expected shape named, rather than deep inside ONNX Runtime.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metainfer.core.engine.errors import DataError
from metainfer.core.engine.modelinfo import ModelInfo

LABELS = "labels"


@dataclass(frozen=True)
class Dataset:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])

    def batch(self, start: int, size: int) -> dict[str, np.ndarray]:
        """``size`` samples starting at ``start``, wrapping around so any batch size works."""
        idx = (np.arange(size) + start) % self.n_samples
        return {name: arr[idx] for name, arr in self.inputs.items()}

    def batches(self, size: int) -> Iterator[tuple[dict[str, np.ndarray], slice]]:
        """Consecutive batches covering every sample once (the last may be smaller)."""
        for start in range(0, self.n_samples, size):
            sl = slice(start, min(start + size, self.n_samples))
            yield {name: arr[sl] for name, arr in self.inputs.items()}, sl

    def head(self, n: int) -> Dataset:
        n = min(n, self.n_samples)
        return Dataset(
            {k: v[:n] for k, v in self.inputs.items()},
            None if self.labels is None else self.labels[:n],
        )

    def tail(self, start: int) -> Dataset:
        """The samples from ``start`` on (what ``head(start)`` leaves out)."""
        return Dataset(
            {k: v[start:] for k, v in self.inputs.items()},
            None if self.labels is None else self.labels[start:],
        )


def load_npz(path: Path, model: ModelInfo) -> Dataset:
    if not path.exists():
        raise DataError(str(path), "no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DataError(str(path), f"not a readable .npz file ({exc})") from exc
    return make_dataset(arrays, model, source=str(path))


def make_dataset(arrays: dict[str, np.ndarray], model: ModelInfo, source: str = "data") -> Dataset:
    labels = arrays.pop(LABELS, None)
    expected = {i.name: i for i in model.inputs}
    unknown = sorted(set(arrays) - set(expected))
    if unknown:
        raise DataError(
            source,
            f"array(s) {unknown} are not model inputs; the model's inputs are {sorted(expected)}"
            f" (plus an optional '{LABELS}' array)",
        )
    missing = sorted(set(expected) - set(arrays))
    if missing:
        raise DataError(source, f"missing array(s) for model input(s) {missing}")
    inputs: dict[str, np.ndarray] = {}
    counts = set()
    for name, info in expected.items():
        arr = arrays[name]
        if arr.ndim != len(info.shape):
            raise DataError(
                f"{source}:{name}",
                f"has {arr.ndim} dims {list(arr.shape)}, the model expects {len(info.shape)} dims"
                f" {list(info.shape)} (first axis = samples)",
            )
        for axis, (have, want) in enumerate(zip(arr.shape[1:], info.shape[1:], strict=True), start=1):
            if isinstance(want, int) and have != want:
                raise DataError(
                    f"{source}:{name}",
                    f"axis {axis} has size {have}, the model expects {want} (shape {list(info.shape)})",
                )
        inputs[name] = _cast(arr, info.dtype, f"{source}:{name}")
        counts.add(arr.shape[0])
    if len(counts) != 1:
        raise DataError(source, f"arrays have different sample counts {sorted(counts)}; they must agree")
    n = counts.pop()
    if n == 0:
        raise DataError(source, "holds zero samples")
    if labels is not None:
        if labels.shape != (n,) or labels.dtype.kind not in "iu":
            raise DataError(
                f"{source}:{LABELS}",
                f"must be an integer array of shape ({n},), got {labels.dtype} {list(labels.shape)}",
            )
        labels = labels.astype(np.int64)
    return Dataset(inputs, labels)


def _cast(arr: np.ndarray, dtype: str, where: str) -> np.ndarray:
    target = np.dtype(dtype)
    if arr.dtype == target:
        return arr
    if arr.dtype.kind == target.kind or (arr.dtype.kind in "iu" and target.kind in "iu"):
        return arr.astype(target)
    raise DataError(where, f"has dtype {arr.dtype}, the model expects {target}")
