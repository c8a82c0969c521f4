"""Iteration-level batching of generation requests within a bounded KV cache.

Each ``iterate`` is one scheduling round: the requests admitted since the last round are prefilled together (their
first token is their time to first token), then every running request decodes one token in one batched step. A
request joins or leaves between steps, never waits for another to finish.

Admission reserves the cache a request can grow to (prompt plus ``max_tokens``), so a running request never runs
out of cache and nothing is ever preempted; what does not fit waits in the caller's bounded queue (serving answers
429 beyond it). A finished or cancelled request frees its reservation at once.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from metainfer.core.engine.decoder.sampling import SamplingParams, next_token
from metainfer.core.engine.decoder.stepper import DecoderStepper, SequenceCache

FinishReason = Literal["stop", "length", "cancelled", "error", "expired"]


@dataclass
class GenerationRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    stop_ids: frozenset[int] = frozenset()

    @property
    def reserved_tokens(self) -> int:
        return len(self.prompt) + self.max_tokens


@dataclass(frozen=True)
class TokenEvent:
    """A token for a request, or its end (``token`` None with a reason), or both for its last token."""

    request_id: str
    token: int | None
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass
class _Running:
    request: GenerationRequest
    rng: np.random.Generator
    cache: SequenceCache | None = None
    generated: int = 0
    last_token: int | None = None


@dataclass
class StepTimes:
    """Seconds of the last round's prefill and decode steps, and how many sequences each carried."""

    prefill_s: float = 0.0
    prefilled: int = 0
    decode_s: float = 0.0
    decoded: int = 0


class GenerationEngine:
    def __init__(
        self, stepper: DecoderStepper, *, cache_budget_tokens: int, max_context: int, max_batch: int = 16,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:  # fmt: skip
        if cache_budget_tokens < 1 or max_context < 2 or max_batch < 1:
            raise ValueError("cache budget, context and batch must be positive")
        self.stepper = stepper
        self.cache_budget_tokens = cache_budget_tokens
        self.max_context = max_context
        self.max_batch = max_batch
        self.clock = clock
        self._running: dict[str, _Running] = {}
        self.reserved_tokens = 0
        self.last_round = StepTimes()

    def refusal(self, request: GenerationRequest) -> str | None:
        """Why ``request`` can never run here (its reservation exceeds the context or the whole cache); None when
        it can, now or once others finish."""
        if not request.prompt:
            return "the prompt is empty after tokenization"
        if request.max_tokens < 1:
            return "max_tokens must be at least 1"
        if request.reserved_tokens > self.max_context:
            return (f"the prompt ({len(request.prompt)} tokens) plus max_tokens ({request.max_tokens}) exceeds the "
                    f"model's context of {self.max_context} tokens")  # fmt: skip
        if request.reserved_tokens > self.cache_budget_tokens:
            return (f"the prompt plus max_tokens ({request.reserved_tokens} tokens) exceeds this server's KV cache "
                    f"budget of {self.cache_budget_tokens} tokens")  # fmt: skip
        return None

    def fits(self, request: GenerationRequest) -> bool:
        return (len(self._running) < self.max_batch
                and self.reserved_tokens + request.reserved_tokens <= self.cache_budget_tokens)  # fmt: skip

    def admit(self, request: GenerationRequest) -> None:
        why = self.refusal(request)
        if why is not None:
            raise ValueError(why)
        if not self.fits(request):
            raise RuntimeError("admit called for a request that does not fit; check fits() first")
        if request.request_id in self._running:
            raise ValueError(f"request {request.request_id!r} is already running")
        seed = request.seed if request.seed is not None else secrets.randbits(64)
        self._running[request.request_id] = _Running(request, np.random.default_rng(seed))
        self.reserved_tokens += request.reserved_tokens

    def cancel(self, request_id: str) -> bool:
        """Drop a request and free its cache; False if it was not running."""
        running = self._running.pop(request_id, None)
        if running is None:
            return False
        self.reserved_tokens -= running.request.reserved_tokens
        return True

    @property
    def running(self) -> int:
        return len(self._running)

    def cached_tokens(self) -> int:
        return sum(r.cache.length for r in self._running.values() if r.cache is not None)

    def iterate(self) -> list[TokenEvent]:
        """One round: prefill the newly admitted, then one decode step for the rest. Returns the events."""
        events: list[TokenEvent] = []
        self.last_round = StepTimes()
        fresh = [r for r in self._running.values() if r.cache is None]
        ongoing = [r for r in self._running.values() if r.cache is not None]
        if fresh:
            started = self.clock()
            events += self._step(fresh, [r.request.prompt for r in fresh])
            self.last_round.prefill_s, self.last_round.prefilled = self.clock() - started, len(fresh)
        ongoing = [r for r in ongoing if r.request.request_id in self._running]
        if ongoing:
            started = self.clock()
            events += self._step(ongoing, [[r.last_token] for r in ongoing if r.last_token is not None])
            self.last_round.decode_s, self.last_round.decoded = self.clock() - started, len(ongoing)
        return events

    def _step(self, batch: list[_Running], tokens: list[list[int]]) -> list[TokenEvent]:
        caches = [r.cache if r.cache is not None else self.stepper.empty_cache() for r in batch]
        try:
            logits, grown = self.stepper.step(tokens, caches)
        except Exception as exc:  # the runtime's own error types; every request in the step ends with it
            events = []
            for r in batch:
                self.cancel(r.request.request_id)
                events.append(TokenEvent(r.request.request_id, None, "error", f"{type(exc).__name__}: {exc}"[:500]))
            return events
        events = []
        for row, r in enumerate(batch):
            token = next_token(logits[row], r.request.sampling, r.rng)
            r.cache, r.last_token = grown[row], token
            r.generated += 1
            reason: FinishReason | None = None
            if token in r.request.stop_ids:
                reason = "stop"
            elif r.generated >= r.request.max_tokens:
                reason = "length"
            events.append(TokenEvent(r.request.request_id, token, reason))
            if reason is not None:
                self.cancel(r.request.request_id)
        return events
