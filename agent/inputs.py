"""The run's samples: the policy's NPZ when it names one, else seeded random inputs.

Without data the engine still works: quality compares each variant's outputs
with the FP32 model's on the same random inputs, which catches broken
quantization but says nothing about task accuracy. The run's condition message
(and ``metainfer adapt`` without --data) says so, so nobody mistakes it for a
measured accuracy, and names the open axes the random inputs gave length 1.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from metainfer.agent.fetch import ConfigMapReader, fetch
from metainfer.core.api.policy import InputSpec, ModelSource
from metainfer.core.engine.data import Dataset, load_npz, make_dataset
from metainfer.core.engine.errors import DataError
from metainfer.core.engine.modelinfo import ModelInfo

SYNTHETIC_SAMPLES = 128


def load_data(
    source: ModelSource, model: ModelInfo, workdir: Path, namespace: str, configmaps: ConfigMapReader | None, seed: int
) -> tuple[Dataset, str | None]:
    """The dataset and, when it was synthesised, a note for the status message."""
    if source.data is not None:
        path = fetch(
            source.data.uri,
            workdir / "data.npz",
            expected_sha256=source.data.sha256,
            namespace=namespace,
            configmaps=configmaps,
            what="data",
        )
        try:
            return load_npz(path, model), None
        except DataError as exc:  # name the URI the user wrote, not the agent's temp file
            raise DataError(exc.field.replace(str(path), source.data.uri), exc.problem) from exc
    data = synthetic_dataset(model, source.inputs or [], seed)
    return data, "no spec.model.data: " + synthetic_note(model, source.inputs or [], data, "spec.model.inputs")


def synthetic_note(model: ModelInfo, overrides: list[InputSpec], data: Dataset, how: str) -> str:
    """What quality on random inputs means, and which open axes they gave length 1 (set with ``how``): a
    sequence of 1 or a 1x1 image times nothing like production."""
    given = {spec.name: spec for spec in overrides if spec.shape is not None}
    guessed = [
        f"{tensor.name[:60]} axis {axis}" + (f" ({dim[:30]})" if isinstance(dim, str) else "")
        for tensor in model.inputs
        if tensor.name not in given
        for axis, dim in enumerate(tensor.shape)
        if axis > 0 and not (isinstance(dim, int) and dim > 0)
    ]
    note = f"quality measured against FP32's outputs on {data.n_samples} seeded random inputs (not task accuracy)"
    if guessed:
        shown = ", ".join(guessed[:6]) + (", ..." if len(guessed) > 6 else "")
        note += f"; axes the model leaves open got length 1, unlike production: {shown} (set them with {how})"
    return note


def synthetic_dataset(
    model: ModelInfo,
    overrides: list[InputSpec],
    seed: int,
    n: int = SYNTHETIC_SAMPLES,
    field: str = "spec.model.inputs",
) -> Dataset:
    """Random samples shaped like the model's inputs; dynamic dims other than the first become 1.

    The first axis is the sample axis (the engine batches along it), so only the
    remaining dims need a size. Integer inputs get 0 or 1, valid for token ids,
    attention masks and segment ids alike. A scalar input beside others gets one
    value for every sample: a setting of the run, as a threshold is.
    """
    rng = np.random.default_rng(seed)
    given = {spec.name: spec for spec in overrides}
    unknown = sorted(set(given) - {t.name for t in model.inputs})
    if unknown:  # a typo would leave the input it meant at length 1, unsaid
        names = [t.name[:60] for t in model.inputs[:8]]
        raise DataError(field, f"{[u[:60] for u in unknown[:4]]} are not model inputs; the model's inputs are {names}")
    arrays: dict[str, np.ndarray] = {}
    # A scalar beside inputs with axes (a detector's score threshold) is a setting of the run: one value, given
    # once (core.engine.data), so the production batch can be measured; alone, it is each sample's input.
    settings = any(t.shape for t in model.inputs)
    for tensor in model.inputs:
        spec = given.get(tensor.name)
        shape = list(spec.shape) if spec is not None and spec.shape is not None else list(tensor.shape)
        dtype_name = spec.dtype if spec is not None and spec.dtype is not None else tensor.dtype
        try:
            dtype = np.dtype(dtype_name)
        except TypeError as exc:
            raise DataError(tensor.name, f"cannot synthesise {dtype_name} inputs; set spec.model.data") from exc
        dims = [d if isinstance(d, int) and d > 0 else 1 for d in shape[1:]]
        size: tuple[int, ...] = () if settings and not shape else (n, *dims)
        if dtype.kind == "b":
            arrays[tensor.name] = np.asarray(rng.integers(0, 2, size=size)).astype(bool)
        elif dtype.kind in "iu":
            arrays[tensor.name] = np.asarray(rng.integers(0, 2, size=size)).astype(dtype)
        else:
            arrays[tensor.name] = np.asarray(rng.standard_normal(size)).astype(dtype)
    return dataclasses.replace(make_dataset(arrays, model, source="synthetic inputs"), random=True)
