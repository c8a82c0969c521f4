"""core.engine.decoder: a decoder found in its graph, and its cached, batched steps equal to recomputing."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from metainfer.agent.zoo.decoder import TinyDecoderShape, build_tiny_decoder
from metainfer.core.engine.decoder.signature import detect
from metainfer.core.engine.decoder.stepper import DecoderStepper
from metainfer.core.engine.errors import ModelError


@pytest.fixture(scope="module")
def tiny() -> bytes:
    return build_tiny_decoder()


@pytest.fixture(scope="module")
def stepper(tiny: bytes) -> DecoderStepper:
    signature = detect(onnx.load_from_string(tiny))
    assert signature is not None
    return DecoderStepper(ort.InferenceSession(tiny, providers=["CPUExecutionProvider"]), signature)


def test_the_tiny_decoder_is_detected_with_its_cache_layout(tiny: bytes) -> None:
    signature = detect(onnx.load_from_string(tiny))
    shape = TinyDecoderShape()
    assert signature is not None
    assert (len(signature.layers), signature.kv_heads, signature.head_dim) == (shape.layers, shape.kv_heads, 16)
    assert signature.position_ids == "position_ids" and signature.form == "attention_ops"
    assert signature.vocab_size == shape.vocab
    assert signature.cache_bytes_per_token() == 2 * 2 * 2 * 16 * 4


def test_a_single_forward_model_is_not_a_decoder_and_a_half_decoder_is_refused(tiny: bytes) -> None:
    from metainfer.agent.zoo.digits import build_digits

    assert detect(build_digits().model) is None
    model = onnx.load_from_string(tiny)
    model.graph.output.pop()  # present.1.value
    with pytest.raises(ModelError, match="present value of layer 1"):
        detect(model)


def _full_recompute_greedy(stepper: DecoderStepper, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        logits, _ = stepper.step([tokens], [stepper.empty_cache()])
        tokens.append(int(np.argmax(logits[0])))
    return tokens[len(prompt) :]


def _cached_greedy(stepper: DecoderStepper, prompt: list[int], steps: int) -> list[int]:
    logits, (cache,) = stepper.step([prompt], [stepper.empty_cache()])
    out = [int(np.argmax(logits[0]))]
    for _ in range(steps - 1):
        logits, (cache,) = stepper.step([[out[-1]]], [cache])
        out.append(int(np.argmax(logits[0])))
    return out


def test_decoding_with_the_cache_gives_the_tokens_recomputing_gives(stepper: DecoderStepper) -> None:
    prompt = [72, 101, 108, 108, 111, 32, 119]
    assert _cached_greedy(stepper, prompt, 12) == _full_recompute_greedy(stepper, prompt, 12)


def test_sequences_of_different_lengths_in_one_step_see_exactly_what_they_see_alone(stepper: DecoderStepper) -> None:
    prompts = [[5, 6, 7, 8, 9, 10, 11], [200], [40, 41, 42]]
    alone = [stepper.step([p], [stepper.empty_cache()]) for p in prompts]
    logits, caches = stepper.step(prompts, [stepper.empty_cache() for _ in prompts])
    for row, (single_logits, (single_cache,)) in enumerate(alone):
        np.testing.assert_allclose(logits[row], single_logits[0], rtol=1e-4, atol=1e-5)
        assert caches[row].length == len(prompts[row])
        np.testing.assert_allclose(caches[row].keys[1], single_cache.keys[1], rtol=1e-4, atol=1e-5)
    next_logits, grown = stepper.step([[1], [2], [3]], caches)
    for row, cache in enumerate(caches):
        single, _ = stepper.step([[row + 1]], [cache])
        np.testing.assert_allclose(next_logits[row], single[0], rtol=1e-4, atol=1e-5)
        assert grown[row].length == cache.length + 1


def test_teacher_forced_logits_cover_every_new_position(stepper: DecoderStepper) -> None:
    tokens = [10, 20, 30, 40]
    logits, cache = stepper.all_logits(tokens, stepper.empty_cache())
    assert logits.shape == (4, TinyDecoderShape().vocab) and cache.length == 4
    last, _ = stepper.step([tokens], [stepper.empty_cache()])
    np.testing.assert_allclose(logits[-1], last[0], rtol=1e-5, atol=1e-6)
