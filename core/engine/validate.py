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

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import Reference, quality_of, run_all
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.trial import Quality


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
    full = quality_of(run_all(session, data, recipe.batch), reference)
    checks = [
        _quality_check(f"quality on all {data.n_samples} samples at batch {recipe.batch}", full, max_quality_drop)
    ]
    for batch in sorted({1, min(largest_batch, data.n_samples)}):
        name = f"quality at batch {batch}" + (" (largest)" if batch > 1 else "")
        try:
            q = quality_of(run_all(session, data, batch), reference)
        except Exception as exc:  # a variant that cannot run at a batch its model accepts fails validation
            checks.append(Check(name=name, passed=False, detail=f"could not run: {_first_line(exc)}"))
            continue
        checks.append(_quality_check(name, q, max_quality_drop))
    checks.extend(_abnormal_inputs(session, data))
    return ValidationReport(passed=all(c.passed for c in checks), full_data_quality=full, checks=checks)


def _quality_check(name: str, q: Quality, budget: float) -> Check:
    return Check(
        name=name,
        passed=q.drop <= budget + 1e-9,
        detail=f"{q.metric} {q.value:.4f} vs FP32 {q.reference:.4f} (drop {q.drop:.4f}, budget {budget:g})",
    )


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
