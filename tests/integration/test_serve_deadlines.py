"""A running call, on ONNX Runtime or OpenVINO, is stopped at its request's deadline, and only then (wall-clock:
integration)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from serve_harness import slow_model

from metainfer.agent.serve.deadlines import DeadlineExceeded, Watchdog
from metainfer.agent.serve.model import LoadedModel
from metainfer.agent.serve.protocol import Signature
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session

# Alone (no neighbouring test): a call is stopped at its deadline and only then: wall-clock bounds.
pytestmark = pytest.mark.alone


class Flag:
    terminate = False


def test_the_watchdog_sets_the_flag_of_an_overdue_run_and_leaves_finished_ones_alone() -> None:
    watchdog = Watchdog()
    overdue, finished, unbounded = Flag(), Flag(), Flag()
    with watchdog.armed(finished, time.perf_counter() + 0.05):
        pass
    with watchdog.armed(unbounded, None), watchdog.armed(overdue, time.perf_counter() + 0.05):
        time.sleep(0.3)
        assert overdue.terminate
    time.sleep(0.1)
    assert not finished.terminate and not unbounded.terminate
    assert watchdog.stopped == 1


def test_an_earlier_deadline_armed_later_is_still_met() -> None:
    watchdog = Watchdog()
    late, early = Flag(), Flag()
    with watchdog.armed(late, time.perf_counter() + 30):
        with watchdog.armed(early, time.perf_counter() + 0.05):
            time.sleep(0.3)
        assert early.terminate and not late.terminate


# Rows of a request that takes seconds: OpenVINO runs the identity chain about 4x slower than ONNX Runtime here.
BIG_ROWS = {"onnxruntime": 2048, "openvino": 1024}


@pytest.fixture(scope="module", params=sorted(BIG_ROWS))
def slow_serving(request: pytest.FixtureRequest) -> tuple[LoadedModel, int]:
    """The slow model loaded on one runtime, and the rows of a request it takes seconds over."""
    if request.param == "openvino":
        pytest.importorskip("openvino")
    session = create_session(slow_model(), Recipe(batch=1, session={"runtime": request.param}))
    model = LoadedModel(session, Signature(inputs=(), outputs=(), max_batch=4096), "b" * 64, "v" * 64)
    return model, BIG_ROWS[request.param]


def test_a_run_past_its_deadline_is_stopped_and_the_session_keeps_serving(
    slow_serving: tuple[LoadedModel, int],
) -> None:
    loaded, rows = slow_serving
    big = {"x": np.ones((rows, 512), dtype=np.float32)}
    started = time.perf_counter()
    full = loaded.infer(big, ["y"])  # no deadline: runs to the end
    full_s = time.perf_counter() - started
    assert full_s > 0.5, f"the model must be slow enough to interrupt ({full_s:.2f} s)"
    started = time.perf_counter()
    with pytest.raises(DeadlineExceeded):
        loaded.infer(big, ["y"], deadline=time.perf_counter() + 0.1)
    stopped_s = time.perf_counter() - started
    assert stopped_s < full_s / 2, f"stopped after {stopped_s:.2f} s, a whole run takes {full_s:.2f} s"
    small = {"x": np.full((1, 512), 3.0, dtype=np.float32)}
    out = loaded.infer(small, ["y"], deadline=time.perf_counter() + 30)  # the session is usable afterwards
    np.testing.assert_array_equal(out["y"], small["x"])
    assert full["y"].shape == (rows, 512)
