"""Final checks on the winning variant before anyone serves it.

The search measured quality on a sample at one batch size; here the winner is
checked on all the data, at batch 1 and at the largest batch, against FP32, and
fed abnormal inputs (NaN, zeros, a wrong shape). Abnormal inputs must never
crash the process: a wrong shape must raise a clear error, NaN and zeros must
produce outputs of the right shape (NaN may propagate, as in FP32).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.data import Dataset
from metainfer.core.evaluate import Reference, quality_of, run_all
from metainfer.core.recipe import Recipe
from metainfer.core.runtime import create_session
from metainfer.core.trial import Quality


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    passed: bool
    detail: str


class ValidationReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passed: bool
    full_data_quality: Quality
    checks: list[Check] = Field(default_factory=list)


def validate_variant(
    variant: bytes,
    recipe: Recipe,
    data: Dataset,
    reference: Reference,
    max_quality_drop: float,
    largest_batch: int,
) -> ValidationReport:
    session = create_session(variant, recipe)
    checks: list[Check] = []
    full = quality_of(run_all(session, data, recipe.batch), reference)
    checks.append(
        Check(
            name=f"quality on all {data.n_samples} samples at batch {recipe.batch}",
            passed=full.drop <= max_quality_drop + 1e-9,
            detail=f"{full.metric} {full.value:.4f} vs FP32 {full.reference:.4f} (drop {full.drop:.4f},"
            f" budget {max_quality_drop:g})",
        )
    )
    one = run_all(session, data, 1)
    big_batch = min(largest_batch, data.n_samples)
    big = run_all(session, data, big_batch) if big_batch > 1 else one
    for label, outs in (("batch 1", one), (f"batch {big_batch} (largest)", big)):
        q = quality_of(outs, reference)
        checks.append(
            Check(
                name=f"quality at {label}",
                passed=q.drop <= max_quality_drop + 1e-9,
                detail=f"{q.metric} {q.value:.4f} (drop {q.drop:.4f})",
            )
        )
    checks.extend(_abnormal_inputs(session, data))
    return ValidationReport(passed=all(c.passed for c in checks), full_data_quality=full, checks=checks)


def _abnormal_inputs(session: object, data: Dataset) -> list[Check]:
    from onnxruntime import InferenceSession

    assert isinstance(session, InferenceSession)
    feed = data.batch(0, 1)
    checks = []
    floats = [k for k, v in feed.items() if np.issubdtype(v.dtype, np.floating)]
    cases = {"zeros": {k: np.zeros_like(v) for k, v in feed.items()}}
    if floats:
        cases["NaN"] = {k: (np.full_like(v, np.nan) if k in floats else v) for k, v in feed.items()}
    expected = [o.shape[0] for o in session.run(None, feed)]
    for name, bad in cases.items():
        try:
            outs = session.run(None, bad)
            ok = [o.shape[0] for o in outs] == expected
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
