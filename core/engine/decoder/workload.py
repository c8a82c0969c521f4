"""A decoder's workload, measured: time to first token of a P-token prompt, time per output token over T decode
steps with the cache, decode tokens/s at batch 1, and aggregate tokens/s with ``concurrency`` sequences decoding
together. Warm-up first, then ``repeats`` runs; medians and p95s, like every latency metainfer reports."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.decoder.stepper import DecoderStepper

DEFAULT_PROMPT_TOKENS = 128
DEFAULT_DECODE_TOKENS = 64


class DecoderWorkload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(DEFAULT_PROMPT_TOKENS, ge=1)
    decode_tokens: int = Field(DEFAULT_DECODE_TOKENS, ge=1)
    concurrency: int = Field(1, ge=1, description="sequences decoding together for the aggregate rate")
    max_context: int = Field(2048, ge=2, description="the context the KV cache is sized for")


class DecoderMeasurement(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: DecoderWorkload
    ttft_ms_p50: float
    ttft_ms_p95: float
    tpot_ms_p50: float
    tpot_ms_p95: float
    decode_tokens_per_s: float = Field(description="one sequence: tokens per second of decode steps")
    aggregate_tokens_per_s: float = Field(description="all ``concurrency`` sequences together")
    kv_cache_mib_at_max_context: float = Field(description="the cache of ``concurrency`` sequences at max_context")

    def describe(self) -> str:
        return (f"TTFT p95 {self.ttft_ms_p95:.1f} ms ({self.workload.prompt_tokens}-token prompt), TPOT p95 "
                f"{self.tpot_ms_p95:.2f} ms, {self.decode_tokens_per_s:.1f} tok/s at batch 1, "
                f"{self.aggregate_tokens_per_s:.1f} tok/s with {self.workload.concurrency} streams")  # fmt: skip


def prompt_ids(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    """A seeded prompt of ordinary token ids (the low end of the vocabulary, where special tokens are not)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, max(2, min(vocab_size, 32000) - 16), size=length)]


def prompt_from_text(text_ids: list[int], length: int) -> list[int]:
    """The workload's prompt: the reference text's first ``length`` tokens (repeated if it is shorter)."""
    return (text_ids * (1 + length // max(1, len(text_ids))))[:length]


def measure(
    stepper: DecoderStepper, workload: DecoderWorkload, prompt: list[int], *, warmup: int = 1, repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> DecoderMeasurement:  # fmt: skip
    prompt = prompt[: workload.prompt_tokens]
    ttfts: list[float] = []
    tpots: list[float] = []
    for run in range(warmup + repeats):
        started = clock()
        logits, (cache,) = stepper.step([prompt], [stepper.empty_cache()])
        first = clock()
        token = int(np.argmax(logits[0]))
        steps: list[float] = []
        for _ in range(workload.decode_tokens - 1):
            step_started = clock()
            logits, (cache,) = stepper.step([[token]], [cache])
            token = int(np.argmax(logits[0]))
            steps.append(clock() - step_started)
        if run >= warmup:
            ttfts.append(first - started)
            tpots.extend(steps)
    aggregate = _aggregate_rate(stepper, workload, prompt, clock)
    tpot_p50 = float(np.median(tpots)) if tpots else float(np.median(ttfts))
    return DecoderMeasurement(
        workload=workload,
        ttft_ms_p50=float(np.median(ttfts)) * 1e3, ttft_ms_p95=float(np.percentile(ttfts, 95)) * 1e3,
        tpot_ms_p50=tpot_p50 * 1e3,
        tpot_ms_p95=(float(np.percentile(tpots, 95)) if tpots else tpot_p50) * 1e3,
        decode_tokens_per_s=1.0 / tpot_p50 if tpot_p50 > 0 else 0.0,
        aggregate_tokens_per_s=aggregate,
        kv_cache_mib_at_max_context=stepper.signature.cache_mib(workload.max_context, workload.concurrency),
    )  # fmt: skip


def _aggregate_rate(
    stepper: DecoderStepper, workload: DecoderWorkload, prompt: list[int], clock: Callable[[], float]
) -> float:
    """Tokens per second of ``concurrency`` sequences decoding in the same steps (after their prefill)."""
    streams = workload.concurrency
    prompts = [prompt[: max(1, len(prompt) - i)] for i in range(streams)]  # ragged, as real traffic is
    logits, caches = stepper.step(prompts, [stepper.empty_cache() for _ in prompts])
    tokens = [[int(np.argmax(row))] for row in logits]
    steps = max(1, workload.decode_tokens - 1)
    started = clock()
    for _ in range(steps):
        logits, caches = stepper.step(tokens, caches)
        tokens = [[int(np.argmax(row))] for row in logits]
    elapsed = clock() - started
    return streams * steps / elapsed if elapsed > 0 else 0.0
