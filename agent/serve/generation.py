"""Serving a decoder: OpenAI-compatible completions and chat completions, streamed or whole.

One thread runs ``core.engine.decoder.engine.GenerationEngine``: each round it admits waiting requests in arrival
order while the KV cache budget holds them, prefills them, and decodes one token for every running request in one
batched step. Requests beyond the running ones wait in a queue of ``--max-queue``; past it a request is answered
429 with Retry-After at once. A client that disconnects (aiohttp cancels its handler) leaves the queue or frees its
cache at the next round; a request that can never fit (prompt plus max_tokens beyond the context or the whole
cache) is a 400 saying so.

Metrics: time to first token and time per output token histograms (the decoder's SLOs), tokens in and out,
requests waiting and running, and the cache reserved against its budget.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from metainfer.agent.serve.metrics import LABELS, ServingMetrics
from metainfer.agent.serve.openai_protocol import (
    DEFAULT_COMPLETION_TOKENS,
    ChatRequest,
    CompletionRequest,
    RequestError,
    parse,
)
from metainfer.core.engine.decoder.engine import GenerationEngine, GenerationRequest, TokenEvent
from metainfer.core.engine.decoder.sampling import SamplingParams
from metainfer.core.engine.decoder.stops import StopMatcher
from metainfer.core.engine.decoder.tokenizer import StreamingText, TextCodec
from metainfer.core.engine.errors import ModelError

if TYPE_CHECKING:
    from metainfer.agent.serve.dataplane import DataPlane
    from metainfer.agent.serve.model import Decoder

log = logging.getLogger("metainfer.serve.generation")
TOKEN_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
RETRY_AFTER_S = 1
# A chat request without max_tokens reserves this much cache at most (OpenAI's default runs to the context, which
# would hold a whole context's reservation per request).
DEFAULT_CHAT_TOKENS = 512
IDLE_WAIT_S = 0.5


class GenerationMetrics:
    def __init__(self, serving: ServingMetrics, labels: dict[str, str]) -> None:
        registry = serving.registry
        self.ttft = Histogram("metainfer_generation_time_to_first_token_seconds",
                              "From a generation request's arrival to its first token, seconds.", LABELS,
                              buckets=TOKEN_BUCKETS, registry=registry).labels(**labels)  # fmt: skip
        self.tpot = Histogram("metainfer_generation_time_per_output_token_seconds",
                              "Between consecutive tokens of one generation, seconds.", LABELS,
                              buckets=TOKEN_BUCKETS, registry=registry).labels(**labels)  # fmt: skip
        self.prompt_tokens = Counter("metainfer_generation_prompt_tokens", "Prompt tokens of admitted requests.",
                                     LABELS, registry=registry).labels(**labels)  # fmt: skip
        self.output_tokens = Counter("metainfer_generation_output_tokens", "Tokens generated.", LABELS,
                                     registry=registry).labels(**labels)  # fmt: skip
        self.waiting = Gauge("metainfer_generation_requests_waiting", "Requests waiting for KV cache.", LABELS,
                             registry=registry).labels(**labels)  # fmt: skip
        self.running = Gauge("metainfer_generation_requests_running", "Requests decoding.", LABELS,
                             registry=registry).labels(**labels)  # fmt: skip
        self.cache_reserved = Gauge("metainfer_generation_kv_cache_reserved_tokens",
                                    "KV cache tokens reserved by running requests (prompt plus max_tokens).",
                                    LABELS, registry=registry).labels(**labels)  # fmt: skip
        self.cache_budget = Gauge("metainfer_generation_kv_cache_budget_tokens", "The KV cache budget, tokens.",
                                  LABELS, registry=registry).labels(**labels)  # fmt: skip
        self.refused = Counter("metainfer_generation_refused", "Generation requests refused, by reason.",
                               (*LABELS, "reason"), registry=registry)  # fmt: skip
        self._labels = labels

    def refusal(self, reason: str) -> None:
        self.refused.labels(**self._labels, reason=reason).inc()


@dataclass
class _Handle:
    request: GenerationRequest
    queue: asyncio.Queue[TokenEvent]
    arrived: float = field(default_factory=time.perf_counter)


class QueueFull(Exception):
    pass


class WaitedTooLong(Exception):
    """A request waited --request-timeout for KV cache without being admitted."""


class GenerationService:
    """The engine's thread and the bounded queue in front of it."""

    def __init__(
        self, engine: GenerationEngine, metrics: GenerationMetrics, max_waiting: int, serving: ServingMetrics,
        max_wait_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.max_wait_s = max_wait_s
        self.engine = engine
        self.metrics = metrics
        self.serving = serving
        self.max_waiting = max_waiting
        self._waiting: collections.deque[_Handle] = collections.deque()
        self._handles: dict[str, _Handle] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        metrics.cache_budget.set(engine.cache_budget_tokens)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="infer-generation", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def submit(self, request: GenerationRequest) -> asyncio.Queue[TokenEvent]:
        """Queue ``request``; its events arrive on the returned queue. Raises RequestError when it can never
        fit, QueueFull when the queue is full."""
        why = self.engine.refusal(request)
        if why is not None:
            raise RequestError(why)
        handle = _Handle(request, asyncio.Queue())
        with self._lock:
            if self._beyond_capacity(request) > self.max_waiting:
                raise QueueFull()
            self._waiting.append(handle)
            self._handles[request.request_id] = handle
            self.metrics.waiting.set(len(self._waiting))
        self._wake.set()
        return handle.queue

    def _beyond_capacity(self, request: GenerationRequest) -> int:
        """How many queued requests, ``request`` last, the engine could not take now (first come, first served:
        the first that does not fit holds the ones behind it)."""
        slots = self.engine.max_batch - self.engine.running
        tokens = self.engine.cache_budget_tokens - self.engine.reserved_tokens
        queued = [handle.request for handle in self._waiting] + [request]
        for taken, candidate in enumerate(queued):
            if slots < 1 or candidate.reserved_tokens > tokens:
                return len(queued) - taken
            slots, tokens = slots - 1, tokens - candidate.reserved_tokens
        return 0

    def cancel(self, request_id: str) -> None:
        with self._lock:
            handle = self._handles.pop(request_id, None)
            if handle is None:
                return
            if handle in self._waiting:
                self._waiting.remove(handle)
                self.metrics.waiting.set(len(self._waiting))
            else:
                self._cancelled.add(request_id)
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            with self._lock:
                for request_id in self._cancelled:
                    self.engine.cancel(request_id)
                self._cancelled.clear()
                while self._waiting and self.engine.fits(self._waiting[0].request):
                    handle = self._waiting.popleft()
                    self.engine.admit(handle.request)
                    self.metrics.prompt_tokens.inc(len(handle.request.prompt))
                    self.serving.queue_wait.observe(time.perf_counter() - handle.arrived)
                expired = self._expire_waiting(time.perf_counter())
                self.metrics.waiting.set(len(self._waiting))
            if expired and self._loop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._deliver, expired)
            self.metrics.running.set(self.engine.running)
            self.metrics.cache_reserved.set(self.engine.reserved_tokens)
            if not self.engine.running:
                self._wake.wait(IDLE_WAIT_S if not self._waiting else min(IDLE_WAIT_S, self.max_wait_s))
                self._wake.clear()
                continue
            try:
                events = self.engine.iterate()
            except Exception:  # the engine ends a failing step's requests itself; this is a bug: keep serving
                log.exception("a generation round failed")
                continue
            for _ in range(self.engine.last_round.decoded):  # each decoded sequence's token took the step's time
                self.serving.compute.observe(self.engine.last_round.decode_s)
            if events and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                    self._loop.call_soon_threadsafe(self._deliver, events)

    def _expire_waiting(self, now: float) -> list[TokenEvent]:
        """Requests that waited their deadline for cache leave the queue with an answer (under the lock)."""
        expired = [h for h in self._waiting if now - h.arrived > self.max_wait_s]
        for handle in expired:
            self._waiting.remove(handle)
        return [TokenEvent(h.request.request_id, None, "expired", f"waited {now - h.arrived:.1f} s for KV cache "
                           f"(--request-timeout {self.max_wait_s:g} s) behind the generations running")
                for h in expired]  # fmt: skip

    def _deliver(self, events: list[TokenEvent]) -> None:
        for event in events:
            handle = self._handles.get(event.request_id)
            if handle is None:
                continue
            handle.queue.put_nowait(event)
            if event.finish_reason is not None:
                self._handles.pop(event.request_id, None)


class OpenAiFrontEnd:
    """The routes; ``ready`` says whether the decoder is loaded and not draining."""

    def __init__(self, service: GenerationService, codec: TextCodec, model_name: str,
                 is_ready: Callable[[], bool]) -> None:  # fmt: skip
        self.service = service
        self.codec = codec
        self.model_name = model_name
        self.is_ready = is_ready
        self.created = int(time.time())
        self._ids = itertools.count()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
        ]

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                                  "owned_by": "metainfer"}]})  # fmt: skip

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CompletionRequest)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ChatRequest)

    async def _generate(
        self, http: web.Request, kind: type[CompletionRequest] | type[ChatRequest]
    ) -> web.StreamResponse:
        """Every generation request counts as a request, and an answer >= 400 as an error, as /infer's do."""
        self.service.serving.requests.inc()
        response = await self._generate_counted(http, kind)
        if response.status >= 400:
            self.service.serving.error(response.status)
        return response

    async def _generate_counted(
        self, http: web.Request, kind: type[CompletionRequest] | type[ChatRequest]
    ) -> web.StreamResponse:
        arrived = time.perf_counter()
        if not self.is_ready():
            return _error(503, "the model is not ready (loading or shutting down)", "unavailable", retry=True)
        try:
            body = orjson.loads(await http.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}"[:300], "invalid_request_error")
        try:
            request = parse(body, kind)
            if request.model not in (None, self.model_name):
                return _error(404, f"model {request.model[:100]!r} is not served here; this server serves "
                                   f"{self.model_name!r}", "model_not_found")  # fmt: skip
            chat = isinstance(request, ChatRequest)
            text = self._prompt_text(request)
            prompt = await asyncio.get_running_loop().run_in_executor(None, self.codec.encode, text)
            limit = request.token_limit()
            if limit is None:
                room = self.service.engine.max_context - len(prompt)
                limit = (
                    min(room, self.service.engine.cache_budget_tokens - len(prompt))
                    if chat
                    else DEFAULT_COMPLETION_TOKENS
                )
            stops = StopMatcher(request.stops())
            params = SamplingParams(temperature=request.temperature, top_p=request.top_p)
        except (RequestError, ValueError, ModelError) as exc:
            self.service.metrics.refusal("invalid")
            return _error(400, str(exc)[:600], "invalid_request_error")
        generation = GenerationRequest(f"gen-{uuid.uuid4().hex[:24]}", prompt, max(1, limit), params,
                                       request.seed, self.codec.stop_ids)  # fmt: skip
        try:
            events = self.service.submit(generation)
        except RequestError as exc:
            self.service.metrics.refusal("too_long")
            return _error(400, str(exc), "context_length_exceeded")
        except QueueFull:
            self.service.metrics.refusal("queue_full")
            return _error(429, f"{self.service.max_waiting} requests are already waiting for KV cache; retry",
                          "rate_limit_exceeded", retry=True)  # fmt: skip
        try:
            tokens = self._texts(generation, events, stops, arrived)
            if request.stream:
                return await self._stream(http, generation, tokens, chat, request.include_usage())
            return await self._whole(generation, tokens, chat)
        except WaitedTooLong as exc:
            self.service.metrics.refusal("expired")
            return _error(503, str(exc), "timeout", retry=True)
        finally:
            self.service.cancel(generation.request_id)

    def _prompt_text(self, request: object) -> str:
        if isinstance(request, ChatRequest):
            return self.codec.chat_prompt([{"role": m.role, "content": m.text()} for m in request.messages])
        if isinstance(request, CompletionRequest):
            return request.prompt_text()
        raise RequestError("unknown request kind")

    async def _texts(self, generation: GenerationRequest, events: asyncio.Queue[TokenEvent], stops: StopMatcher,
                     arrived: float) -> AsyncIterator[tuple[str, str | None, int]]:  # fmt: skip
        """(text to send, finish reason or None, tokens so far) as tokens arrive; timing metrics on the way."""
        text = StreamingText(self.codec)
        last: float | None = None
        count = 0
        while True:
            event = await events.get()
            now = time.perf_counter()
            if event.finish_reason == "error":
                raise RuntimeError(event.error or "generation failed")
            if event.finish_reason == "expired":
                raise WaitedTooLong(event.error or "waited too long for KV cache")
            out = ""
            if event.token is not None:
                count += 1
                self.service.metrics.output_tokens.inc()
                if last is None:
                    self.service.metrics.ttft.observe(now - arrived)
                else:  # for a decoder the serving latency series is per output token (canaries and drift)
                    self.service.metrics.tpot.observe(now - last)
                    self.service.serving.latency.observe(now - last)
                last = now
                out = stops.feed("" if event.token in generation.stop_ids else text.push(event.token))
                if stops.stopped:
                    yield out, "stop", count
                    return
            if event.finish_reason is None:
                if out:
                    yield out, None, count
                continue
            out += stops.feed(text.flush())
            yield out + stops.flush(), "stop" if stops.stopped else event.finish_reason, count
            return

    async def _whole(self, generation: GenerationRequest, tokens: AsyncIterator[tuple[str, str | None, int]],
                     chat: bool) -> web.Response:  # fmt: skip
        parts, reason, count = [], "stop", 0
        async for piece, finish, produced in tokens:
            parts.append(piece)
            reason, count = finish or reason, produced
        text = "".join(parts)
        choice = _choice(chat, text, reason, delta=False)
        return _json({
            "id": generation.request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.model_name, "choices": [choice],
            "usage": _usage(generation, count),
        })  # fmt: skip

    async def _stream(self, http: web.Request, generation: GenerationRequest,
                      tokens: AsyncIterator[tuple[str, str | None, int]], chat: bool,
                      include_usage: bool) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(http)
        base = {"id": generation.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}  # fmt: skip
        if chat:
            await _event(response, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "finish_reason": None}]})  # fmt: skip
        count = 0
        try:
            async for piece, finish, produced in tokens:
                count = produced
                await _event(response, {**base, "choices": [_choice(chat, piece, finish, delta=True)]})
        except RuntimeError as exc:  # the step failed: the stream says so instead of ending as if complete
            await _event(response, {"error": {"message": str(exc)[:500], "type": "server_error"}})
        except WaitedTooLong as exc:
            self.service.metrics.refusal("expired")
            await _event(response, {"error": {"message": str(exc)[:500], "type": "timeout"}})
        if include_usage:
            await _event(response, {**base, "choices": [], "usage": _usage(generation, count)})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")


def _choice(chat: bool, text: str, finish: str | None, *, delta: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if delta:
        return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}


def _usage(generation: GenerationRequest, completion: int) -> dict[str, int]:
    prompt = len(generation.prompt)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(status: int, message: str, kind: str, retry: bool = False) -> web.Response:
    response = _json({"error": {"message": message, "type": kind, "param": None, "code": kind}}, status)
    if retry:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


DEFAULT_MAX_CONTEXT = 2048


def start_generation(plane: DataPlane, decoder: Decoder, loop: asyncio.AbstractEventLoop) -> OpenAiFrontEnd:
    """The engine sized by the flags and the model, its thread started, and the routes over it."""
    config = plane.config
    signature = decoder.stepper.signature
    context = config.max_context or decoder.max_context or DEFAULT_MAX_CONTEXT
    budget = max(1, config.kv_cache_bytes // signature.cache_bytes_per_token())
    engine = GenerationEngine(decoder.stepper, cache_budget_tokens=budget, max_context=context,
                              max_batch=config.max_generating)  # fmt: skip
    metrics = GenerationMetrics(plane.metrics, plane.metrics.labels)
    service = GenerationService(engine, metrics, max_waiting=config.max_queue, serving=plane.metrics,
                                max_wait_s=config.request_timeout_s)  # fmt: skip
    service.start(loop)
    log.info("generation: context %d tokens, KV cache budget %d tokens (%.0f MiB at %d bytes a token), up to %d "
             "decoding together, %d waiting", context, budget, config.kv_cache_bytes / 2**20,
             signature.cache_bytes_per_token(), config.max_generating, config.max_queue)  # fmt: skip
    return OpenAiFrontEnd(service, decoder.codec, config.model_name, lambda: plane.ready)
