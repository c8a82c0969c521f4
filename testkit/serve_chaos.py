"""A seeded mix of hostile and careless clients against one ``metainfer serve``, REST and gRPC together.

For ``seconds``, a few client loops pick, each step, one of: a gRPC call with a deadline from 1 ms up, a gRPC call
cancelled at a random point, a burst of 500 streams on one fresh channel, a REST request (JSON or binary answer,
sometimes with a client timeout), a REST connection closed in the middle of its body or of its answer, and a
request with a token id past the vocabulary; batch sizes and sequence lengths vary. Every answer that comes back
is compared with the same variant run in this process; every refusal must be one a client can act on: 400 /
INVALID_ARGUMENT for a bad id and for nothing else, 503 / UNAVAILABLE with a retry hint (``Retry-After``,
``grpc-retry-pushback-ms``), or a deadline. A reset stream, a 5xx other than 503/504, INTERNAL or UNKNOWN is a
wrong answer. Then every request of the pool is sent once more over both protocols, and must be answered.

It passes when the process is alive, no answer differed, no refusal was wrong, every follow-up call succeeded and
RSS ended within ``RSS_TOLERANCE_MIB`` of where it started (tests/integration/test_serve_chaos.py; bench/serving.py
puts the figures in BENCHMARKS.md).

The model is an encoder that takes token ids (``bert_mini``: input_ids, attention_mask, token_type_ids), so that
the ids can be wrong; its pool of requests is fixed by the seed and answered in process once, before the run.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metainfer.agent.serve import grpc_messages as pb
from testkit.serve_attacks import INFER_PATH, Watch, rss_mib

RSS_TOLERANCE_MIB = 64
SETTLE_S = 6.0  # past serve's trim interval: what the warm-up freed is handed back before the baseline
BURST_STREAMS = 500
CLIENT_LOOPS = 6
BATCHES = (1, 2, 4, 8)
LENGTHS = (8, 16, 32)
POOL = 24
# Answers from a combined run and from a run of one request differ in the last bits (other GEMM blockings).
RTOL, ATOL = 1e-3, 1e-4
IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"


@dataclass(frozen=True)
class PoolRequest:
    inputs: dict[str, np.ndarray]
    expected: np.ndarray  # the first output, run in process


@dataclass
class ChaosResult:
    runtime: str
    seed: int
    seconds: float = 0.0
    calls: int = 0  # requests sent (a burst counts each of its calls)
    answered: int = 0  # answers compared with the variant in process
    mismatched: int = 0  # answers that differed from it
    wrong: int = 0  # refusals a client cannot act on, or a bad id not refused (see the module's docstring)
    followups: int = 0
    followup_failures: int = 0
    alive: bool = True
    rss_start_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_end_mib: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)  # "action outcome" -> count
    notes: list[str] = field(default_factory=list)

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    @property
    def passed(self) -> bool:
        return (
            self.alive
            and self.mismatched == 0
            and self.wrong == 0
            and self.followup_failures == 0
            and self.answered > 0
            and self.rss_end_mib - self.rss_start_mib <= RSS_TOLERANCE_MIB
        )


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def make_pool(run: Callable[[dict[str, np.ndarray]], np.ndarray], vocab: int, seed: int) -> list[PoolRequest]:
    """``POOL`` requests of mixed batch sizes and lengths, each with its answer from ``run`` (the variant in
    process)."""
    rng = np.random.default_rng(seed)
    pool = []
    for index in range(POOL):
        batch, length = BATCHES[index % len(BATCHES)], LENGTHS[index % len(LENGTHS)]
        inputs = {
            IDS: rng.integers(0, vocab, (batch, length), dtype=np.int64),
            MASK: np.ones((batch, length), dtype=np.int64),
            TYPES: rng.integers(0, 2, (batch, length), dtype=np.int64),
        }
        pool.append(PoolRequest(inputs, run(inputs)))
    return pool


def with_bad_id(inputs: dict[str, np.ndarray], vocab: int, rng: random.Random) -> dict[str, np.ndarray]:
    """The same request with one token id at or past the vocabulary."""
    ids = inputs[IDS].copy()
    ids[rng.randrange(ids.shape[0]), rng.randrange(ids.shape[1])] = vocab + rng.randrange(1000)
    return {**inputs, IDS: ids}


# -- encodings ----------------------------------------------------------------------------------------------------
def grpc_request(model: str, inputs: dict[str, np.ndarray]) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        request.raw_input_contents.append(array.astype("<i8").tobytes())
    return bytes(request.SerializeToString())


def grpc_output(data: bytes) -> np.ndarray:
    response = pb.ModelInferResponse.FromString(data)
    output = response.outputs[0]
    return np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(output.shape))


def rest_body(inputs: dict[str, np.ndarray], binary_answer: bool) -> bytes:
    doc = {
        "inputs": [
            {"name": name, "shape": list(array.shape), "datatype": "INT64", "data": array.reshape(-1).tolist()}
            for name, array in inputs.items()
        ],
        "parameters": {"binary_data_output": binary_answer},
    }
    return json.dumps(doc).encode()


def rest_output(body: bytes, header_length: str | None) -> np.ndarray:
    if header_length is None:
        output = json.loads(body)["outputs"][0]
        return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    size = int(header_length)
    output = json.loads(body[:size])["outputs"][0]
    return np.frombuffer(body[size:], dtype="<f4").reshape(output["shape"])


# -- the run -------------------------------------------------------------------------------------------------------
class Chaos:
    """The client loops against one server; ``run`` returns the result (``alive`` is the caller's to set)."""

    def __init__(
        self, port: int, grpc_port: int, pid: int, model: str, pool: list[PoolRequest], vocab: int, result: ChaosResult
    ) -> None:
        self.port, self.grpc_port, self.pid, self.model = port, grpc_port, pid, model
        self.pool, self.vocab, self.result = pool, vocab, result
        self.path = f"/v2/models/{model}/infer"
        self.outcomes: Counter[str] = Counter()
        self.session: Any = None  # the REST clients' aiohttp session, while ``run`` runs
        # One burst at a time: two at once put 1,000 streams on this process's one event loop, which then did not
        # read some answers within the server's --write-timeout (cut as slow readers: the client's doing).
        self.bursting = asyncio.Lock()

    # Each action: (name, weight). A burst is rare: it sends 500 calls at once.
    ACTIONS = (
        ("grpc", 4), ("grpc_deadline", 4), ("grpc_cancel", 3), ("grpc_bad_id", 1), ("rest", 4),
        ("rest_timeout", 2), ("rest_bad_id", 1), ("rest_cut_body", 1), ("rest_cut_answer", 1), ("burst", 0.15),
    )  # fmt: skip

    def note(self, action: str, outcome: str, *, wrong: bool = False) -> None:
        self.outcomes[f"{action} {outcome}"] += 1
        if wrong:
            self.result.wrong += 1
            if len(self.result.notes) < 20:
                self.result.notes.append(f"{action}: {outcome}")

    def check(self, action: str, got: np.ndarray, request: PoolRequest) -> None:
        self.result.answered += 1
        if got.shape != request.expected.shape or not np.allclose(got, request.expected, rtol=RTOL, atol=ATOL):
            self.result.mismatched += 1
            diff = np.abs(got - request.expected).max() if got.shape == request.expected.shape else got.shape
            if len(self.result.notes) < 20:
                self.result.notes.append(f"{action}: answer differs from the variant in process ({diff})")
        self.note(action, "OK")

    async def run(self, seconds: float, seed: int) -> ChaosResult:
        import aiohttp

        async with aiohttp.ClientSession() as self.session:
            return await self._run(seconds, seed)

    async def _run(self, seconds: float, seed: int) -> ChaosResult:
        import grpc

        watch = Watch(f"http://127.0.0.1:{self.port}", self.pid)
        await self._each_once()  # every shape once, so the runtime's buffers for them exist before the baseline
        await asyncio.sleep(SETTLE_S)
        self.result.calls = self.result.answered = 0  # the mix's figures start here (a wrong warm-up answer stays)
        self.outcomes.clear()
        self.result.rss_start_mib = rss_mib(self.pid)
        started = time.perf_counter()
        with watch.running():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
                infer = channel.unary_unary(INFER_PATH)
                loops = [
                    self._loop(infer, random.Random(seed * 1000 + i), started + seconds) for i in range(CLIENT_LOOPS)
                ]
                await asyncio.gather(*loops)
            self.result.seconds = time.perf_counter() - started
            self.result.alive = process_alive(self.pid)
            if not self.result.alive:
                self.result.outcomes = dict(sorted(self.outcomes.items()))
                return self.result
            await self._each_once(count=True)
            self.result.rss_peak_mib = watch.peak_mib
            self.result.rss_end_mib = watch.settled_mib(20.0, RSS_TOLERANCE_MIB / 2)
        self.result.outcomes = dict(sorted(self.outcomes.items()))
        return self.result

    async def _loop(self, infer: Any, rng: random.Random, until: float) -> None:
        names = [name for name, _ in self.ACTIONS]
        weights = [weight for _, weight in self.ACTIONS]
        while time.perf_counter() < until and process_alive(self.pid):
            action = rng.choices(names, weights)[0]
            request = self.pool[rng.randrange(len(self.pool))]
            await getattr(self, action)(infer, request, rng)

    # -- gRPC ------------------------------------------------------------------------------------------------------
    async def _grpc_call(self, action: str, infer: Any, request: PoolRequest, timeout: float | None,
                         bad: random.Random | None = None, cancel_after: float | None = None) -> None:  # fmt: skip
        """One call (``bad``: with a bad id drawn from this generator)."""
        import grpc

        self.result.calls += 1
        inputs = request.inputs if bad is None else with_bad_id(request.inputs, self.vocab, bad)
        call = infer(grpc_request(self.model, inputs), timeout=timeout)
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            call.cancel()
        try:
            data = await call
        except asyncio.CancelledError:
            self.note(action, "cancelled")
            return
        except grpc.aio.AioRpcError as exc:
            self._grpc_refusal(action, exc, bad is not None, deadline=timeout is not None)
            return
        if bad is not None:
            self.note(action, "answered a bad id", wrong=True)
        else:
            self.check(action, grpc_output(data), request)

    def _grpc_refusal(self, action: str, exc: Any, bad: bool, deadline: bool) -> None:
        import grpc

        code = exc.code()
        trailers = dict(exc.trailing_metadata() or ())
        if bad and code != grpc.StatusCode.UNAVAILABLE:
            ok = code == grpc.StatusCode.INVALID_ARGUMENT and IDS in (exc.details() or "")
        elif code == grpc.StatusCode.UNAVAILABLE:  # also a bad id's call, refused busy before its message was read
            ok = "grpc-retry-pushback-ms" in trailers  # a reset stream (RST_STREAM) carries no hint
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            ok = deadline
        else:
            ok = code == grpc.StatusCode.CANCELLED and action == "grpc_cancel"
        detail = "" if ok else f" ({(exc.details() or '')[:80]})"
        self.note(action, code.name + detail, wrong=not ok)

    async def grpc(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._grpc_call("grpc", infer, request, timeout=30.0)

    async def grpc_deadline(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._grpc_call("grpc_deadline", infer, request, timeout=0.001 * 10 ** rng.uniform(0, 2.7))

    async def grpc_cancel(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._grpc_call("grpc_cancel", infer, request, timeout=30.0, cancel_after=rng.uniform(0, 0.05))

    async def grpc_bad_id(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._grpc_call("grpc_bad_id", infer, request, timeout=30.0, bad=rng)

    async def burst(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        """``BURST_STREAMS`` calls at once on a channel of their own (one HTTP/2 connection)."""
        import grpc

        options = [("grpc.use_local_subchannel_pool", 1)]  # its own connection, not the shared one
        async with self.bursting, grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}", options=options) as channel:
            own = channel.unary_unary(INFER_PATH)
            picks = [self.pool[rng.randrange(len(self.pool))] for _ in range(BURST_STREAMS)]
            await asyncio.gather(*(self._grpc_call("burst", own, pick, timeout=30.0) for pick in picks))

    # -- REST ------------------------------------------------------------------------------------------------------
    async def _rest_call(self, action: str, request: PoolRequest, rng: random.Random, timeout: float | None,
                         bad: bool = False) -> None:  # fmt: skip
        import aiohttp

        self.result.calls += 1
        inputs = with_bad_id(request.inputs, self.vocab, rng) if bad else request.inputs
        body = rest_body(inputs, binary_answer=rng.random() < 0.5)
        url = f"http://127.0.0.1:{self.port}{self.path}"
        try:
            async with self.session.post(url, data=body, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                data = await response.read()
                status, headers = response.status, response.headers
        except TimeoutError:
            self.note(action, "client timeout", wrong=timeout is None)
            return
        except aiohttp.ClientError as exc:
            self.note(action, f"connection error {type(exc).__name__}", wrong=True)
            return
        if bad:
            ok = status == 400 and IDS.encode() in data
            self.note(action, str(status), wrong=not ok)
        elif status == 200:
            self.check(action, rest_output(data, headers.get("Inference-Header-Content-Length")), request)
        else:
            ok = (status == 503 and "Retry-After" in headers) or status == 504
            self.note(action, f"{status}" + ("" if ok else f" {data[:80]!r}"), wrong=not ok)

    async def rest(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._rest_call("rest", request, rng, timeout=None)

    async def rest_timeout(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._rest_call("rest_timeout", request, rng, timeout=0.001 * 10 ** rng.uniform(0, 2.7))

    async def rest_bad_id(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        await self._rest_call("rest_bad_id", request, rng, timeout=None, bad=True)

    async def rest_cut_body(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        """Headers and part of the body, then the connection closes."""
        body = rest_body(request.inputs, binary_answer=True)
        await self._raw(self._head(len(body)) + body[: rng.randrange(1, len(body))], read=0)
        self.note("rest_cut_body", "closed")

    async def rest_cut_answer(self, infer: Any, request: PoolRequest, rng: random.Random) -> None:
        """A whole request, then the connection closes after a few bytes of the answer (or none)."""
        body = rest_body(request.inputs, binary_answer=rng.random() < 0.5)
        await self._raw(self._head(len(body)) + body, read=rng.choice((0, 1, 100)))
        self.note("rest_cut_answer", "closed")

    def _head(self, length: int) -> bytes:
        return (f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()  # fmt: skip

    async def _raw(self, data: bytes, read: int) -> None:
        self.result.calls += 1
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:
            self.note("connect", f"refused ({type(exc).__name__})", wrong=True)
            return
        try:
            writer.write(data)
            await writer.drain()
            if read:
                await asyncio.wait_for(reader.read(read), 10)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            sock = writer.get_extra_info("socket")
            if sock is not None:  # close with a reset, as a killed client does
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.close()

    # -- after -----------------------------------------------------------------------------------------------------
    async def _each_once(self, count: bool = False) -> None:
        """Every pool request once over each protocol, with no deadline: every one must be answered, and right
        (``count``: as follow-ups)."""
        import grpc

        rng = random.Random(0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            infer = channel.unary_unary(INFER_PATH)
            for request in self.pool:
                for action in ("followup_grpc", "followup_rest") if count else ("warmup_grpc", "warmup_rest"):
                    answered_before = self.result.answered
                    wrong_before = self.result.wrong
                    if action.endswith("grpc"):
                        await self._grpc_call(action, infer, request, timeout=30.0)
                    else:
                        await self._rest_call(action, request, rng, timeout=30.0)
                    failed = self.result.answered == answered_before or self.result.wrong != wrong_before
                    self.result.followups += count
                    self.result.followup_failures += count and failed


def run_chaos(
    port: int, grpc_port: int, pid: int, model: str, pool: list[PoolRequest], vocab: int, *, runtime: str,
    seconds: float, seed: int,
) -> ChaosResult:  # fmt: skip
    """The whole run against a server already listening (``alive`` stays True: the caller checks its process)."""
    chaos = Chaos(port, grpc_port, pid, model, pool, vocab, ChaosResult(runtime, seed))
    return asyncio.run(chaos.run(seconds, seed))


def in_process(model: bytes, recipe_json: str) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The variant of ``recipe_json`` built from ``model`` and run in this process: its first output."""
    from metainfer.core.engine.recipe import Recipe
    from metainfer.core.engine.runtime import create_session
    from metainfer.core.engine.transforms import build_variant

    recipe = Recipe.model_validate_json(recipe_json)
    session = create_session(build_variant(model, recipe.transform, None), recipe)
    first = session.get_outputs()[0].name

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(session.run([first], inputs)[0])

    return run
