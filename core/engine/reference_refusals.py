"""FP32's answers on the user's data that leave a quality budget nothing to guard: refused, naming what to fix.

``make_reference`` (core.engine.reference) calls these once FP32 has run on the quality samples: answers of NaN
(no variant can be compared with them) and labels no class of the scores has (top-1 would be 0 for FP32 and every
variant alike).
"""

from __future__ import annotations

import numpy as np

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import DataError, ModelError


def refuse_nan_answers(compared: list[tuple[str, np.ndarray]], data: Dataset) -> None:
    """FP32 answering NaN for a sample leaves nothing there to compare a variant with: every metric then scores
    noise (a tabular export with missing values in its data had FP32 at top-1 0.10, and an int8 variant, whose
    quantizer turns NaN into a number, "gained" 0.86). Refused, naming the samples, and the input that holds NaN
    or infinity for them (the data's fault), else the output (the model's: an overflow, a division by zero)."""
    n = data.n_samples
    nan = np.zeros(n, dtype=bool)
    first, unplaced = "", False
    for name, output in compared:
        if not np.issubdtype(output.dtype, np.floating) or not np.isnan(output).any():
            continue
        first = first or name
        if output.shape[0] == n:  # one row per sample: its NaN rows are its NaN samples
            nan |= np.isnan(output.reshape(n, -1)).any(axis=1)
        else:  # several rows per sample, in an order the export chose: whose rows they are is not known
            unplaced = True
    if not first:
        return
    which = np.flatnonzero(nan) if nan.any() else np.arange(n)
    if nan.any():
        shown = ", ".join(str(i) for i in which[:5]) + (", ..." if len(which) > 5 else "")
        answered = f"FP32 answers NaN (output {first[:100]!r}) for {len(which)} of {n} samples (sample {shown})"
    else:
        answered = f"FP32 answers NaN in output {first[:100]!r} on the {n} samples"
    culprits = [
        name
        for name, array in data.inputs.items()
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array[which]).all()
    ]
    if culprits:
        raise DataError(
            f"input {culprits[0][:100]!r}",
            f"{answered}, whose data holds NaN or infinity{'' if unplaced else ' there'}: no variant can be compared"
            " with FP32 on them. Fill in missing values the way the model's callers do before it, or leave those"
            " samples out",
        )
    if data.random:
        raise DataError(
            "data",
            f"{answered} though their inputs are finite: they are random (no data was given), and the model takes"
            " what random numbers are not (a log or a square root of a feature, ids in a range). Give samples as"
            " the model's callers send them (--data; policy: spec.model.data)",
        )
    raise ModelError(
        "FP32 model",
        f"{answered} though their inputs are finite: no variant can be compared with FP32 on them. Check the "
        "export (a float16 overflow, a division by zero, a log of zero) with those samples",
    )


def refuse_labels_no_class_has(scores: np.ndarray, name: str, labels: np.ndarray) -> None:
    """Labels must be indices of the classes the model scores: labels counted from 1 matched no prediction, FP32
    scored top-1 0.0, every variant "kept" it, and the budget guarded nothing. (Class ids a model outputs itself
    say nothing of how many classes there are: not checked.)"""
    if np.issubdtype(scores.dtype, np.integer) or not len(labels):
        return
    classes = int(scores.reshape(len(labels), -1).shape[1])
    low, high = int(labels.min()), int(labels.max())
    if low >= 0 and high < classes:
        return
    hint = " If they count from 1, subtract 1." if low >= 1 and high == classes else ""
    raise DataError(
        "labels",
        f"they run from {low} to {high}, but output {name[:100]!r} scores {classes} classes (0 to {classes - 1}): "
        f"top-1 compares each label with the index of the highest score, so a label outside that range never "
        f"matches and the accuracy budget would guard nothing.{hint}",
    )
