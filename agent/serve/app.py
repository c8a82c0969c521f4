"""The HTTP server: KServe v2 routes, error mapping, readiness and graceful shutdown.

The socket opens first and the variant loads in a background thread, so the
liveness probe passes while a large model is fetched and rebuilt, and the
readiness probe turns green only after warm-up. Inference runs on a small
thread pool (ONNX Runtime releases the GIL), keeping the event loop free for
probes and /metrics while a batch runs.

On SIGTERM (or SIGINT) the server reports not-ready, stops accepting, lets
in-flight requests finish for at most ``drain_timeout_s``, then exits 0 —
Kubernetes sends SIGTERM on every rollout. The drain is counted here rather
than left to aiohttp's runner: its shutdown stops reading from connections at
once, so a request whose body is still arriving would starve until the
timeout instead of being answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.metrics import CONTENT_TYPE, Identity, ServingMetrics
from metainfer.agent.serve.protocol import (
    ProtocolError,
    encode_infer_response,
    model_metadata,
    parse_infer_request,
)
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import Recipe

log = logging.getLogger("metainfer.serve")
MODEL_VERSION = "1"
MAX_BODY_BYTES = 256 << 20
EXIT_INPUT = 2


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
    workers: int = 2


class Server:
    """State shared by the handlers: the loaded model (None until ready) and the metrics."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.model: model_loader.LoadedModel | None = None
        self.draining = False
        identity = Identity.from_env(config.recipe.key())
        self.metrics = ServingMetrics(identity, config.model_name, config.recipe.describe())
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="infer")
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @property
    def ready(self) -> bool:
        return self.model is not None and not self.draining

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._count_in_flight, _errors_as_json])
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

    async def drain(self, runner: web.AppRunner, timeout: float) -> None:
        """Stop listening, wait (bounded) for in-flight requests, then close every connection."""
        self.draining = True
        self.metrics.ready.set(0)
        for site in list(runner.sites):
            await site.stop()
        log.info("shutting down: draining %d in-flight request(s) for up to %.0f s", self.in_flight, timeout)
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        except TimeoutError:
            log.warning("drain timeout: %d request(s) still in flight are cancelled", self.in_flight)
        await runner.cleanup()

    # -- health and metadata ------------------------------------------------
    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "metainfer", "version": _version(), "extensions": ["binary_tensor_data"]})

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

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
    async def infer(self, request: web.Request) -> web.Response:
        self.metrics.requests.inc()
        try:
            model = self._loaded(request)
            body = await request.read()
            started = time.perf_counter()
            parsed = parse_infer_request(body, request.headers.get("Inference-Header-Content-Length"), model.signature)
            loop = asyncio.get_running_loop()
            try:
                results = await loop.run_in_executor(self.executor, model.infer, parsed.inputs, parsed.outputs)
            except InvalidArgument as exc:
                raise ProtocolError(f"ONNX Runtime rejected the inputs: {exc}") from exc
            except Exception as exc:
                log.exception("inference failed")
                raise ProtocolError(f"inference failed: {type(exc).__name__}: {exc}", status=500) from exc
            payload, header_length = encode_infer_response(self.config.model_name, MODEL_VERSION, parsed, results)
            self.metrics.latency.observe(time.perf_counter() - started)
        except ProtocolError as exc:
            self.metrics.error(exc.status)
            raise
        except web.HTTPException as exc:
            self.metrics.error(exc.status)
            raise
        if header_length is None:
            return web.Response(body=payload, content_type="application/json")
        headers = {"Inference-Header-Content-Length": str(header_length)}
        return web.Response(body=payload, headers=headers, content_type="application/octet-stream")

    def _check_name(self, request: web.Request) -> None:
        name, version = request.match_info["name"], request.match_info.get("version")
        if name != self.config.model_name:
            raise ProtocolError(f"unknown model {name!r}; this server serves {self.config.model_name!r}", 404)
        if version is not None and version != MODEL_VERSION:
            raise ProtocolError(f"model {name!r} has no version {version!r}; it has {MODEL_VERSION!r}", 404)

    def _loaded(self, request: web.Request) -> model_loader.LoadedModel:
        self._check_name(request)
        if self.model is None:
            raise ProtocolError(f"model {self.config.model_name!r} is still loading", 503)
        return self.model


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error is ``{"error": message}`` with its status: clients (tritonclient) read that field."""
    try:
        return await handler(request)
    except ProtocolError as exc:
        return web.json_response({"error": str(exc)}, status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason if exc.text is None else exc.text}, status=exc.status)
    except Exception as exc:  # the server never dies on a request
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}"}, status=500)


def serve(config: ServeConfig) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until the model fails to load (exit 2 bad input, 1 otherwise)."""
    return asyncio.run(_serve(config))


async def _serve(config: ServeConfig) -> int:
    server = Server(config)
    # After our own drain only idle connections remain, so aiohttp's own grace period can be short.
    runner = web.AppRunner(server.app(), handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("listening on %s:%d, serving model %r", config.host, config.port, config.model_name)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loading: asyncio.Future[model_loader.LoadedModel] = loop.create_future()
    threading.Thread(target=_load_in_thread, args=(config, loop, loading), name="load", daemon=True).start()
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loading.done() and not stopping.done():
        error = loading.exception()
        if error is None:
            server.model = loading.result()
            server.metrics.ready.set(1)
            log.info("ready: variant sha256 %s (base %s)", server.model.variant_sha256, server.model.base_sha256)
            await stopping
        else:
            log.error("metainfer serve: cannot load the model: %s", error)
            code = EXIT_INPUT if isinstance(error, InputError) else 1
    await server.drain(runner, config.drain_timeout_s)
    server.executor.shutdown(wait=False, cancel_futures=True)
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    return code


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
