"""Olive's side of the peer benchmark: our NPZ data as an Olive dataset, and our quality metric.

Olive loads this file (``user_script`` in the workflow that bench/olive_peer.py
writes) inside Olive's own virtual environment, so it imports nothing from
metainfer. It gives Olive the same samples the metainfer search uses and the
same quality signal (top-1 accuracy with labels, else the cosine of
mask-weighted mean-pooled outputs against FP32), so both searches chase one
objective under one accuracy budget. The final comparison does not trust this
number: bench/olive_peer.py measures every model again with metainfer's code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from olive.data.registry import Registry


class NpzDataset:
    """Map-style dataset over an NPZ of model inputs; the label is the sample index.

    The index (not a class label) lets the metric look up FP32 reference
    outputs, attention masks or labels of exactly the samples it was given.
    """

    def __init__(self, data_path: str, max_samples: int | None = None) -> None:
        with np.load(data_path, allow_pickle=False) as npz:
            self.inputs = {name: npz[name] for name in npz.files if name != "labels"}
        count = next(iter(self.inputs.values())).shape[0]
        self.count = count if max_samples is None else min(count, max_samples)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[dict[str, np.ndarray], int]:
        return {name: arr[index] for name, arr in self.inputs.items()}, index


@Registry.register_dataset()
def metainfer_npz_dataset(data_path: str, max_samples: int | None = None) -> NpzDataset:
    return NpzDataset(data_path, max_samples)


def _first_output(preds: Any) -> np.ndarray:
    if isinstance(preds, dict):  # several outputs: the first one, as metainfer scores a model
        preds = next(iter(preds.values()))
    return np.asarray(preds.cpu().numpy() if hasattr(preds, "cpu") else preds, dtype=np.float64)


def _mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """metainfer's mean_cosine (core.engine.reference), which this peer environment cannot import: zero in one
    output only is unrelated (0), zero in both equal (1)."""
    a2, b2 = a.reshape(len(a), -1), b.reshape(len(b), -1)
    norm_a, norm_b = np.linalg.norm(a2, axis=1), np.linalg.norm(b2, axis=1)
    den = norm_a * norm_b
    zero = np.where((norm_a == 0) & (norm_b == 0), 1.0, 0.0)
    cos = np.where(den == 0, zero, (a2 * b2).sum(axis=1) / np.where(den == 0, 1.0, den))
    return float(np.mean(np.nan_to_num(cos, nan=-1.0)))


def quality_metric(output: Any, targets: Any, reference_path: str) -> float:
    """Top-1 accuracy when the reference has labels, else mean-pooled cosine against FP32."""
    index = np.asarray(targets.cpu().numpy() if hasattr(targets, "cpu") else targets, dtype=np.int64)
    preds = _first_output(output.preds)
    with np.load(reference_path, allow_pickle=False) as ref:
        if "labels" in ref.files:
            return float(np.mean(np.argmax(preds.reshape(len(index), -1), axis=1) == ref["labels"][index]))
        if "mask" in ref.files and preds.ndim == 3:
            weights = ref["mask"][index][..., None].astype(np.float64)
            pooled = (preds * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            return _mean_cosine(pooled, ref["pooled"][index])
        return _mean_cosine(preds.reshape(len(index), -1), ref["outputs"][index])
