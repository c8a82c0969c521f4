"""core.engine.decoder: sampling, the generation engine's scheduling and cache budget, the carried tokenizer and
chat template, the workload measurement and teacher-forced quality."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from metainfer.agent.zoo.decoder import TinyDecoderShape, build_tiny_decoder
from metainfer.core.engine.decoder import quality, workload
from metainfer.core.engine.decoder.engine import GenerationEngine, GenerationRequest
from metainfer.core.engine.decoder.sampling import SamplingParams, next_token
from metainfer.core.engine.decoder.signature import detect
from metainfer.core.engine.decoder.stepper import DecoderStepper
from metainfer.core.engine.decoder.tokenizer import StreamingText, carried_tokenizer, embed_tokenizer
from metainfer.core.engine.errors import ModelError


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load_from_string(build_tiny_decoder())


@pytest.fixture(scope="module")
def stepper(model: onnx.ModelProto) -> DecoderStepper:
    signature = detect(model)
    assert signature is not None
    return DecoderStepper(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
                          signature)  # fmt: skip


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in model.metadata_props}


def test_greedy_is_the_argmax_and_a_seed_repeats_a_sample() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert next_token(logits, SamplingParams(temperature=0.0), np.random.default_rng(1)) == 1
    hot = SamplingParams(temperature=1.5, top_p=0.9)
    draws = [[next_token(logits, hot, rng) for _ in range(50)] for rng in (np.random.default_rng(7),) * 1]
    again = [next_token(logits, hot, np.random.default_rng(7)) for _ in range(1)]
    assert draws[0][0] == again[0] and len(set(draws[0])) > 1


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05]))
    rng = np.random.default_rng(0)
    picks = {next_token(logits, SamplingParams(temperature=1.0, top_p=0.7), rng) for _ in range(300)}
    assert picks == {0, 1}


@pytest.mark.parametrize(("field", "value"), [("temperature", 2.5), ("temperature", -0.1), ("top_p", 0.0)])
def test_out_of_range_sampling_parameters_say_which(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_the_engine_streams_every_request_and_frees_the_cache_as_each_ends(stepper: DecoderStepper) -> None:
    engine = GenerationEngine(stepper, cache_budget_tokens=64, max_context=512, max_batch=4)
    requests = [GenerationRequest(f"r{i}", [10 + i] * (3 + i), max_tokens=4 + 2 * i,
                                  sampling=SamplingParams(temperature=0.0)) for i in range(3)]  # fmt: skip
    for request in requests:
        assert engine.fits(request)
        engine.admit(request)
    assert engine.reserved_tokens == sum(r.reserved_tokens for r in requests)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    finished: dict[str, str] = {}
    rounds = 0
    while engine.running:
        for event in engine.iterate():
            if event.token is not None:
                tokens[event.request_id].append(event.token)
            if event.finish_reason:
                finished[event.request_id] = event.finish_reason
        rounds += 1
    assert finished == {"r0": "length", "r1": "length", "r2": "length"}
    assert [len(tokens[r.request_id]) for r in requests] == [4, 6, 8] and rounds == 8
    assert engine.reserved_tokens == 0
    for request in requests:  # batched with others, each gets what it gets alone
        alone = GenerationEngine(stepper, cache_budget_tokens=64, max_context=512)
        alone.admit(GenerationRequest("x", request.prompt, request.max_tokens, SamplingParams(temperature=0.0)))
        own = [e.token for _ in range(request.max_tokens) for e in alone.iterate()]
        assert own == tokens[request.request_id]


def test_a_request_that_cannot_fit_is_refused_with_the_reason_and_one_that_must_wait_does_not_fit(
    stepper: DecoderStepper,
) -> None:
    engine = GenerationEngine(stepper, cache_budget_tokens=40, max_context=32, max_batch=8)
    assert "context of 32" in (engine.refusal(GenerationRequest("a", [1] * 20, 20)) or "")
    engine = GenerationEngine(stepper, cache_budget_tokens=40, max_context=512, max_batch=8)
    assert "KV cache budget of 40" in (engine.refusal(GenerationRequest("a", [1] * 30, 20)) or "")
    first, second = GenerationRequest("a", [1] * 10, 20), GenerationRequest("b", [1] * 5, 10)
    engine.admit(first)
    assert engine.refusal(second) is None and not engine.fits(second)
    assert engine.cancel("a") and engine.fits(second) and not engine.cancel("a")


def test_a_stop_token_ends_a_request_with_stop(stepper: DecoderStepper) -> None:
    probe = GenerationEngine(stepper, cache_budget_tokens=64, max_context=512)
    probe.admit(GenerationRequest("p", [5, 6, 7], 1, SamplingParams(temperature=0.0)))
    (first,) = probe.iterate()
    engine = GenerationEngine(stepper, cache_budget_tokens=64, max_context=512)
    engine.admit(GenerationRequest("s", [5, 6, 7], 10, SamplingParams(temperature=0.0),
                                   stop_ids=frozenset({first.token or 0})))  # fmt: skip
    assert [(e.token, e.finish_reason) for e in engine.iterate()] == [(first.token, "stop")]
    assert engine.running == 0


def test_the_tiny_decoder_carries_a_byte_tokenizer_and_its_chat_template(model: onnx.ModelProto) -> None:
    codec = carried_tokenizer(_metadata(model))
    assert codec is not None
    text = "héllo, wörld ✓"
    ids = codec.encode(text)
    assert len(ids) == len(text.encode()) and codec.decode(ids) == text
    stream = StreamingText(codec)
    assert "".join(stream.push(t) for t in ids) == text  # a multi-byte character waits for its last byte
    assert codec.stop_ids == {codec.tokenizer.token_to_id("<|im_end|>")}
    prompt = codec.chat_prompt([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_hostile_chat_template_is_sandboxed_and_a_broken_tokenizer_is_refused(model: onnx.ModelProto) -> None:
    codec = carried_tokenizer(_metadata(model))
    assert codec is not None
    codec.config["chat_template"] = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ModelError, match="chat template failed"):
        codec.chat_prompt([{"role": "user", "content": "x"}])
    with pytest.raises(ModelError, match=r"tokenizer\.json does not load"):
        embed_tokenizer(onnx.ModelProto(), "{not json", "{}")


def test_the_workload_measures_first_token_and_per_token_times(stepper: DecoderStepper) -> None:
    load = workload.DecoderWorkload(prompt_tokens=16, decode_tokens=4, concurrency=3, max_context=512)
    result = workload.measure(stepper, load, workload.prompt_ids(TinyDecoderShape().vocab, 16), repeats=2)
    assert 0 < result.tpot_ms_p50 <= result.tpot_ms_p95 and 0 < result.ttft_ms_p50 <= result.ttft_ms_p95
    assert result.aggregate_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    assert result.kv_cache_mib_at_max_context == pytest.approx(3 * 512 * 512 / 2**20)


def test_teacher_forced_quality_is_exact_against_itself_and_falls_for_a_perturbed_variant(
    model: onnx.ModelProto, stepper: DecoderStepper
) -> None:
    codec = carried_tokenizer(_metadata(model))
    assert codec is not None and "Every object has an identity" in quality.reference_text()
    chunks = quality.windows(codec.encode(quality.reference_text()), window=64, max_tokens=256)
    reference = quality.teacher_forced(stepper, chunks)
    same = quality.compare(reference, reference)
    assert same.next_token_agreement == 1.0 and same.perplexity_rise == 0.0 and same.tokens == 252
    noisy = onnx.load_from_string(model.SerializeToString())
    head = next(t for t in noisy.graph.initializer if t.name == "lm_head")
    values = onnx.numpy_helper.to_array(head) + np.random.default_rng(0).normal(0, 0.5, (64, 260)).astype(np.float32)
    head.CopyFrom(onnx.numpy_helper.from_array(values, "lm_head"))
    variant = DecoderStepper(ort.InferenceSession(noisy.SerializeToString(), providers=["CPUExecutionProvider"]),
                             stepper.signature)  # fmt: skip
    worse = quality.compare(quality.teacher_forced(variant, chunks), reference)
    assert worse.next_token_agreement < 0.9 and worse.perplexity != reference.perplexity
