"""The admission slots REST and gRPC share: an immediate refusal for REST, a first-come wait for gRPC calls (a burst
of them used to wait at the client, held back by HTTP/2), and a release that hands a slot over exactly once."""

from __future__ import annotations

import asyncio
import time

import pytest

from metainfer.agent.serve.dataplane import DataPlane, ServeConfig
from metainfer.agent.serve.grpc_server import PUSHBACK, retry_trailers
from metainfer.agent.serve.model import ModelSourceArgs
from metainfer.agent.serve.protocol import ProtocolError
from metainfer.core.engine.recipe import Recipe


def _server(max_queue: int, request_timeout_s: float = 30.0) -> DataPlane:
    config = ServeConfig(
        source=ModelSourceArgs(model_uri="file:///nowhere.onnx", model_sha256=None),
        recipe=Recipe(),
        model_name="m",
        max_queue=max_queue,
        request_timeout_s=request_timeout_s,
    )
    return DataPlane(config)


def test_rest_admission_refuses_at_once_and_a_release_counts_once() -> None:
    server = _server(max_queue=2)
    first, second = server.admit(), server.admit()
    with pytest.raises(ProtocolError) as busy:
        server.admit()
    assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "1"}
    first()
    first()  # a second call of the same release frees nothing more
    assert server.admitted == 1
    second()
    assert server.admitted == 0


def test_waiting_calls_get_the_slots_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        server = _server(max_queue=1)
        held = server.admit()
        order: list[int] = []

        async def call(n: int) -> None:
            release = await server.admit_waiting(time.perf_counter(), None)
            order.append(n)
            await asyncio.sleep(0.01)
            release()

        calls = [asyncio.ensure_future(call(n)) for n in range(3)]
        await asyncio.sleep(0.01)
        assert order == [] and server.admitted == 1
        held()  # handed to the first waiter: the count never drops meanwhile
        assert server.admitted == 1
        await asyncio.gather(*calls)
        assert server.admitted == 0
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_a_call_that_waits_past_its_deadline_is_refused_and_leaves_the_line() -> None:
    async def scenario() -> None:
        server = _server(max_queue=1)
        held = server.admit()
        with pytest.raises(ProtocolError) as late:
            await server.admit_waiting(time.perf_counter(), time.perf_counter() + 0.05)  # the client's deadline
        assert late.value.status == 503 and "admission slots, past its deadline" in str(late.value)
        held()
        assert server.admitted == 0  # nobody was left waiting to hand the slot to

    asyncio.run(scenario())


def test_a_cancelled_waiter_handed_a_slot_gives_it_back() -> None:
    """The slot a release hands over while the waiting call is being cancelled is not lost."""

    async def scenario() -> None:
        server = _server(max_queue=1)
        held = server.admit()
        waiting = asyncio.ensure_future(server.admit_waiting(time.perf_counter(), None))
        await asyncio.sleep(0)
        held()  # hands the slot to the waiter...
        waiting.cancel()  # ...which is cancelled before it runs again
        try:
            release = await waiting
        except asyncio.CancelledError:
            pass  # it gave the slot back as it left
        else:
            release()  # asyncio.wait_for returned the slot rather than the cancellation: the caller holds it
        assert server.admitted == 0

    asyncio.run(scenario())


def test_a_refusal_tells_grpc_clients_when_to_retry() -> None:
    assert retry_trailers({"Retry-After": "1"}) == (("retry-after", "1"), (PUSHBACK, "1000"))
    assert retry_trailers({"Connection": "close"}) == ()
