"""Dynamic batching: concurrent requests share runs up to the batch size, split back exactly, never mixed."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from metainfer.agent.serve.batching import Batcher
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
