"""Dynamic batching: concurrent requests share runs up to the batch size, split back exactly, never mixed."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metainfer.agent.serve import batching
from metainfer.agent.serve.batching import Batcher, BatcherFailure, RunOverdue
from metainfer.agent.serve.deadlines import DeadlineExceeded


class Model:
    """Doubles its input, remembering the batch of every run (a sleep stands for the compute)."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.runs: list[int] = []
        self.fail_on = fail_on
        self.deadlines: list[float | None] = []

    def __call__(
        self, inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.deadlines.append(deadline)
        if self.fail_on is not None and (x == self.fail_on).any():
            raise ValueError("bad row")
        self.runs.append(x.shape[0])
        time.sleep(0.01)
        return {"y": x * 2}


def run(coro_factory):  # type: ignore[no-untyped-def]
    return asyncio.run(coro_factory())


def test_concurrent_requests_share_runs_up_to_the_batch_size_and_get_their_own_rows() -> None:
    model = Model()

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=8, max_delay_s=0.005, batchable=True)
            deadline = time.perf_counter() + 10
            requests = [np.full((1, 3), i, dtype=np.float32) for i in range(32)]
            outcomes = await asyncio.gather(*(batcher.submit({"x": r}, ["y"], deadline) for r in requests))
            batcher.close()
            return list(zip(requests, outcomes, strict=True))

    pairs = run(scenario)
    for request, outcome in pairs:
        assert outcome.results is not None and np.array_equal(outcome.results["y"], request * 2)
    assert max(model.runs) == 8 and sum(model.runs) == 32 and len(model.runs) <= 5  # 4 full batches (+1 early)


def test_requests_with_other_shapes_or_outputs_are_never_mixed() -> None:
    model = Model()

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=8, max_delay_s=0.005, batchable=True)
            deadline = time.perf_counter() + 10
            a = batcher.submit({"x": np.ones((1, 3), np.float32)}, ["y"], deadline)
            b = batcher.submit({"x": np.ones((1, 4), np.float32)}, ["y"], deadline)
            out_a, out_b = await asyncio.gather(a, b)
            assert out_a.results["y"].shape == (1, 3) and out_b.results["y"].shape == (1, 4)
            batcher.close()

    run(scenario)
    assert model.runs == [1, 1]


def test_a_failing_request_does_not_fail_the_ones_batched_with_it() -> None:
    model = Model(fail_on=13.0)

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=8, max_delay_s=0.01, batchable=True)
            deadline = time.perf_counter() + 10
            values = [1.0, 13.0, 2.0]
            results = await asyncio.gather(
                *(batcher.submit({"x": np.full((1, 2), v, np.float32)}, ["y"], deadline) for v in values),
                return_exceptions=True,
            )
            batcher.close()
            return results

    good, bad, other = run(scenario)
    assert isinstance(bad, ValueError)
    assert good.results["y"][0, 0] == 2.0 and other.results["y"][0, 0] == 4.0


def test_a_shared_run_stopped_at_its_deadline_fails_every_member_and_is_not_run_again() -> None:
    class Stopped(Model):
        def __call__(
            self, inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None = None
        ) -> dict[str, np.ndarray]:
            self.runs.append(inputs["x"].shape[0])
            self.deadlines.append(deadline)
            raise DeadlineExceeded(0.5)

    model = Stopped()

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=8, max_delay_s=0.02, batchable=True)
            now = time.perf_counter()
            results = await asyncio.gather(
                *(batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], now + d) for d in (5, 9, 7)),
                return_exceptions=True,
            )
            batcher.close()
            return [now, *results]

    now, *results = run(scenario)
    assert all(isinstance(r, DeadlineExceeded) for r in results)
    assert model.runs == [3], "a stopped run must not be repeated request by request"
    assert model.deadlines == [pytest.approx(now + 9)], "a shared run is stopped at its latest member's deadline"


def test_a_request_past_its_deadline_is_not_run_and_unbatchable_models_run_one_by_one() -> None:
    model = Model()

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=8, max_delay_s=0.0, batchable=False)
            late = await batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], time.perf_counter() - 1)
            assert late.results is None and late.waited_s >= 0
            now = time.perf_counter() + 10
            await asyncio.gather(*(batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], now) for _ in range(4)))
            batcher.close()

    run(scenario)
    assert model.runs == [1, 1, 1, 1]


@pytest.mark.parametrize("rows", [3, 9])
def test_a_request_larger_than_the_batch_runs_alone(rows: int) -> None:
    model = Model()

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=4, max_delay_s=0.0, batchable=True)
            outcome = await batcher.submit({"x": np.ones((rows, 2), np.float32)}, ["y"], time.perf_counter() + 10)
            assert outcome.results is not None and outcome.results["y"].shape == (rows, 2)
            batcher.close()

    run(scenario)
    assert model.runs == [rows]


# -- the batcher can lose neither a request nor itself (issue 27) -------------------------------------------------


def _answers(batcher: Batcher, requests: list[np.ndarray], deadline: float) -> list:  # type: ignore[type-arg]
    return [batcher.submit({"x": r}, ["y"], deadline) for r in requests]


def test_requests_of_40_40_and_10_rows_against_a_batch_of_64_are_all_answered() -> None:
    """The reproduction: the batch skips the second 40 and takes the 10, and taking it out of the queue compared
    two requests' tensors, which raised and killed the dispatcher with its worker slot."""
    model = Model()

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=64, max_delay_s=0.01, batchable=True)
            requests = [np.full((n, 3), i, np.float32) for i, n in enumerate((40, 40, 10))]
            first = await asyncio.wait_for(asyncio.gather(*_answers(batcher, requests, time.perf_counter() + 5)), 5)
            again = await asyncio.wait_for(batcher.submit({"x": requests[2]}, ["y"], time.perf_counter() + 5), 5)
            batcher.close()
            return [*zip(requests, first, strict=True), (requests[2], again)]

    for request, outcome in run(scenario):
        assert outcome.results is not None and np.array_equal(outcome.results["y"], request * 2)
    assert sorted(model.runs) == [10, 40, 50]


def test_interleaved_sequence_lengths_never_share_a_run_and_are_all_answered() -> None:
    model = Model()

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=64, max_delay_s=0.01, batchable=True)
            requests = [np.full((1, 64 if i % 2 else 128), i, np.float32) for i in range(9)]
            outcomes = await asyncio.wait_for(asyncio.gather(*_answers(batcher, requests, time.perf_counter() + 5)), 5)
            batcher.close()
            return list(zip(requests, outcomes, strict=True))

    for request, outcome in run(scenario):
        assert outcome.results is not None and np.array_equal(outcome.results["y"], request * 2)


def test_a_failure_in_the_batching_machinery_fails_what_it_held_and_the_dispatcher_goes_on() -> None:
    model = Model()
    failures: list[BaseException] = []

    async def scenario() -> tuple:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                model, pool, workers=1, batch_rows=8, max_delay_s=0.0, batchable=True, on_failure=failures.append
            )
            original = batcher._take
            calls = 0

            def take_once_broken() -> list:  # type: ignore[type-arg]
                nonlocal calls
                calls += 1
                taken = original()
                if calls == 1:
                    raise RuntimeError("a bug in batching")
                return taken

            batcher._take = take_once_broken  # type: ignore[method-assign]
            first = await asyncio.wait_for(
                asyncio.gather(batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], time.perf_counter() + 5),
                               return_exceptions=True), 5)  # fmt: skip
            later = await asyncio.wait_for(
                batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], time.perf_counter() + 5), 5
            )
            health = batcher.health()
            batcher.close()
            return first[0], later, health, batcher.failures

    first, later, health, count = run(scenario)
    assert isinstance(first, BatcherFailure)
    assert later.results is not None and health.ready and health.live
    assert count == 1 and len(failures) == 1


def test_a_run_that_outlasts_its_deadline_is_answered_and_readiness_then_liveness_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Windows wide enough that a loaded machine (this tier runs beside lint and the exports) cannot close them
    # early: a second to start the run, and readiness polled for after the release rather than slept for.
    grace = 0.3
    monkeypatch.setattr(batching, "STUCK_GRACE_S", grace)
    release = threading.Event()

    def stuck(inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None) -> dict[str, np.ndarray]:
        release.wait(10)  # a kernel the terminate flag cannot interrupt
        return {"y": inputs["x"]}

    async def scenario() -> tuple:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(stuck, pool, workers=1, batch_rows=8, max_delay_s=0.0, batchable=True, stall_limit_s=1)
            started = time.perf_counter()
            running = batcher.submit({"x": np.ones((1, 2), np.float32)}, ["y"], started + 1.0)
            queued = batcher.submit({"x": np.ones((1, 3), np.float32)}, ["y"], started + 1.0)  # another shape
            answers = await asyncio.wait_for(asyncio.gather(running, queued, return_exceptions=True), 10)
            took = time.perf_counter() - started
            now = time.perf_counter()
            first, later = batcher.health(now), batcher.health(now + 1.5)
            release.set()
            for _ in range(500):
                if (after := batcher.health()).ready:
                    break
                await asyncio.sleep(0.01)
            batcher.close()
            return answers, took, first, later, after

    (running, queued), took, first, later, after = run(scenario)
    assert isinstance(running, RunOverdue)
    assert queued.results is None, "a request still queued at its deadline is answered without running"
    assert took >= 1.0 + grace, "a running request is answered overdue only once its deadline and the grace passed"
    assert not first.ready and first.live and "past their requests' deadlines" in first.reason
    assert not later.ready and not later.live
    assert after.ready and after.live


def test_a_client_that_leaves_frees_its_place_and_its_request_never_runs() -> None:
    model = Model()

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=1, max_delay_s=0.0, batchable=True)
            deadline = time.perf_counter() + 5
            busy = asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), 1, np.float32)}, ["y"], deadline))
            leaving = asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), 7, np.float32)}, ["y"], deadline))
            await asyncio.sleep(0)
            leaving.cancel()
            await asyncio.gather(busy, return_exceptions=True)
            assert batcher.queued == 0
            batcher.close()

    run(scenario)
    assert model.runs == [1]


_ROWS = st.integers(min_value=1, max_value=70)
_REQUEST = st.tuples(
    _ROWS,
    st.sampled_from([3, 5]),  # sequence length: requests of other lengths never share a run
    st.sampled_from([("y",), ("y", "z"), ("z",)]),  # outputs asked for
    st.sampled_from([-0.01, 0.02, 5.0]),  # deadline from now: already past, tight, ample
    st.one_of(st.none(), st.sampled_from([0.0, 0.005])),  # the client leaves after this long
    st.booleans(),  # its rows make the model raise
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_REQUEST, min_size=1, max_size=12), batch_rows=st.sampled_from([1, 8, 64]))
def test_every_request_gets_its_own_answer_whatever_it_is_batched_with(requests: list, batch_rows: int) -> None:  # type: ignore[type-arg]
    def model(inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None) -> dict[str, np.ndarray]:
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError("bad row")
        time.sleep(0.0002 * x.shape[0])
        return {name: x * 2 if name == "y" else x + 1 for name in outputs}

    async def one(batcher: Batcher, index: int, spec: tuple) -> tuple:  # type: ignore[type-arg]
        rows, length, outputs, deadline_in, leave_after, bad = spec
        x = np.full((rows, length), -1.0 if bad else float(index), np.float32)
        task = asyncio.ensure_future(batcher.submit({"x": x}, list(outputs), time.perf_counter() + deadline_in))
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            task.cancel()
        try:
            return spec, x, await task
        except BaseException as exc:  # every way of ending is checked below
            return spec, x, exc

    async def scenario() -> tuple:  # type: ignore[type-arg]
        with ThreadPoolExecutor(2) as pool:
            batcher = Batcher(model, pool, workers=2, batch_rows=batch_rows, max_delay_s=0.002, batchable=True)
            answers = await asyncio.wait_for(
                asyncio.gather(*(one(batcher, i, spec) for i, spec in enumerate(requests))), 10
            )
            for _ in range(200):  # runs whose clients left still finish (the worker is busy until then)
                if batcher._slots._value == 2:
                    break
                await asyncio.sleep(0.005)
            state = batcher.queued, batcher._slots._value, batcher.failures, batcher.health()
            batcher.close()
            return answers, state

    answers, (queued, free_slots, failures, health) = run(scenario)
    for spec, x, answer in answers:
        _, _, outputs, _, leave_after, bad = spec
        if isinstance(answer, asyncio.CancelledError):
            assert leave_after is not None
        elif isinstance(answer, BaseException):
            assert isinstance(answer, (ValueError, DeadlineExceeded)), repr(answer)
            assert bad or isinstance(answer, DeadlineExceeded)
        elif answer.results is not None:
            assert not bad and sorted(answer.results) == sorted(outputs)
            for name in outputs:
                assert np.array_equal(answer.results[name], x * 2 if name == "y" else x + 1)
    assert queued == 0 and free_slots == 2 and failures == 0 and health.ready


class SlowModel(Model):
    """Takes ``seconds`` per run."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(
        self, inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        self.deadlines.append(deadline)
        time.sleep(self.seconds)
        return {"y": inputs["x"] * 2}


def test_a_client_deadline_keeps_a_request_from_starting_late_but_never_stops_a_run() -> None:
    """``start_by`` (a gRPC client's own deadline) drops a request still queued then; a run that started before it
    goes on to its end, stopped only at the server's deadline (stopping OpenVINO runs often corrupted later ones)."""
    model = SlowModel(0.2)

    async def scenario() -> tuple[batching.Outcome, batching.Outcome]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=1, max_delay_s=0.0, batchable=False)
            now = time.perf_counter()
            running = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 2))}, ["y"], now + 10, now + 0.05))
            await asyncio.sleep(0.02)  # it has started
            queued = await batcher.submit({"x": np.ones((1, 2))}, ["y"], now + 10, now + 0.05)
            outcome = await running
            batcher.close()
            return outcome, queued

    ran, dropped = run(scenario)
    assert ran.results is not None and np.array_equal(ran.results["y"], np.full((1, 2), 2.0))
    assert dropped.results is None  # still queued at its start_by: it never ran
    assert len(model.deadlines) == 1 and model.deadlines[0] is not None
    assert model.deadlines[0] > time.perf_counter() + 5  # the run's stop deadline is the server's, not start_by
