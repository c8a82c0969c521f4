"""The sensitivity scan runs only where keeping layers in float can change the pick."""

from __future__ import annotations

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.scan_gate import decide
from metainfer.core.engine.trial import Trial, TrialStatus

MIXED = {"quantization": "int8_static", "keep_float": 2, "threads": 1}
ALL_INT8 = {**MIXED, "keep_float": 0}


def _allowed(point: dict[str, object]) -> bool:
    return True


def test_a_mixed_point_waits_for_its_all_int8_version_and_a_failed_one_is_not_cured_by_float_layers() -> None:
    first = decide(MIXED, [], set(), 0.01, _allowed)
    assert (first.action, first.point) == ("instead", ALL_INT8)
    failed = Trial(index=1, point=ALL_INT8, recipe=Recipe(), status=TrialStatus.FAILED, error="no kernel")
    assert decide(MIXED, [failed], set(), 0.01, _allowed).action == "pass_over"
    assert decide(MIXED, [], {"int8_static"}, 0.01, _allowed).action == "measure", "a scan already paid for is used"
    assert decide(ALL_INT8, [], set(), 0.01, _allowed).action == "measure"
    assert decide(MIXED, [], set(), 0.01, lambda p: False).action == "measure", "no all-int8 version to try"
