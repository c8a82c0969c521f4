"""The REST front end (KServe v2 routes, error mapping, readiness) and the process: start, load, signals, drain.

The socket opens first and the variant loads in a background thread, so the
liveness probe passes while a large model is fetched and rebuilt, and the
readiness probe turns green only after warm-up. Inference runs on a small
thread pool (ONNX Runtime releases the GIL), keeping the event loop free for
probes and /metrics while a batch runs. Admission, batching, deadlines and the
answer budget are the data plane's (dataplane.py), shared with the gRPC front
end (grpc_server.py, which this module never imports: ``serve`` is handed its
factory by the CLI).

Every REST request's cost is bounded before it is paid, because any public
endpoint meets hostile and broken clients (and by the data plane's bounds):

* the body may not exceed what the largest legal request needs (``--max-batch``
  and the model's input shapes, dynamic axes at ``--max-dynamic-dim``): a larger
  Content-Length is refused before a byte is read, and a compressed body is
  refused as soon as its inflated size passes the limit;
* the body must arrive within ``--body-timeout``, a connection that sends no
  complete request within ``--idle-timeout`` is closed;
* an answer not taken within ``--write-timeout`` cuts its connection; it is
  written a chunk at a time as the socket takes it, so it is held once;
* a client that closes its connection takes its request's work with it (aiohttp
  cancels the handler: a queued request leaves the batcher's queue);
* JSON parsing and encoding beyond a small size (``INLINE_BODY_BYTES``,
  ``INLINE_JSON_ELEMENTS``), and inflating gzip/deflate bodies (with the
  limit applied to the inflated size), run off the event loop.

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
import contextlib
import faulthandler
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from aiohttp import web

from metainfer.agent.fetch import FetchError
from metainfer.agent.serve import memory
from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.dataplane import (
    MAX_BODY_BYTES,
    MODEL_VERSION,
    DataPlane,
    FrontEnd,
    FrontEndFactory,
    ServeConfig,
    server_version,
)
from metainfer.agent.serve.encoding import content_encoding, inflate
from metainfer.agent.serve.generation import OpenAiFrontEnd, start_generation
from metainfer.agent.serve.metrics import CONTENT_TYPE
from metainfer.agent.serve.protocol import (
    InferRequest,
    ProtocolError,
    Signature,
    check_model,
    encode_infer_response,
    model_metadata,
    parse_infer_request,
)
from metainfer.core.engine.errors import InputError

log = logging.getLogger("metainfer.serve")
# Small requests are decoded and encoded on the event loop: handing them to a thread and back cost more than the
# work (32 batch-1 clients: about 0.1 ms of hops per request, which dynamic batching multiplies by the batch);
# these bounds keep what runs on the loop well under a millisecond.
INLINE_BODY_BYTES = 64 << 10
INLINE_JSON_ELEMENTS = 2048
EXIT_INPUT = 2
EXIT_DRAIN_CUT = 3  # the drain timed out with requests still in flight
SEND_CHUNK_BYTES = 64 << 10  # an answer is written this much at a time, each once the socket has taken the last
SCRATCH_REMOVAL_S = 1.0  # for a load thread that still writes into the scratch directory
STOP_RUNS_GRACE_S = 1.0  # for runs told to stop at the end of the drain to reach their next kernel boundary
LOAD_THREAD = "load"
CLIENT_GONE = (ConnectionError, asyncio.IncompleteReadError)


class RestFrontEnd:
    """The KServe v2 REST API over a ``DataPlane``: the routes, the requests it counts in flight (a shutdown waits for
    exactly those), and the REST side of the drain."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.generation: OpenAiFrontEnd | None = None  # set once a decoder is loaded
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

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
                web.get("/v1/models", self._openai),
                web.post("/v1/completions", self._openai),
                web.post("/v1/chat/completions", self._openai),
            ]
        )
        return app

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        """The OpenAI-compatible routes: a decoder's (serve/generation.py), a clear 404 for any other model."""
        if self.generation is None:
            message = ("the model is still loading" if self.plane.model is None else
                       "this model is not a decoder (no past key values): use /v2/models/{name}/infer")  # fmt: skip
            status = 503 if self.plane.model is None else 404
            return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
        handler = {"/v1/models": self.generation.models, "/v1/completions": self.generation.completions,
                   "/v1/chat/completions": self.generation.chat_completions}[request.path]  # fmt: skip
        return await handler(request)

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
            self.plane.metrics.error(response.status)
        return response

    async def _response_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Server"] = "metainfer"  # no framework or version for a scanner to match
        if self.plane.leaving:  # keep-alive ends with this response: the client reconnects to a pod that stays
            response.force_close()
            response.headers["Connection"] = "close"  # headers are prepared before this hook; say it explicitly

    async def drain(self, runner: web.AppRunner, timeout: float) -> int:
        """Stop listening, wait (bounded) for in-flight requests, then close every connection. Returns how many
        requests the timeout cut."""
        self.plane.leaving = self.plane.draining = True
        self.plane.metrics.ready.set(0)
        for site in list(runner.sites):
            await site.stop()
        log.info("shutting down: draining %d in-flight request(s) for up to %.0f s", self.in_flight, timeout)
        cut = 0
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        except TimeoutError:
            cut = self.in_flight
            self.plane.metrics.aborted("drain_timeout", cut)
            log.warning("drain timeout after %.0f s: %d request(s) still in flight are cut", timeout, cut)
        await runner.cleanup()
        return cut

    async def server_metadata(self, request: web.Request) -> web.Response:
        version = server_version()
        return web.json_response({"name": "metainfer", "version": version, "extensions": ["binary_tensor_data"]})

    async def live(self, request: web.Request) -> web.Response:
        health = self.plane.health()
        if health.live:
            return web.json_response({"live": True})
        return web.json_response({"live": False, "reason": health.reason}, status=503)

    async def health_ready(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.plane.ready}, status=200 if self.plane.ready else 503)

    async def model_ready(self, request: web.Request) -> web.Response:
        self._check_name(request)
        return web.json_response(
            {"name": self.plane.config.model_name, "ready": self.plane.ready}, status=200 if self.plane.ready else 503
        )

    async def metadata(self, request: web.Request) -> web.Response:
        model = self._loaded(request)
        return web.json_response(model_metadata(self.plane.config.model_name, [MODEL_VERSION], model.signature))

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.plane.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    # -- inference ----------------------------------------------------------

    async def infer(self, request: web.Request) -> web.StreamResponse:
        self.plane.metrics.requests.inc()
        # Whatever its end (answered, refused, cut, its client gone), it leaves memory for the idle trim to hand back.
        self.plane.answered_since_trim += 1
        received = time.perf_counter()
        self.plane.routed_at = time.monotonic()
        model = self._loaded(request)
        self.plane.refuse_if_draining()
        try:
            # The body is read and decoded before admission: a client that sends headers and then nothing holds a
            # connection (bounded by --body-timeout), never one of the --max-queue slots the complete requests need.
            encoding = content_encoding(request.headers.get("Content-Encoding"))
            limit, too_large = self.plane.body_limit(model.signature)
            body = await self._read_body(request, limit if encoding == "identity" else _wire_limit(limit), too_large)
            loop = asyncio.get_running_loop()
            header = request.headers.get("Inference-Header-Content-Length")
            decode_args = (body, encoding, limit, too_large, header, model.signature)
            if encoding == "identity" and len(body) <= INLINE_BODY_BYTES:
                parsed = _decode(*decode_args)
            else:
                parsed = await loop.run_in_executor(self.plane.codec, _decode, *decode_args)
            del body, decode_args
            # Admitted until the answer has left: the slots then bound the answers buffered for slow readers too.
            with self.plane.admission():
                results = await self.plane.run_model(model, parsed.inputs, parsed.outputs, received)
                encode_args = (self.plane.config.model_name, MODEL_VERSION, parsed, results)
                if _inline_encoding(parsed, results):
                    payload, header_length = encode_infer_response(*encode_args)
                else:
                    payload, header_length = await loop.run_in_executor(
                        self.plane.codec, encode_infer_response, *encode_args
                    )
                del results, encode_args
                response = await self._send(request, payload, header_length)
        except _SlowReader:
            return web.Response(status=499)  # counted as an error by status, as every other answer
        except CLIENT_GONE:
            self.plane.metrics.aborted("client_disconnect")
            log.debug("client went away during %s", request.path)
            return web.Response(status=499)  # never delivered; keeps the error count and the log at one line
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a connection its client closed (handler_cancellation): a queued request
            # leaves the batcher's queue, an answer is neither encoded nor kept (the drain's cut is counted there).
            if not self.plane.draining:
                self.plane.metrics.aborted("client_disconnect")
                self.plane.metrics.error(499)
            raise
        self.plane.metrics.latency.observe(time.perf_counter() - received)
        return response

    async def _send(self, request: web.Request, payload: bytes, header_length: int | None) -> web.StreamResponse:
        """Write the answer and wait until the socket has taken it; a reader that does not take it within
        --write-timeout is cut. It is written in chunks, each once the transport's buffer has drained below its
        high-water mark, so an answer waiting for a slow reader is held once (``payload``), not twice: handed to
        the transport whole, the transport copied it into its own buffer (50 readers that never read: RSS +365 MiB
        at a 256 MiB budget, measured)."""
        size = len(payload)
        connection = id(request.transport)
        self.plane.unsent_reserve(connection, size)
        response = web.StreamResponse()
        if header_length is None:
            response.content_type = "application/json"
        else:
            response.content_type = "application/octet-stream"
            response.headers["Inference-Header-Content-Length"] = str(header_length)
        response.content_length = size
        view = memoryview(payload)
        try:
            async with asyncio.timeout(self.plane.config.write_timeout_s):
                await response.prepare(request)
                for start in range(0, size, SEND_CHUNK_BYTES):
                    await response.write(view[start : start + SEND_CHUNK_BYTES])
                await response.write_eof()
            return response
        except TimeoutError:
            self.plane.metrics.aborted("slow_reader")
            if request.transport is not None:
                request.transport.abort()  # frees the unsent bytes now
            log.warning("cut a client that did not read its answer within %g s", self.plane.config.write_timeout_s)
            raise _SlowReader from None
        finally:
            self.plane.unsent.release(connection, size)
            self.plane.answered_since_trim += 1

    async def _read_body(self, request: web.Request, limit: int, too_large: str) -> bytes:
        """The body as sent, refused (413) from its Content-Length or as soon as it passes ``limit``, and (408) when
        it does not arrive within the body timeout. Compressed bodies are inflated later, off the event loop."""
        declared = request.content_length
        if declared is not None and declared > limit:
            raise ProtocolError(too_large + f" (Content-Length {declared})", 413, headers={"Connection": "close"})
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.plane.config.body_timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                chunk = await asyncio.wait_for(request.content.readany(), timeout=max(left, 0.001))
            except TimeoutError:
                raise ProtocolError(
                    f"request body not received within {self.plane.config.body_timeout_s:g} s",
                    408, headers={"Connection": "close"},
                ) from None  # fmt: skip
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ProtocolError(too_large, 413, headers={"Connection": "close"})
            chunks.append(chunk)

    def _check_name(self, request: web.Request) -> None:
        check_model(
            request.match_info["name"], request.match_info.get("version"), self.plane.config.model_name, MODEL_VERSION
        )

    def _loaded(self, request: web.Request) -> model_loader.LoadedModel:
        return self.plane.loaded(request.match_info["name"], request.match_info.get("version"))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def serve(config: ServeConfig, grpc: FrontEndFactory | None = None) -> int:
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
        code = asyncio.run(_serve(config, grpc))
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


async def _serve(config: ServeConfig, grpc: FrontEndFactory | None) -> int:
    memory.configure()
    plane = DataPlane(config)
    rest = RestFrontEnd(plane)
    trimming = asyncio.ensure_future(plane.trim_memory())
    # After our own drain only idle connections remain, so aiohttp's own grace period can be short.
    runner = web.AppRunner(
        rest.app(),
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
    grpc_front: FrontEnd | None = None
    if loading.done() and not stopping.done():
        error = loading.exception()
        if error is None and config.grpc_port and grpc is not None:
            grpc_front = grpc(plane)
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
            plane.model = loading.result()
            if plane.model.decoder is not None:
                rest.generation = start_generation(plane, plane.model.decoder, loop)
            memory.freeze_startup_objects()
            plane.metrics.ready.set(1)
            log.info("serving %s", config.recipe.describe())
            log.info("ready: variant sha256 %s (base %s)", plane.model.variant_sha256, plane.model.base_sha256)
            await stopping
            # Only a server that was ready lingers: one that never was is in no endpoints.
            await plane.linger(config.shutdown_delay_s, config.shutdown_delay_max_s, again)
    # Both doors drain at once, within the one timeout; RestFrontEnd.drain marks the data plane draining before its
    # first await, so a gRPC call arriving meanwhile is refused (refuse_if_draining).
    drains = [rest.drain(runner, config.drain_timeout_s)]
    if grpc_front is not None:
        drains.append(grpc_front.drain(config.drain_timeout_s))
    cut = sum(await asyncio.gather(*drains))
    if plane.stop_runs():
        cut = cut or 1
    if cut and code == 0:
        code = EXIT_DRAIN_CUT
    if rest.generation is not None:
        rest.generation.service.close()
    if plane.batcher is not None:
        plane.batcher.close()
    plane.executor.shutdown(wait=False, cancel_futures=True)
    plane.codec.shutdown(wait=False, cancel_futures=True)
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
