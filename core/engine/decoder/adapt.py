"""Adapting a decoder: the levers that matter for decoding, each candidate measured on its prefill and decode
workload and scored on real text against FP32, the fastest that meets every SLO shipped.

Decoding one token at a time is memory-bound: every step reads every weight. So the levers are the weights' bits
(int8 and int4 blocks, ONNX Runtime's MatMulNBits at accuracy level 0 or 4, NNCF's int4 for OpenVINO, the
embedding table in 4 bits), int8 dynamic quantization, the runtime (ONNX Runtime or OpenVINO, measured, never
ranked), and threads. The candidates are enumerated and measured in the order most likely to win (low bits
first), within ``budget`` candidates; FP32 is always measured and is the answer when nothing else meets the SLOs
and the perplexity budget. Memory is the variant's bytes plus the KV cache of ``concurrency`` sequences at the
context the policy names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import onnx
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.decoder import quality as quality_mod
from metainfer.core.engine.decoder.quality import DecoderQuality, TeacherForced
from metainfer.core.engine.decoder.signature import DecoderSignature
from metainfer.core.engine.decoder.stepper import DecoderStepper
from metainfer.core.engine.decoder.workload import DecoderMeasurement, DecoderWorkload, measure
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import Session
from metainfer.core.engine.transforms.build import ensure_node_names

TrialStatus = Literal["ok", "failed", "rejected"]
QUALITY_WINDOW = 128
NAME_LIMIT = 300


class DecoderConstraints(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_p95_ms: float | None = Field(None, gt=0, description="time to first token of the workload's prompt")
    tpot_p95_ms: float | None = Field(None, gt=0, description="time per output token")
    min_tokens_per_s: float | None = Field(None, gt=0, description="decode tokens/s of one sequence")
    max_perplexity_rise: float = Field(0.03, ge=0, description="relative to FP32 on the reference text")
    max_memory_mib: float | None = Field(None, gt=0, description="variant weights plus the KV cache at max context")
    quality_tokens: int = Field(512, ge=16, description="tokens of the reference text scored")


class DecoderTrial(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: Recipe
    status: TrialStatus
    reason: str = ""
    measurement: DecoderMeasurement | None = None
    quality: DecoderQuality | None = None
    weights_mib: float = 0.0
    memory_mib: float = 0.0

    def describe(self) -> str:
        parts = [self.recipe.describe(), self.status]
        if self.measurement is not None:
            parts.append(self.measurement.describe())
        if self.quality is not None:
            parts.append(self.quality.describe())
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts)


class DecoderReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: DecoderWorkload
    constraints: DecoderConstraints
    signature: DecoderSignature
    trials: list[DecoderTrial]
    best: int | None = Field(description="index into trials of the shipped candidate; None: not even FP32 fits")
    reference_text: str = quality_mod.REFERENCE_TEXT_SOURCE

    @property
    def shipped(self) -> DecoderTrial | None:
        return None if self.best is None else self.trials[self.best]

    @property
    def baseline(self) -> DecoderTrial:
        return self.trials[0]


def candidates(runtimes: Sequence[str], thread_options: Sequence[int], has_matmul_nbits: bool,
               nncf: bool, logits_matmul: str | None = None) -> list[Recipe]:  # fmt: skip
    """The decoder's candidates, FP32 first, then low bits first (most likely to win decoding). MatMulNBits is
    ONNX Runtime's own operator: those candidates run there only; NNCF's DQ weights and int8 run on both.
    ``logits_matmul`` (the node projecting to the vocabulary) adds int4 with it kept float: on SmolLM2 that
    halves int4's perplexity cost (+22.7 % to +13.8 %), and where the projection is the tied embedding's, a
    quantized copy of it only adds bytes beside the float table the Gather keeps."""
    transforms: list[tuple[dict[str, object], bool]] = []  # (transform, OpenVINO runs it)
    if has_matmul_nbits and logits_matmul:
        transforms.append(({"weights": {"bits": 4, "method": "rtn", "block_size": 32, "accuracy_level": 4,
                                        "keep_float": [logits_matmul]}}, False))  # fmt: skip
    if has_matmul_nbits:
        transforms += [
            ({"weights": {"bits": 4, "method": "rtn", "block_size": 32, "accuracy_level": 4}}, False),
            ({"weights": {"bits": 4, "method": "rtn", "block_size": 32, "accuracy_level": 4, "embeddings": True}},
             False),
            ({"weights": {"bits": 4, "method": "rtn", "block_size": 128}}, False),
            ({"weights": {"bits": 8, "method": "rtn", "block_size": 32, "accuracy_level": 4}}, False),
        ]  # fmt: skip
    if nncf:
        transforms.append(({"weights": {"bits": 4, "method": "nncf", "block_size": 64, "symmetric": True}}, True))
    transforms.append(({"quantization": {"mode": "int8_dynamic"}}, True))
    recipes = [Recipe()]
    for transform, on_openvino in transforms:
        for runtime in runtimes:
            if runtime == "openvino" and not on_openvino:
                continue
            for threads in thread_options:
                recipes.append(Recipe.model_validate({"transform": transform, "session": {
                    "runtime": runtime, "intra_op_num_threads": threads}}))  # fmt: skip
    recipes += [Recipe.model_validate({"session": {"runtime": r}}) for r in runtimes if r != "onnxruntime"]
    return recipes


def logits_projection(model: onnx.ModelProto, signature: DecoderSignature) -> str | None:
    """The MatMul that writes the logits (its name as recipes name nodes), if a MatMul does."""
    named = onnx.ModelProto()
    named.CopyFrom(model)
    ensure_node_names(named)
    producer = next((n for n in named.graph.node if signature.logits in n.output), None)
    return producer.name if producer is not None and producer.op_type == "MatMul" else None


def adapt(
    base: bytes,
    signature: DecoderSignature,
    text_ids: list[int],
    prompt: list[int],
    workload: DecoderWorkload,
    constraints: DecoderConstraints,
    recipes: Sequence[Recipe],
    build: Callable[[bytes, Recipe], bytes],
    session_for: Callable[[bytes, Recipe], Session],
    budget: int | None = None,
    on_trial: Callable[[DecoderTrial], None] | None = None,
) -> tuple[DecoderReport, bytes | None]:
    """Measure ``recipes`` (the first is FP32, the reference) within ``budget`` candidates; returns the report and
    the shipped variant's bytes."""
    windows = quality_mod.windows(text_ids, QUALITY_WINDOW, constraints.quality_tokens)
    if not windows:
        raise ValueError("the reference text tokenized to fewer than two tokens")
    reference: TeacherForced | None = None
    trials: list[DecoderTrial] = []
    variants: dict[int, bytes] = {}
    for index, recipe in enumerate(list(recipes)[: budget or None]):
        try:
            variant = build(base, recipe)  # FP32 too: serving rebuilds it the same way and checks its sha256
            stepper = DecoderStepper(session_for(variant, recipe), signature)
            measurement = measure(stepper, workload, prompt)
            forced = quality_mod.teacher_forced(stepper, windows)
        except Exception as exc:  # a runtime or quantizer refusing this candidate ends only this candidate
            if index == 0:
                raise
            trial = DecoderTrial(recipe=recipe, status="failed", reason=f"{type(exc).__name__}: {exc}"[:NAME_LIMIT])
        else:
            if reference is None:
                reference = forced
            scored = quality_mod.compare(forced, reference)
            weights = len(variant) / 2**20
            memory = weights + measurement.kv_cache_mib_at_max_context
            misses = _misses(measurement, scored, memory, constraints)
            trial = DecoderTrial(recipe=recipe, status="rejected" if misses else "ok", reason="; ".join(misses),
                                 measurement=measurement, quality=scored, weights_mib=round(weights, 2),
                                 memory_mib=round(memory, 2))  # fmt: skip
            if not misses:
                variants[index] = variant
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
    best = _best(trials)
    report = DecoderReport(workload=workload, constraints=constraints, signature=signature, trials=trials, best=best)
    return report, (variants[best] if best is not None else None)


def _misses(m: DecoderMeasurement, q: DecoderQuality, memory_mib: float, c: DecoderConstraints) -> list[str]:
    misses = []
    if c.ttft_p95_ms is not None and m.ttft_ms_p95 > c.ttft_p95_ms:
        misses.append(f"TTFT p95 {m.ttft_ms_p95:.1f} ms > {c.ttft_p95_ms:g}")
    if c.tpot_p95_ms is not None and m.tpot_ms_p95 > c.tpot_p95_ms:
        misses.append(f"TPOT p95 {m.tpot_ms_p95:.2f} ms > {c.tpot_p95_ms:g}")
    if c.min_tokens_per_s is not None and m.decode_tokens_per_s < c.min_tokens_per_s:
        misses.append(f"{m.decode_tokens_per_s:.1f} tokens/s < {c.min_tokens_per_s:g}")
    if q.perplexity_rise > c.max_perplexity_rise:
        misses.append(f"perplexity {q.perplexity_rise:+.2%} over FP32 > {c.max_perplexity_rise:.2%}")
    if c.max_memory_mib is not None and memory_mib > c.max_memory_mib:
        misses.append(f"memory {memory_mib:.0f} MiB > {c.max_memory_mib:g}")
    return misses


def _best(trials: Sequence[DecoderTrial]) -> int | None:
    """The fastest decoder among those that meet everything: the geometric mean of one stream's decode tokens/s
    and the aggregate tokens/s of ``concurrency`` streams (both are what users compare), then TTFT."""
    feasible = [(i, t) for i, t in enumerate(trials) if t.status == "ok" and t.measurement is not None]
    if not feasible:
        return None

    def speed(item: tuple[int, DecoderTrial]) -> tuple[float, float]:
        m = item[1].measurement
        assert m is not None
        return (-((m.decode_tokens_per_s * m.aggregate_tokens_per_s) ** 0.5), m.ttft_ms_p50)

    return min(feasible, key=speed)[0]
