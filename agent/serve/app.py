"""The HTTP server: KServe v2 routes, error mapping, readiness and graceful shutdown.

The socket opens first and the variant loads in a background thread, so the
liveness probe passes while a large model is fetched and rebuilt, and the
readiness probe turns green only after warm-up. Inference runs on a small
thread pool (ONNX Runtime releases the GIL), keeping the event loop free for
probes and /metrics while a batch runs.

Every request's cost is bounded before it is paid, because any public endpoint
meets hostile and broken clients:

* the body may not exceed what the largest legal request needs (``--max-batch``
  and the model's input shapes, dynamic axes at ``--max-dynamic-dim``): a larger
  Content-Length is refused before a byte is read, and a compressed body is
  refused as soon as its inflated size passes the limit;
* the body must arrive within ``--body-timeout``, a connection that sends no
  complete request within ``--idle-timeout`` is closed;
* at most ``--max-queue`` complete inference requests are admitted at once
  (a slot is taken once the body is read and decoded, and held until the
  answer has been taken by the socket); beyond that the answer is 503 with
  Retry-After;
* an answer not taken within ``--write-timeout`` cuts its connection, and the
  answers waiting for their readers are bounded (``--max-unsent-mib``);
* each request has a deadline (``--request-timeout`` from its arrival): one
  still queued then is answered 503 without running, one still running is
  stopped between kernels (``deadlines.Watchdog``) and answered 503;
* JSON parsing and encoding beyond a small size (``INLINE_BODY_BYTES``,
  ``INLINE_JSON_ELEMENTS``), and inflating gzip/deflate bodies (with the
  limit applied to the inflated size), run off the event loop.

Latency is recorded in parts: queue wait (saturation) and compute (the variant
on this hardware, what the operator's drift check reads), plus the total.

On SIGTERM (or SIGINT) the server keeps accepting and answering new requests
for ``shutdown_delay_s``: kube-proxy and load balancers go on sending new
connections to a terminating pod until the endpoints drop it, about a second
or more, and those requests must not fail (make-before-break). Meanwhile every
response carries ``Connection: close``, so keep-alive clients reconnect to the
pods that stay. A pod that still gets inference requests after the delay is
still routed: it is the last endpoint serving (kube-proxy falls back to a
terminating endpoint only when no other is ready: the only replica deleted, its
replacement still starting), so it answers on until no request has come for
``shutdown_delay_s``, at most ``shutdown_delay_max_s`` after the signal.
Readiness stays true meanwhile: a terminating pod is never ready in its
EndpointSlice whatever its probe says, and the probe is what keeps it
*serving*, the fall-back kube-proxy uses; turning it false would take the last
endpoint away before its replacement is routed. A second signal ends the delay
at once. Then the server stops listening, reports not ready, answers any new
request on an open connection 503 with ``Connection: close``, and lets
in-flight requests finish for at most ``drain_timeout_s``. Requests cut at the timeout
are counted and logged, and the exit status says whether the drain was clean
(0) or not (3). The drain is counted here rather than left to aiohttp's runner:
its shutdown stops reading from connections at once, so a request whose body
is still arriving would starve until the timeout instead of being answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import faulthandler
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from metainfer.agent.fetch import FetchError
from metainfer.agent.serve import memory
from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.batching import Batcher, Health, RunOverdue
from metainfer.agent.serve.deadlines import DeadlineExceeded
from metainfer.agent.serve.encoding import content_encoding, inflate
from metainfer.agent.serve.metrics import CONTENT_TYPE, Identity, ServingMetrics
from metainfer.agent.serve.protocol import (
    InferRequest,
    ProtocolError,
    Signature,
    check_model,
    encode_infer_response,
    max_body_bytes,
    model_metadata,
    parse_infer_request,
)
from metainfer.agent.serve.unsent import DEFAULT_MAX_UNSENT_MIB, UnsentBudget
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import Recipe

log = logging.getLogger("metainfer.serve")
MODEL_VERSION = "1"
MAX_BODY_BYTES = 256 << 20  # whatever the model: the ceiling of the derived limit
# Small requests are decoded and encoded on the event loop: handing them to a thread and back cost more than the
# work (32 batch-1 clients: about 0.1 ms of hops per request, which dynamic batching multiplies by the batch);
# these bounds keep what runs on the loop well under a millisecond.
INLINE_BODY_BYTES = 64 << 10
INLINE_JSON_ELEMENTS = 2048
EXIT_INPUT = 2
EXIT_DRAIN_CUT = 3  # the drain timed out with requests still in flight
UNSENT_CONNECTIONS = 4  # one connection may hold at most this share of --max-unsent-mib
SEND_CHUNK_BYTES = 64 << 10  # an answer is written this much at a time, each once the socket has taken the last
TRIM_INTERVAL_S = 5.0  # how often an idle server that answered something hands freed memory back
SCRATCH_REMOVAL_S = 1.0  # for a load thread that still writes into the scratch directory
STOP_RUNS_GRACE_S = 1.0  # for runs told to stop at the end of the drain to reach their next kernel boundary
LOAD_THREAD = "load"
CLIENT_GONE = (ConnectionError, asyncio.IncompleteReadError)
_ORT_NODE = re.compile(r"(node\.? ?Name:\s*'[^']*'|Name:'[^']*'|node \S+ \(\S+\))", re.IGNORECASE)


# At the shutdown delay's end, a request this recent means the pod is still routed (``Server.linger``).
STILL_ROUTED_S = 1.0


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``metainfer serve`` was told."""

    source: model_loader.ModelSourceArgs
    recipe: Recipe
    model_name: str
    host: str = "0.0.0.0"
    port: int = 8080
    max_batch: int | None = None
    drain_timeout_s: float = 20.0
    shutdown_delay_s: float = 5.0  # after SIGTERM: still answering, before the drain
    shutdown_delay_max_s: float = 0.0  # ... and on while requests still arrive, this long at most (``Server.linger``)
    workers: int = 2
    max_queue: int = 64
    grpc_port: int = 0  # the KServe v2 gRPC front end (0: none); `metainfer serve` defaults to 8081
    request_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 15.0
    grpc_max_connection_age_s: float = 300.0  # 0: none
    write_timeout_s: float = 30.0  # for an answer to leave: a reader that does not take it is cut
    max_unsent_bytes: int = DEFAULT_MAX_UNSENT_MIB << 20  # answers computed but not yet taken by their clients
    max_dynamic_dim: int = 4096
    batch_size: int | None = None  # rows one run combines; None: the recipe's batch (what the adaptation measured)
    max_queue_delay_s: float = 0.001
    # A variant whose outputs depend on their run's other rows (Recipe.batch_dependent) runs each request alone.
    isolate_batch_dependent: bool = False


class Server:
    """State shared by the handlers: the loaded model (None until ready) and the metrics."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.model: model_loader.LoadedModel | None = None
        self.leaving = False  # a signal came: every response closes its connection
        self.draining = False  # the delay is over: not listening, new requests refused
        identity = Identity.from_env(config.recipe.key())
        self.metrics = ServingMetrics(identity, config.model_name, config.recipe.describe())
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="infer")
        self.codec = ThreadPoolExecutor(max_workers=2, thread_name_prefix="codec")
        self.in_flight = 0
        self.admitted = 0  # inference requests between admission and answer (queued or running)
        self._admission_waiters: collections.deque[asyncio.Future[Callable[[], None]]] = collections.deque()
        self.batcher: Batcher | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self._unhealthy = ""  # the last reason health() gave, so a stall is logged once, not at every probe
        self.unsent = UnsentBudget(config.max_unsent_bytes, max(1, config.max_unsent_bytes // UNSENT_CONNECTIONS))
        self.answered_since_trim = 0
        self.routed_at = -math.inf  # when the last REST inference request came: this pod was still routed then

    @property
    def ready(self) -> bool:
        """Whether this pod answers inference: also while it lingers after a signal (the module's docstring)."""
        return self.model is not None and not self.draining and self.health().ready

    def health(self) -> Health:
        """Whether inference can make progress (always, until the batcher has started)."""
        health = Health(True, True) if self.batcher is None else self.batcher.health()
        if not health.ready and health.reason != self._unhealthy:
            log.error("serving cannot make progress: %s", health.reason)
        self._unhealthy = health.reason
        self.metrics.stalled.set(0 if health.ready else 1)
        return health

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[self._count_in_flight, self._count_errors, _errors_as_json]
        )
        app.on_response_prepare.append(self._response_headers)
        name = "/v2/models/{name}"
        version = "/v2/models/{name}/versions/{version}"
        app.add_routes(
            [
                web.get("/v2", self.server_metadata),
                web.get("/v2/health/live", self.live),
                web.get("/v2/health/ready", self.health_ready),
                web.get("/metrics", self.prometheus),
                *(web.get(p, self.metadata) for p in (name, version)),
                *(web.get(p + "/ready", self.model_ready) for p in (name, version)),
                *(web.post(p + "/infer", self.infer) for p in (name, version)),
            ]
        )
        return app

    @web.middleware
    async def _count_in_flight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Track requests being handled, so a shutdown waits for exactly those."""
        self.in_flight += 1
        self.idle.clear()
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    @web.middleware
    async def _count_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every inference answer >= 400 is counted by status, whatever raised it (also unhandled 500s)."""
        response = await handler(request)
        if request.method == "POST" and request.path.endswith("/infer") and response.status >= 400:
            self.metrics.error(response.status)
        return response

    async def _response_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Server"] = "metainfer"  # no framework or version for a scanner to match
        if self.leaving:  # keep-alive ends with this response: the client reconnects to a pod that stays
            response.force_close()
            response.headers["Connection"] = "close"  # headers are prepared before this hook; say it explicitly

    async def linger(self, delay_s: float, longest_s: float, cut_short: asyncio.Event) -> None:
        """Keep accepting and answering new requests (REST and gRPC), each response closing its connection, while
        the endpoints that route to this pod converge: for ``delay_s``, then for as long as REST inference requests
        still arrive (this pod is still routed: the last endpoint serving) until none has come for ``delay_s``, at
        most ``longest_s`` after the signal. Returns early when ``cut_short`` is set (a second signal).

        gRPC calls do not count: they come over HTTP/2 connections opened before the signal, which grpc.aio cannot
        end short of stopping, so they say nothing about where new connections go."""
        self.leaving = True
        if delay_s <= 0:
            return
        signalled = time.monotonic()
        lengthened = longest_s > delay_s
        deadline = signalled + max(delay_s, longest_s)
        log.info(
            "shutting down: still answering new requests for %g s while endpoints drop this pod%s (a second"
            " SIGTERM/SIGINT ends this delay)", delay_s,
            f", longer (at most {longest_s:g} s) while requests still come" if lengthened else "",
        )  # fmt: skip
        wake, told = signalled + delay_s, False
        while True:
            try:
                await asyncio.wait_for(cut_short.wait(), max(0.0, wake - time.monotonic()))
                log.info("second signal: shutdown delay cut short")
                return
            except TimeoutError:
                pass
            now, quiet_at = time.monotonic(), self.routed_at + delay_s
            # At the delay's end only a request of the last moment says the pod is still routed: the ones of the
            # second after the signal, while the endpoints converged, do not.
            recent = min(STILL_ROUTED_S, delay_s)
            if not lengthened or quiet_at <= now or (not told and now - self.routed_at > recent):
                return
            if now >= deadline:
                log.warning(
                    "shutdown delay: requests still came %.0f s after the signal; draining now (raise"
                    " --shutdown-delay-max if a replacement takes longer to be routed)", now - signalled,
                )  # fmt: skip
                return
            if not told:
                told = True
                log.info("shutdown delay: requests still come, so this pod is still routed; answering until none"
                         " has come for %g s", delay_s)  # fmt: skip
            wake = min(quiet_at, deadline)

    async def drain(self, runner: web.AppRunner, timeout: float) -> int:
        """Stop listening, wait (bounded) for in-flight requests, then close every connection. Returns how many
        requests the timeout cut."""
        self.leaving = self.draining = True
        self.metrics.ready.set(0)
        for site in list(runner.sites):
            await site.stop()
        log.info("shutting down: draining %d in-flight request(s) for up to %.0f s", self.in_flight, timeout)
        cut = 0
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        except TimeoutError:
            cut = self.in_flight
            self.metrics.aborted("drain_timeout", cut)
            log.warning("drain timeout after %.0f s: %d request(s) still in flight are cut", timeout, cut)
        await runner.cleanup()
        return cut

    def stop_runs(self) -> int:
        """Stop the ONNX Runtime runs still in progress after the drain (between kernels); returns how many."""
        stopped = self.model.watchdog.terminate_all() if self.model is not None else 0
        if stopped:
            self.metrics.runs_stopped_at_drain.inc(stopped)
            log.warning("drain over: %d inference run(s) still in progress are stopped", stopped)
        return stopped

    # -- health and metadata ------------------------------------------------
    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "metainfer", "version": _version(), "extensions": ["binary_tensor_data"]})

    async def live(self, request: web.Request) -> web.Response:
        health = self.health()
        if health.live:
            return web.json_response({"live": True})
        return web.json_response({"live": False, "reason": health.reason}, status=503)

    async def health_ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    async def model_ready(self, request: web.Request) -> web.Response:
        self._check_name(request)
        return web.json_response(
            {"name": self.config.model_name, "ready": self.ready}, status=200 if self.ready else 503
        )

    async def metadata(self, request: web.Request) -> web.Response:
        model = self._loaded(request)
        return web.json_response(model_metadata(self.config.model_name, [MODEL_VERSION], model.signature))

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    # -- inference ----------------------------------------------------------
    async def infer(self, request: web.Request) -> web.StreamResponse:
        self.metrics.requests.inc()
        received = time.perf_counter()
        self.routed_at = time.monotonic()
        model = self._loaded(request)
        self.refuse_if_draining()
        try:
            # The body is read and decoded before admission: a client that sends headers and then nothing holds a
            # connection (bounded by --body-timeout), never one of the --max-queue slots the complete requests need.
            encoding = content_encoding(request.headers.get("Content-Encoding"))
            limit, too_large = self.body_limit(model.signature)
            body = await self._read_body(request, limit if encoding == "identity" else _wire_limit(limit), too_large)
            loop = asyncio.get_running_loop()
            header = request.headers.get("Inference-Header-Content-Length")
            decode_args = (body, encoding, limit, too_large, header, model.signature)
            if encoding == "identity" and len(body) <= INLINE_BODY_BYTES:
                parsed = _decode(*decode_args)
            else:
                parsed = await loop.run_in_executor(self.codec, _decode, *decode_args)
            del body, decode_args
            # Admitted until the answer has left: the slots then bound the answers buffered for slow readers too.
            with self.admission():
                results = await self.run_model(model, parsed.inputs, parsed.outputs, received)
                encode_args = (self.config.model_name, MODEL_VERSION, parsed, results)
                if _inline_encoding(parsed, results):
                    payload, header_length = encode_infer_response(*encode_args)
                else:
                    payload, header_length = await loop.run_in_executor(self.codec, encode_infer_response, *encode_args)
                del results, encode_args
                response = await self._send(request, payload, header_length)
        except _SlowReader:
            return web.Response(status=499)  # counted as an error by status, as every other answer
        except CLIENT_GONE:
            self.metrics.aborted("client_disconnect")
            log.debug("client went away during %s", request.path)
            return web.Response(status=499)  # never delivered; keeps the error count and the log at one line
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a connection its client closed (handler_cancellation): a queued request
            # leaves the batcher's queue, an answer is neither encoded nor kept (the drain's cut is counted there).
            if not self.draining:
                self.metrics.aborted("client_disconnect")
                self.metrics.error(499)
            raise
        self.metrics.latency.observe(time.perf_counter() - received)
        return response

    async def _send(self, request: web.Request, payload: bytes, header_length: int | None) -> web.StreamResponse:
        """Write the answer and wait until the socket has taken it; a reader that does not take it within
        --write-timeout is cut. It is written in chunks, each once the transport's buffer has drained below its
        high-water mark, so an answer waiting for a slow reader is held once (``payload``), not twice: handed to
        the transport whole, the transport copied it into its own buffer (50 readers that never read: RSS +365 MiB
        at a 256 MiB budget, measured)."""
        size = len(payload)
        connection = id(request.transport)
        self.unsent_reserve(connection, size)
        response = web.StreamResponse()
        if header_length is None:
            response.content_type = "application/json"
        else:
            response.content_type = "application/octet-stream"
            response.headers["Inference-Header-Content-Length"] = str(header_length)
        response.content_length = size
        view = memoryview(payload)
        try:
            async with asyncio.timeout(self.config.write_timeout_s):
                await response.prepare(request)
                for start in range(0, size, SEND_CHUNK_BYTES):
                    await response.write(view[start : start + SEND_CHUNK_BYTES])
                await response.write_eof()
            return response
        except TimeoutError:
            self.metrics.aborted("slow_reader")
            if request.transport is not None:
                request.transport.abort()  # frees the unsent bytes now
            log.warning("cut a client that did not read its answer within %g s", self.config.write_timeout_s)
            raise _SlowReader from None
        finally:
            self.unsent.release(connection, size)
            self.answered_since_trim += 1

    def unsent_reserve(self, connection: object, size: int) -> None:
        """Reserve ``size`` bytes of answer for ``connection``, or refuse the answer (503) when the answers already
        waiting for their clients (in total, or on this connection) leave no room."""
        if not self.unsent.reserve(connection, size):
            raise ProtocolError(
                f"the server holds {self.unsent.reserved} bytes of answers its clients have not read yet; retry"
                " later", 503, headers={"Retry-After": "1"},
            )  # fmt: skip

    async def trim_memory(self) -> None:
        """Every few seconds, while nothing is admitted and something was answered since, hand freed memory back."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            if self.answered_since_trim and self.admitted == 0:
                self.answered_since_trim = 0
                await loop.run_in_executor(self.codec, memory.trim)

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise ProtocolError(
                "the server is shutting down; retry (another replica answers)",
                503, headers={"Retry-After": "1", "Connection": "close"},
            )  # fmt: skip

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """One complete inference request admitted for the block (``admit``)."""
        release = self.admit()
        try:
            yield
        finally:
            release()

    def admit(self) -> Callable[[], None]:
        """Admit one complete inference request (REST or another front end) and return what releases its slot (once,
        however often it is called): refused with 503 when ``max_queue`` requests are already queued, running or
        being sent. Whether the server drains is checked when a request arrives (``refuse_if_draining``), not here:
        one that arrived before the drain began is served."""
        if self.admitted >= self.config.max_queue:
            raise ProtocolError(
                f"the server is busy ({self.admitted} requests queued or running); retry later",
                503, headers={"Retry-After": "1"},
            )  # fmt: skip
        self.admitted += 1
        return self._releaser()

    async def admit_waiting(self, received: float, client_deadline: float | None) -> Callable[[], None]:
        """``admit``, but a request that finds every slot taken waits for one, first come first served, until its
        deadline (``run_model``'s); then it is refused 503 with Retry-After. For front ends whose clients send a
        burst at once (gRPC: HTTP/2 made such a burst wait at the client before)."""
        if self.admitted < self.config.max_queue and not self._admission_waiters:
            return self.admit()
        deadline = received + self.config.request_timeout_s
        if client_deadline is not None:
            deadline = min(deadline, client_deadline)
        waiter: asyncio.Future[Callable[[], None]] = asyncio.get_running_loop().create_future()
        self._admission_waiters.append(waiter)
        handed: Callable[[], None] | None = None
        try:
            handed = await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - time.perf_counter()))
            return handed
        except TimeoutError:
            raise ProtocolError(
                f"the request waited {time.perf_counter() - received:.1f} s for one of the {self.config.max_queue}"
                " admission slots, past its deadline; retry later", 503, headers={"Retry-After": "1"},
            ) from None  # fmt: skip
        finally:
            if handed is None:  # timed out or cancelled: leave the line, and free a slot handed over meanwhile
                if waiter.done() and not waiter.cancelled():
                    waiter.result()()
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._admission_waiters.remove(waiter)

    def _releaser(self) -> Callable[[], None]:
        """What frees one admission slot, once however often it is called: handed to the first request waiting for
        one (``admit_waiting``), else returned."""
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            while self._admission_waiters:
                waiter = self._admission_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(self._releaser())  # the slot changes hands: ``admitted`` stays
                    return
            self.admitted -= 1

        return release

    def body_limit(self, signature: Signature) -> tuple[int, str]:
        """The most bytes a legal request's (decoded) body or gRPC message needs, and the 413 message that names it."""
        limit = min(MAX_BODY_BYTES, max_body_bytes(signature, self.config.max_dynamic_dim))
        return limit, f"request larger than {limit} bytes, the most a request of batch <= {signature.max_batch} needs"

    async def _read_body(self, request: web.Request, limit: int, too_large: str) -> bytes:
        """The body as sent, refused (413) from its Content-Length or as soon as it passes ``limit``, and (408) when
        it does not arrive within the body timeout. Compressed bodies are inflated later, off the event loop."""
        declared = request.content_length
        if declared is not None and declared > limit:
            raise ProtocolError(too_large + f" (Content-Length {declared})", 413, headers={"Connection": "close"})
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.config.body_timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                chunk = await asyncio.wait_for(request.content.readany(), timeout=max(left, 0.001))
            except TimeoutError:
                raise ProtocolError(
                    f"request body not received within {self.config.body_timeout_s:g} s",
                    408, headers={"Connection": "close"},
                ) from None  # fmt: skip
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ProtocolError(too_large, 413, headers={"Connection": "close"})
            chunks.append(chunk)

    async def run_model(
        self,
        model: model_loader.LoadedModel,
        inputs: dict[str, Any],
        outputs: list[str],
        received: float,
        client_deadline: float | None = None,
    ) -> dict[str, Any]:
        """The model on an inference worker (``received``: perf_counter() when the request arrived, its deadline
        counts from there; ``client_deadline``: an earlier one the client set, past which nobody waits for the
        answer); queue wait and compute time are recorded apart. Raises ProtocolError."""
        deadline = received + self.config.request_timeout_s
        clients = client_deadline is not None and client_deadline < deadline
        if clients:
            assert client_deadline is not None
            deadline = client_deadline
        try:
            outcome = await self._batcher(model).submit(inputs, outputs, deadline)
        except InvalidArgument as exc:
            raise ProtocolError(f"the inputs do not fit the model: {_public(str(exc))}") from exc
        except RunOverdue as exc:
            self.metrics.aborted("deadline")
            log.error("request answered without its run: %s (ONNX Runtime did not stop it in time)", exc)
            raise ProtocolError(f"{exc}; the server answers without it", 504, headers={"Retry-After": "1"}) from None
        except DeadlineExceeded as exc:
            self.metrics.aborted("deadline")
            if clients:
                raise _client_deadline_passed("while it ran") from None
            log.warning("request stopped at its %g s deadline: %s", self.config.request_timeout_s, exc)
            raise ProtocolError(
                f"{exc}: the request took longer than its {self.config.request_timeout_s:g} s deadline"
                " (a smaller batch or shorter inputs run faster)", 503, headers={"Retry-After": "1"},
            ) from None  # fmt: skip
        except Exception as exc:
            log.exception("inference failed")
            raise ProtocolError(f"inference failed ({type(exc).__name__}); see the server log", status=500) from exc
        self.metrics.queue_wait.observe(outcome.waited_s)
        if outcome.results is None and clients:
            raise _client_deadline_passed(f"after {outcome.waited_s:.3f} s in the queue, before it ran")
        if outcome.results is None:
            raise ProtocolError(
                f"the request waited {outcome.waited_s:.1f} s for a worker, past its"
                f" {self.config.request_timeout_s:g} s deadline; retry later", 503, headers={"Retry-After": "1"},
            )  # fmt: skip
        self.metrics.compute.observe(outcome.compute_s)
        self.metrics.batch_rows.observe(outcome.batch_rows)
        return outcome.results

    def _batcher(self, model: model_loader.LoadedModel) -> Batcher:
        if self.batcher is None:
            signature = model.signature
            batchable = signature.dynamic_first_axes and model.batch_major
            if batchable and self.config.recipe.batch_dependent():
                if self.config.isolate_batch_dependent:
                    batchable = False
                    log.info("the variant's outputs depend on what shares its run: each request runs alone")
                else:
                    log.info(
                        "the variant's outputs depend on what shares its run: concurrent requests are combined, so"
                        " a request's outputs vary within what validation measured (report.json,"
                        " validation.batch_dependence); --batch-dependent isolate runs each request alone"
                    )
            self.batcher = Batcher(
                model.infer,
                self.executor,
                workers=self.config.workers,
                batch_rows=self.config.batch_size or self.config.recipe.batch,
                max_delay_s=self.config.max_queue_delay_s,
                batchable=batchable,
                stall_limit_s=self.config.request_timeout_s,
                on_failure=lambda exc: self.metrics.batcher_failures.inc(),
            )
        return self.batcher

    def _check_name(self, request: web.Request) -> None:
        check_model(
            request.match_info["name"], request.match_info.get("version"), self.config.model_name, MODEL_VERSION
        )

    def _loaded(self, request: web.Request) -> model_loader.LoadedModel:
        self._check_name(request)
        if self.model is None:
            raise ProtocolError(f"model {self.config.model_name!r} is still loading", 503)
        return self.model


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _client_deadline_passed(when: str) -> ProtocolError:
    """The answer for a request whose client's own deadline (shorter than the server's) passed: the client's
    runtime reports DEADLINE_EXCEEDED at that moment anyway, and this answer, racing it, must say the same."""
    return ProtocolError(f"the call's deadline passed {when}", 504)


class _SlowReader(ConnectionError):
    """The client did not read its answer within the write timeout; its connection was cut (already counted)."""


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error is ``{"error": message}`` with its status: clients (tritonclient) read that field."""
    try:
        return await handler(request)
    except ProtocolError as exc:
        response = web.json_response({"error": str(exc)}, status=exc.status, headers=exc.headers)
        if exc.headers.get("Connection") == "close":
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason if exc.text is None else exc.text}, status=exc.status)
    except CLIENT_GONE:
        log.debug("client went away during %s %s", request.method, request.path)
        return web.Response(status=499)
    except Exception as exc:  # the server never dies on a request
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response({"error": f"internal error ({type(exc).__name__}); see the server log"}, status=500)


def _decode(
    body: bytes, encoding: str, limit: int, too_large: str, header: str | None, signature: Signature
) -> InferRequest:
    return parse_infer_request(inflate(body, encoding, limit, too_large), header, signature)


def _inline_encoding(request: InferRequest, results: dict[str, Any]) -> bool:
    """Whether encoding the response costs less than handing it to a codec thread: binary outputs are one copy
    each; JSON costs per element, so only small JSON outputs are encoded on the loop."""
    json_elements = sum(int(results[n].size) for n in request.outputs if n not in request.binary_outputs)
    binary_bytes = sum(int(results[n].nbytes) for n in request.outputs if n in request.binary_outputs)
    return json_elements <= INLINE_JSON_ELEMENTS and binary_bytes <= INLINE_BODY_BYTES


def _wire_limit(limit: int) -> int:
    """What a compressed body may take on the wire: incompressible data grows by deflate's few bytes per block."""
    return limit + limit // 100 + 1024


def _public(message: str) -> str:
    """An ONNX Runtime message without the graph's internal node names (they describe the variant, not the
    request), cut to its first line."""
    first = message.strip().splitlines()[0] if message.strip() else "rejected"
    return _ORT_NODE.sub("", first).replace("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ", "")[:300]


def serve(config: ServeConfig) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until the model fails to load (exit 2 bad input, 1 otherwise)."""
    # A fatal signal (a fault in a native library: gRPC, ONNX Runtime, OpenVINO) prints every thread's Python stack
    # to stderr, the pod's log, before the process dies: the next crash is diagnosable from there.
    faulthandler.enable(all_threads=True)
    # Every temporary file of this process (the fetched model, the quantizer's work) goes under one directory that
    # serve owns, so that the exits which cannot run the context managers' clean-up still leave nothing behind:
    # each stop during a load left a copy of the model in the temporary directory.
    scratch = tempfile.mkdtemp(prefix="metainfer-serve-")
    previous, tempfile.tempdir = tempfile.tempdir, scratch
    try:
        code = asyncio.run(_serve(config))
        if any(t.name == LOAD_THREAD and t.is_alive() for t in threading.enumerate()):
            # Stopped before the model was loaded: the load thread may be inside ONNX Runtime's or OpenVINO's
            # native session build, and the interpreter's finalisation would tear their libraries down under it: a
            # SIGTERM during the load aborted serve in 6 exits of 20 ("terminate called without an active
            # exception"), and a serve faulted in libc on the node. Nothing of that load is wanted any more: leave
            # without finalising.
            log.info("stopped while the model was still loading: exiting without waiting for the load")
            _exit_now(code, scratch)
        # The drain is over. A run that ignores its terminate flag (one endless kernel) would keep the interpreter
        # waiting for its worker thread at exit, past --drain-timeout and into the kubelet's SIGKILL: leave
        # without it.
        deadline = time.monotonic() + STOP_RUNS_GRACE_S
        while (stuck := _inference_threads()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if stuck:
            log.error("%d inference run(s) did not stop; exiting without them", len(stuck))
            _exit_now(code or EXIT_DRAIN_CUT, scratch)
        return code
    finally:
        tempfile.tempdir = previous
        _remove(scratch)


def _exit_now(code: int, scratch: str) -> NoReturn:
    """Leave without the interpreter's finalisation, and so without any ``finally``: remove the scratch directory
    and flush the logs first."""
    _remove(scratch)
    logging.shutdown()
    os._exit(code)


def _remove(scratch: str) -> None:
    """Remove ``scratch`` even while a load thread still writes into it: a file it creates in a directory that
    ``rmtree`` has listed keeps that directory, so try again until the top one is gone (then nothing can be
    created under it), for at most SCRATCH_REMOVAL_S."""
    deadline = time.monotonic() + SCRATCH_REMOVAL_S
    shutil.rmtree(scratch, ignore_errors=True)
    while os.path.lexists(scratch) and time.monotonic() < deadline:
        time.sleep(0.01)
        shutil.rmtree(scratch, ignore_errors=True)
    if os.path.lexists(scratch):
        log.warning("could not remove the temporary directory %s", scratch)


async def _serve(config: ServeConfig) -> int:
    memory.configure()
    server = Server(config)
    trimming = asyncio.ensure_future(server.trim_memory())
    # After our own drain only idle connections remain, so aiohttp's own grace period can be short.
    runner = web.AppRunner(
        server.app(),
        handle_signals=False,
        shutdown_timeout=1.0,
        access_log=None,
        keepalive_timeout=config.idle_timeout_s,  # also closes connections that never complete a request
        auto_decompress=False,  # aiohttp would inflate on the event loop; encoding.inflate does it on a thread
        handler_cancellation=True,  # a client that closes its connection takes its request's work with it
    )
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info(
        "listening on %s:%d, serving model %r with %d inference worker(s)",
        config.host, config.port, config.model_name, config.workers,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    stop, again = asyncio.Event(), asyncio.Event()  # the first signal, and a second one (ends the shutdown delay)

    def signalled(sig: signal.Signals) -> None:
        log.info("%s received", sig.name)
        (again if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled, sig)
    loading: asyncio.Future[model_loader.LoadedModel] = loop.create_future()
    threading.Thread(target=_load_in_thread, args=(config, loop, loading), name=LOAD_THREAD, daemon=True).start()
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]  # typeshed: futures of two result types
    code = 0
    grpc_front = None
    if loading.done() and not stopping.done():
        error = loading.exception()
        if error is None and config.grpc_port:
            # Imported here: grpcio is loaded only when a gRPC port is asked for.
            from metainfer.agent.serve.grpc_server import GrpcFrontEnd

            grpc_front = GrpcFrontEnd(server)
            try:  # before the model is set, so REST's readiness turns green only with both doors open
                await grpc_front.start(config.host, config.grpc_port, loading.result().signature)
            except RuntimeError as exc:  # grpc's "Failed to bind": the port is taken or not ours to use
                log.error("metainfer serve: cannot listen for gRPC on %s:%d: %s", config.host, config.grpc_port, exc)
                grpc_front, code = None, 1
        if error is not None:
            log.error("metainfer serve: cannot load the model: %s", error)
            # A source that cannot be right on a retry (too large, refused address, missing, wrong sha256) is a
            # bad input; a timeout or a 5xx may pass on the next start.
            permanent_fetch = isinstance(error, FetchError) and not error.transient
            code = EXIT_INPUT if isinstance(error, InputError) or permanent_fetch else 1
        elif code == 0:
            server.model = loading.result()
            memory.freeze_startup_objects()
            server.metrics.ready.set(1)
            log.info("serving %s", server.config.recipe.describe())
            log.info("ready: variant sha256 %s (base %s)", server.model.variant_sha256, server.model.base_sha256)
            await stopping
            # Only a server that was ready lingers: one that never was is in no endpoints.
            await server.linger(config.shutdown_delay_s, config.shutdown_delay_max_s, again)
    # Both doors drain at once, within the one timeout; Server.drain marks the server draining before its first
    # await, so a gRPC call arriving meanwhile is refused (refuse_if_draining).
    drains = [server.drain(runner, config.drain_timeout_s)]
    if grpc_front is not None:
        drains.append(grpc_front.drain(config.drain_timeout_s))
    cut = sum(await asyncio.gather(*drains))
    if server.stop_runs():
        cut = cut or 1
    if cut and code == 0:
        code = EXIT_DRAIN_CUT
    if server.batcher is not None:
        server.batcher.close()
    server.executor.shutdown(wait=False, cancel_futures=True)
    server.codec.shutdown(wait=False, cancel_futures=True)
    stopping.cancel()
    trimming.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    return code


def _inference_threads() -> list[str]:
    """The inference worker threads still alive (the executor's thread_name_prefix)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("infer") and t.is_alive()]


def _load_in_thread(
    config: ServeConfig, loop: asyncio.AbstractEventLoop, future: asyncio.Future[model_loader.LoadedModel]
) -> None:
    """Load on a daemon thread: a SIGTERM during a long build must not wait for the build to finish."""

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loaded = model_loader.load(config.source, config.recipe, config.max_batch)
    except Exception as exc:
        with contextlib.suppress(RuntimeError):  # the loop may already be closed after a SIGTERM
            loop.call_soon_threadsafe(settle, None, exc)
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, loaded, None)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("metainfer")
    except PackageNotFoundError:
        return "0"
