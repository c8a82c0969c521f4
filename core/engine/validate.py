"""Final checks on the winning variant before anyone serves it.

The search measured quality on a sample at one batch size; here the winner is
checked on all the data, at batch 1 and at the largest batch, against FP32, and
fed abnormal inputs (NaN, zeros, a wrong shape). Abnormal inputs must never
crash the process: a wrong shape must raise a clear error, NaN and zeros must
produce outputs of the right shape (NaN may propagate, as in FP32).

Serving combines concurrent requests into one run, so a request's company is
not its own choice. For a variant whose outputs depend on that company
(``Recipe.batch_dependent``: dynamic int8 computes each run's activation scales
from all its rows) every sample is also run in other company (shuffled, and
beside the sample with the largest inputs, which coarsens everyone's scales), and
the quality of every sample at its worst grouping is held to the same budget:
what a client can get is what was validated. The largest difference between a
sample's outputs alone and in company is reported for every variant.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import ModelError
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, batch_major, predicted_classes, quality_of, run_all
from metainfer.core.engine.runtime import Session, create_session
from metainfer.core.engine.trial import Quality


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    passed: bool
    detail: str


class BatchDependence(BaseModel):
    """How far a variant's outputs move with the other samples of their run."""

    model_config = ConfigDict(extra="forbid")

    groupings: list[str] = Field(description="The companies every sample was run in, alone first.")
    max_abs_difference: float = Field(
        description="The largest |output in company - output alone| over samples, outputs and groupings."
    )
    worst_quality: Quality = Field(description="Every sample at its worst grouping (furthest from FP32), vs FP32.")


class ValidationReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passed: bool
    full_data_quality: Quality
    checks: list[Check] = Field(default_factory=list)
    batch_dependence: BatchDependence | None = None


def validate_variant(
    variant: bytes,
    recipe: Recipe,
    data: Dataset,
    reference: Reference,
    max_quality_drop: float,
    largest_batch: int,
) -> ValidationReport:
    session = create_session(variant, recipe)
    at_recipe_batch = run_all(session, data, recipe.batch)
    full = quality_of(at_recipe_batch, reference)
    checks = [
        _quality_check(f"quality on all {data.n_samples} samples at batch {recipe.batch}", full, max_quality_drop)
    ]
    largest = min(largest_batch, data.n_samples)
    groupings = {f"in runs of {recipe.batch}": at_recipe_batch}
    for batch in sorted({1, largest}):
        name = f"quality at batch {batch}" + (" (largest)" if batch > 1 else "")
        try:
            outputs = run_all(session, data, batch)
        except ModelError:  # the model's own outputs (one per run, not per sample), not this variant
            raise
        except Exception as exc:  # a variant that cannot run at a batch its model accepts fails validation
            checks.append(Check(name=name, passed=False, detail=f"could not run: {_first_line(exc)}"))
            continue
        groupings["alone" if batch == 1 else f"in runs of {batch}"] = outputs
        checks.append(_quality_check(name, quality_of(outputs, reference), max_quality_drop))
    dependence = None
    if "alone" in groupings and largest > 1:
        if recipe.batch_dependent():
            try:
                groupings |= _in_other_company(session, data, largest, reference.compared())
            except Exception as exc:  # it ran at this batch in order: in other company it must run too
                checks.append(Check(name="runs in other company", passed=False, detail=_first_line(exc)))
        dependence = batch_dependence(groupings, reference)
        if recipe.batch_dependent():
            checks.append(_dependence_check(dependence, max_quality_drop))
    checks.extend(_abnormal_inputs(session, data, reference.compared()))
    return ValidationReport(
        passed=all(c.passed for c in checks), full_data_quality=full, checks=checks, batch_dependence=dependence
    )


def _in_other_company(session: Session, data: Dataset, batch: int, compared: list[int]) -> dict[str, list[np.ndarray]]:
    """Every sample run in runs of ``batch`` shuffled (fixed seed), and in runs that also hold the sample with the
    largest inputs (whose range sets the run's activation scales). Only the ``compared`` outputs are kept."""
    n = data.n_samples
    order = np.random.default_rng(0).permutation(n)
    shuffled = _run_rows(session, data, [order[start : start + batch] for start in range(0, n, batch)], compared)
    loudest = int(np.argmax(input_magnitude(data)))
    others = np.array([i for i in range(n) if i != loudest])
    runs = [np.append(others[s : s + batch - 1], loudest) for s in range(0, len(others), batch - 1)]
    beside = _run_rows(session, data, runs, compared)
    return {f"shuffled in runs of {batch}": shuffled, f"in runs of {batch} with the largest input": beside}


def input_magnitude(data: Dataset) -> np.ndarray:
    """Per sample, the sum over inputs of its largest absolute value (float inputs only, when there are any)."""
    floats = [a for a in data.inputs.values() if np.issubdtype(a.dtype, np.floating)]
    arrays = floats or list(data.inputs.values())
    total: np.ndarray = np.sum([np.abs(a.reshape(len(a), -1).astype(np.float64)).max(axis=1) for a in arrays], axis=0)
    return total


def _run_rows(session: Session, data: Dataset, runs: list[np.ndarray], compared: list[int]) -> list[np.ndarray]:
    """Outputs per sample (in sample order) when the samples run together as ``runs`` say; a sample in several
    runs keeps its outputs from the first. The ``compared`` outputs (a fixed number of rows per sample) only: the
    others are empty."""
    per_output: dict[int, np.ndarray] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    done = np.zeros(data.n_samples, dtype=bool)
    for rows in runs:
        outputs = session.run(None, data.feed(rows))
        fresh = ~done[rows]
        for i in compared:
            output = np.atleast_1d(batch_major(outputs[i], len(rows)))
            # Flat per sample, so that an output of several rows per sample ([samples * steps, classes]) fits.
            flat = output.reshape(len(rows), -1)
            if i not in per_output:
                per_output[i] = np.empty((data.n_samples, flat.shape[1]), dtype=output.dtype)
                shapes[i] = (data.n_samples * (len(output) // len(rows)), *output.shape[1:])
            per_output[i][rows[fresh]] = flat[fresh]
        done[rows] = True
    assert done.all()
    return [per_output[i].reshape(shapes[i]) if i in per_output else np.empty(0) for i in range(len(outputs))]


def batch_dependence(groupings: dict[str, list[np.ndarray]], reference: Reference) -> BatchDependence:
    """The outputs of every sample in each grouping (``"alone"`` among them) against each other and FP32."""
    alone = groupings["alone"]
    compared = reference.compared()
    difference = 0.0
    for outputs in groupings.values():
        for mine, solo in ((outputs[i], alone[i]) for i in compared):
            if mine.size:
                gap = np.abs(mine.astype(np.float64) - solo.astype(np.float64))
                difference = max(difference, float(np.nanmax(gap)) if not np.isnan(gap).all() else 0.0)
    names = ["alone", *(name for name in groupings if name != "alone")]
    return BatchDependence(
        groupings=names,
        max_abs_difference=difference,
        worst_quality=quality_of(worst_per_sample([groupings[name] for name in names], reference), reference),
    )


def worst_per_sample(candidates: list[list[np.ndarray]], reference: Reference) -> list[np.ndarray]:
    """For every sample, its outputs from the grouping that is furthest from FP32: a wrong top-1 label first
    (when there are labels), then the largest relative distance over the outputs."""
    n = reference.samples or reference.outputs[0].shape[0]
    compared = reference.compared()
    badness = np.zeros((len(candidates), n))
    for index, outputs in enumerate(candidates):
        for mine, ref in ((outputs[i], reference.outputs[i]) for i in compared):
            a = mine.reshape(n, -1).astype(np.float64)
            b = ref.reshape(n, -1).astype(np.float64)
            scale = np.maximum(np.linalg.norm(b, axis=1), 1e-12)
            badness[index] += np.nan_to_num(np.linalg.norm(a - b, axis=1) / scale, nan=np.inf)
        scores = reference.label_output()
        if reference.labels is not None and scores is not None:
            wrong = predicted_classes(outputs[scores], n) != reference.labels
            badness[index] += np.where(wrong, 1e6, 0.0)
    pick = np.argmax(badness, axis=0)
    worst = [candidates[0][k] for k in range(len(candidates[0]))]  # what no sample owns: as in the first
    for k in compared:
        per_sample = np.stack([c[k].reshape(n, -1) for c in candidates])[pick, np.arange(n)]
        worst[k] = per_sample.reshape(candidates[0][k].shape)
    return worst


def _dependence_check(dependence: BatchDependence, budget: float) -> Check:
    q = dependence.worst_quality
    return Check(
        name=f"quality when sharing runs (each sample at its worst of {len(dependence.groupings)} groupings)",
        passed=q.drop <= budget + 1e-9,
        detail=f"outputs move by up to {dependence.max_abs_difference:.3g} with what shares their run; {q.metric}"
        f" {q.value:.4f} vs FP32 {q.reference:.4f} (drop {q.drop:.4f}, budget {budget:g})",
    )


def _quality_check(name: str, q: Quality, budget: float) -> Check:
    return Check(
        name=name,
        passed=q.drop <= budget + 1e-9,
        detail=f"{q.metric} {q.value:.4f} vs FP32 {q.reference:.4f} (drop {q.drop:.4f}, budget {budget:g})",
    )


def _abnormal_inputs(session: Session, data: Dataset, compared: list[int]) -> list[Check]:
    """NaN and zeros must run (or be refused cleanly) with the batch size kept on the outputs a sample owns; an
    output with rows per run (detections kept) may hold any number."""
    feed = data.batch(0, 1)
    checks = []
    floats = [k for k, v in feed.items() if np.issubdtype(v.dtype, np.floating)]
    cases = {"zeros": {k: np.zeros_like(v) for k, v in feed.items()}}
    if floats:
        cases["NaN"] = {k: (np.full_like(v, np.nan) if k in floats else v) for k, v in feed.items()}

    def batch_sizes(outputs: list[np.ndarray]) -> list[tuple[int, ...]]:
        return [outputs[i].shape[:1] for i in compared]  # [:1]: () for a scalar output

    expected = batch_sizes(session.run(None, feed))
    for name, bad in cases.items():
        try:
            outs = session.run(None, bad)
            ok = batch_sizes(outs) == expected
            checks.append(
                Check(
                    name=f"{name} input",
                    passed=ok,
                    detail="ran, outputs have the expected batch size" if ok else "wrong output shape",
                )
            )
        except Exception as exc:  # a clean error is acceptable, a crash would not get here
            checks.append(Check(name=f"{name} input", passed=True, detail=f"rejected cleanly: {_first_line(exc)}"))
    name = next(iter(feed))
    wrong = dict(feed)
    wrong[name] = np.zeros((*feed[name].shape, 2), dtype=feed[name].dtype)
    try:
        session.run(None, wrong)
        checks.append(Check(name="wrong-shape input", passed=False, detail="accepted an extra dimension silently"))
    except Exception as exc:
        checks.append(Check(name="wrong-shape input", passed=True, detail=f"clear error: {_first_line(exc)}"))
    return checks


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
