"""Sample data for calibration, quality and latency, checked against the model.

NPZ arrays are named after the model inputs, first axis = samples; an optional
``labels`` array turns on top-1 accuracy. An array with one axis more than its
input holds samples of an input that has no samples axis (torchvision's
detectors take one [3, H, W] image; a scalar setting beside a batch): each
sample is fed as the whole input, one per run, unless it is the same for every
sample and another input carries the samples (a YOLO export's score threshold
beside its images): then it is a setting of the run, and runs hold any number of
samples. Such a setting may also be given once, as the model takes it (a 0-d
array for a scalar input). Mismatches are caught here, with the array and the
expected shape named, rather than deep inside ONNX Runtime.
"""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metainfer.core.engine.errors import DataError
from metainfer.core.engine.modelinfo import ModelInfo, TensorInfo

LABELS = "labels"


@dataclass(frozen=True)
class Dataset:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    # Inputs the model takes without a samples axis: one sample is the whole input, so runs hold one sample...
    unbatched: frozenset[str] = frozenset()
    # ... unless each of them is the same for every sample (``per_run``) and another input carries the samples.
    per_run: frozenset[str] = frozenset()
    # Seeded random samples (no data was given): what FP32 answers on them says nothing of the model's task.
    random: bool = False

    @property
    def n_samples(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])

    def why_one_sample_per_run(self) -> str:
        """Why runs hold one sample (``one_sample_per_run``), in words for an error message."""
        varying = sorted(self.unbatched - self.per_run)
        if varying:
            return (
                f"input(s) {[v[:60] for v in varying[:8]]} have no samples axis (the data holds one more axis than"
                " the input: samples of the whole input) and differ between samples"
            )
        return "no input has a samples axis (the data holds one more axis than each input: samples of the whole input)"

    @property
    def one_sample_per_run(self) -> bool:
        """Whether a run can hold only one sample: an input without a samples axis differs between samples, or
        no input has a samples axis at all."""
        return bool(self.unbatched) and (bool(self.unbatched - self.per_run) or self.unbatched == set(self.inputs))

    def batch(self, start: int, size: int) -> dict[str, np.ndarray]:
        """``size`` samples starting at ``start``, wrapping around so any batch size works."""
        return self.feed((np.arange(size) + start) % self.n_samples)

    def batches(self, size: int) -> Iterator[tuple[dict[str, np.ndarray], slice]]:
        """Consecutive batches covering every sample once (the last may be smaller)."""
        for start in range(0, self.n_samples, size):
            sl = slice(start, min(start + size, self.n_samples))
            yield self.feed(np.arange(sl.start, sl.stop)), sl

    def feed(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The model's inputs for the samples ``rows``, run together."""
        if self.one_sample_per_run and len(rows) != 1:
            raise DataError(
                "batch",
                f"{self.why_one_sample_per_run()}, so a run holds one sample, not {len(rows)}: use --batch 1 "
                "(policy: slo.batchSize: 1)",
            )
        return {name: arr[rows[0], ...] if name in self.unbatched else arr[rows] for name, arr in self.inputs.items()}

    def head(self, n: int) -> Dataset:
        n = min(n, self.n_samples)
        labels = None if self.labels is None else self.labels[:n]
        return dataclasses.replace(self, inputs={k: v[:n] for k, v in self.inputs.items()}, labels=labels)

    def tail(self, start: int) -> Dataset:
        """The samples from ``start`` on (what ``head(start)`` leaves out)."""
        labels = None if self.labels is None else self.labels[start:]
        return dataclasses.replace(self, inputs={k: v[start:] for k, v in self.inputs.items()}, labels=labels)


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
    unbatched: set[str] = set()
    counts = set()
    once = _given_once(arrays, expected)
    for name, info in expected.items():
        arr = arrays[name]
        if name in once:  # checked whole by _given_once; spread over the samples below
            inputs[name] = _cast(arr, info.dtype, f"{source}:{name}")
            unbatched.add(name)
            continue
        if arr.ndim == 0 and not info.shape:  # a scalar input's one value, and no other input to carry samples
            arr = arr.reshape(1)
        if arr.ndim == len(info.shape) + 1:  # samples of an input that has no samples axis
            unbatched.add(name)
            model_axes = info.shape
        elif arr.ndim == len(info.shape):
            model_axes = info.shape[1:]
        else:
            raise DataError(
                f"{source}:{name}",
                f"has {arr.ndim} dims {list(arr.shape)}, the model expects {len(info.shape)} dims"
                f" {list(info.shape)} (first axis = samples; or {len(info.shape) + 1} dims, samples of the whole"
                " input, for a model that takes one sample without a samples axis)",
            )
        for axis, (have, want) in enumerate(zip(arr.shape[1:], model_axes, strict=True), start=1):
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
    for name in once:  # a read-only view: the one value, seen as every sample's
        inputs[name] = np.broadcast_to(inputs[name], (n, *inputs[name].shape))
    per_run = frozenset(name for name in unbatched if _same_for_every_sample(inputs[name]))
    return Dataset(inputs, labels, frozenset(unbatched), per_run)


def _given_once(arrays: dict[str, np.ndarray], expected: dict[str, TensorInfo]) -> set[str]:
    """The inputs whose array is the input itself, once (shape exactly the model's, every dim fixed: a 0-d
    array for a scalar): settings beside the inputs that carry the samples. If every array is of that kind
    (a model whose batch is fixed, given one batch), those with axes are samples, as ever, and only scalars
    beside them are settings."""
    once = {
        name
        for name, info in expected.items()
        if all(isinstance(d, int) for d in info.shape) and arrays[name].shape == tuple(info.shape)
    }
    if once == set(expected):
        scalars = {name for name in once if not expected[name].shape}
        return scalars if scalars != once else set()
    # As many rows as the other arrays have samples: those may be samples as well (ambiguous: read as ever).
    counts = {arrays[name].shape[0] for name in set(expected) - once if arrays[name].ndim}
    return {name for name in once if not arrays[name].ndim or arrays[name].shape[0] not in counts}


def _same_for_every_sample(array: np.ndarray) -> bool:
    return bool(len(array) == 0 or np.array_equal(array, np.broadcast_to(array[:1], array.shape), equal_nan=True))


def _cast(arr: np.ndarray, dtype: str, where: str) -> np.ndarray:
    target = np.dtype(dtype)
    if arr.dtype == target:
        return arr
    if arr.dtype.kind == target.kind or (arr.dtype.kind in "iu" and target.kind in "iu"):
        return arr.astype(target)
    raise DataError(where, f"has dtype {arr.dtype}, the model expects {target}")
