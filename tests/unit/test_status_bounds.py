"""Every free-text field of a status is cut to fit, never rejected.

Status text is copied from places the operator does not control (a run's
condition, an exception, a server's reply); one overlong string must not fail
the whole status write and wedge the object. Identifiers (names, keys,
fingerprints) are not text: they are validated, not cut.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from metainfer.core.api._base import TRUNCATED, bounded
from metainfer.core.api.conditions import Condition
from metainfer.core.api.policy import ClassStatus, DriftStatus, RolloutStatus, VariantSummary
from metainfer.core.api.run import RunMetrics, RunProgress, TrialSummary

NOW = "2026-01-01T00:00:00Z"
# (model, free-text field, the limit its CRD schema declares)
TEXT_FIELDS: list[tuple[type[BaseModel], str, int]] = [
    (ClassStatus, "reason", 1024),
    (ClassStatus, "message", 4096),
    (ClassStatus, "last_adaptation_reason", 64),
    (DriftStatus, "reason", 64),
    (DriftStatus, "message", 1024),
    (RolloutStatus, "reason", 1024),
    (RolloutStatus, "message", 4096),
    (VariantSummary, "description", 256),
    (RunMetrics, "quality_metric", 64),
    (RunProgress, "stage", 64),
    (TrialSummary, "description", 256),
    (TrialSummary, "error", 1024),
    (Condition, "message", 32768),
]


def _minimal(model: type[BaseModel]) -> dict[str, Any]:
    return {
        ClassStatus: {"fingerprint": "0123456789abcdef", "name": "cpu-x-01234567"},
        VariantSummary: {"recipe_key": "k"},
        RunMetrics: {"p95_ms": 1.0},
        TrialSummary: {"index": 0, "recipe_key": "k", "status": "failed"},
        Condition: {
            "type": "Ready",
            "status": "False",
            "reason": "JobFailed",
            "last_transition_time": "2026-01-01T00:00:00Z",
        },
    }.get(model, {})


@pytest.mark.parametrize(("model", "field", "limit"), TEXT_FIELDS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_overlong_status_text_is_cut_to_its_limit(model: type[BaseModel], field: str, limit: int) -> None:
    schema = model.model_json_schema(by_alias=False)["properties"][field]
    declared = schema.get("maxLength") or next(s["maxLength"] for s in schema["anyOf"] if "maxLength" in s)
    assert declared == limit, "the CRD's maxLength and the cut agree"
    kept = getattr(model.model_validate({**_minimal(model), field: "y" * (limit * 3)}), field)
    assert len(kept) == limit and kept.endswith(TRUNCATED)


def test_bounded_keeps_short_text_and_marks_a_cut() -> None:
    assert bounded("short", 10) == "short"
    assert bounded("x" * 100, 20) == "x" * (20 - len(TRUNCATED)) + TRUNCATED
    assert len(bounded("x" * 100, 3)) == 3
