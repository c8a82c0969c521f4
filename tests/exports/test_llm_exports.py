"""SmolLM2-135M-Instruct as users export a decoder (testkit/llm_exports.py): optimum and onnxruntime-genai's builder.

For each form, in the project's venv (onnxruntime on the CPU, the ``tokenizers`` package on the export's
tokenizer.json): the graph has the inputs and outputs its exporter is known for; a chat prompt's prefill and
three greedy decode steps that feed present.N back as past_key_values.N pick the same tokens, with the same
logits, as recomputing the whole sequence without a cache at each step; and the prefill logits match
transformers' own (the GGUF dequantized in the llm peer venv).

The first run builds the llm peer venv (it shares the export venvs' torch layer) and the exports under
~/.cache/metainfer/llm (about 1.6 GB, a few minutes); later runs reuse them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from testkit.llm_exports import FORMS, LLMExport, export, reference_logits

pytestmark = pytest.mark.timeout(1800)

LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 30, 3, 64, 49152
BOS, EOS = 1, 2  # <|im_start|>, <|im_end|>
STEPS = 3
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module", params=FORMS)
def exported(request: pytest.FixtureRequest) -> LLMExport:
    return export(request.param)


def _prompt(directory: Path) -> list[int]:
    """The chat template rendered as transformers renders it, tokenized by tokenizer.json."""
    config = json.loads((directory / "tokenizer_config.json").read_text())
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(config["chat_template"])
    text = template.render(messages=[{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    return list(Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text).ids)


@pytest.fixture(scope="module")
def prompt(exported: LLMExport) -> list[int]:
    return _prompt(exported.directory)


@pytest.fixture(scope="module")
def reference(exported: LLMExport) -> np.ndarray:
    """transformers' logits for the prompt, computed once (both forms share the tokenizer, so the prompt)."""
    ids = _prompt(exported.directory)
    cached = _REFERENCE.get(tuple(ids))
    if cached is None:
        cached = _REFERENCE[tuple(ids)] = reference_logits(ids)
    return cached


_REFERENCE: dict[tuple[int, ...], np.ndarray] = {}


class Decoder:
    """One export's model.onnx in onnxruntime, fed as its graph asks (position_ids only where it has them)."""

    def __init__(self, model: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, ids: list[int], past: dict[str, np.ndarray] | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits [len(ids), vocab] and the present cache, ``ids`` following ``past`` (None: an empty one)."""
        start = 0 if past is None else past["present.0.key"].shape[2]
        feed: dict[str, Any] = {
            "input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, start + len(ids)), dtype=np.int64),
        }
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(start, start + len(ids), dtype=np.int64)[None]
        empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), dtype=np.float32)
        for name in self.inputs:
            if name.startswith("past_key_values."):
                feed[name] = empty if past is None else past[name.replace("past_key_values.", "present.")]
        values = dict(zip(self.outputs, self.session.run(None, feed), strict=True))
        return values["logits"][0], {k: v for k, v in values.items() if k.startswith("present.")}


def test_the_tokenizer_is_the_ggufs(exported: LLMExport, prompt: list[int]) -> None:
    config = json.loads((exported.directory / "tokenizer_config.json").read_text())
    special = (config["bos_token"], config["eos_token"], config["pad_token"])
    assert special == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert "{% if add_generation_prompt %}" in config["chat_template"]
    tokenizer = Tokenizer.from_file(str(exported.tokenizer))
    assert (tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")) == (BOS, EOS)
    assert prompt[0] == BOS and prompt.count(BOS) == 3  # system, user, assistant: no BOS added before the template's
    assert tokenizer.encode("2024").tokens == ["2", "0", "2", "4"]  # the smollm pre-tokenizer splits digits


def test_the_graph_is_the_exporters(exported: LLMExport) -> None:
    model = onnx.load(str(exported.model), load_external_data=False)
    inputs = {v.name: v.type.tensor_type for v in model.graph.input}
    outputs = {v.name: v.type.tensor_type for v in model.graph.output}
    if exported.form == "optimum":  # layer by layer: 0.key, 0.value, 1.key, ...
        cache = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
    else:  # every layer's key, then every layer's value
        cache = [f"past_key_values.{i}.{kv}" for kv in ("key", "value") for i in range(LAYERS)]
    present = [n.replace("past_key_values.", "present.") for n in cache]
    plain = ["input_ids", "attention_mask"] + (["position_ids"] if exported.form == "optimum" else [])
    assert list(inputs) == plain + cache
    assert list(outputs) == ["logits", *present]
    assert {inputs[n].elem_type for n in plain} == {onnx.TensorProto.INT64}
    assert {inputs[n].elem_type for n in cache} | {outputs[n].elem_type for n in outputs} == {onnx.TensorProto.FLOAT}
    ops = [n.op_type for n in model.graph.node]
    if exported.form == "builder":
        assert ops.count("GroupQueryAttention") == LAYERS
        assert (exported.directory / "model.onnx.data").exists() and (exported.directory / "genai_config.json").exists()
        genai = json.loads((exported.directory / "genai_config.json").read_text())["model"]
        assert (genai["eos_token_id"], genai["decoder"]["num_hidden_layers"]) == (EOS, LAYERS)
    else:
        assert "GroupQueryAttention" not in ops and ops.count("Softmax") == LAYERS
        assert not any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)


def test_cached_decoding_picks_what_full_recomputation_picks(exported: LLMExport, prompt: list[int]) -> None:
    decoder = Decoder(exported.model)
    logits, past = decoder.run(prompt, None)
    assert logits.shape == (len(prompt), VOCAB) and past["present.0.key"].shape == (1, KV_HEADS, len(prompt), HEAD_DIM)
    cached, cached_logits = [int(logits[-1].argmax())], [logits[-1]]
    for _ in range(STEPS):
        logits, past = decoder.run([cached[-1]], past)
        assert past["present.0.key"].shape[2] == len(prompt) + len(cached)
        cached.append(int(logits[-1].argmax()))
        cached_logits.append(logits[-1])

    sequence, full, full_logits = list(prompt), [], []
    for _ in range(STEPS + 1):
        logits, _ = decoder.run(sequence, None)
        full.append(int(logits[-1].argmax()))
        full_logits.append(logits[-1])
        sequence.append(full[-1])
    assert cached == full
    assert max(float(np.abs(a - b).max()) for a, b in zip(cached_logits, full_logits, strict=True)) < 1e-3
    answer = Tokenizer.from_file(str(exported.tokenizer)).decode(full)
    assert answer.startswith("The capital of France"), answer  # the real weights: the model answers


def test_prefill_logits_match_transformers(exported: LLMExport, prompt: list[int], reference: np.ndarray) -> None:
    logits, _ = Decoder(exported.model).run(prompt, None)
    assert reference.shape == (1, len(prompt), VOCAB)
    assert float(np.abs(logits - reference[0]).max()) < 1e-3
    assert (logits.argmax(-1) == reference[0].argmax(-1)).all()


def test_metainfer_packs_detects_and_decodes_each_export_as_it_decodes_by_recomputing(
    exported: LLMExport, prompt: list[int], tmp_path: Path
) -> None:
    """Issue 66 item 1: both export shapes are first-class: llm-pack makes one file of the directory, the
    signature is found (the builder's symbolic head dimension read from its GroupQueryAttention), and metainfer's
    stepper, sequences batched or one at a time, greedily decodes what recomputing the whole sequence picks."""
    import onnx as onnx_module
    import onnxruntime as ort

    from metainfer.agent.cli import main
    from metainfer.core.engine.decoder.engine import GenerationEngine, GenerationRequest
    from metainfer.core.engine.decoder.sampling import SamplingParams
    from metainfer.core.engine.decoder.signature import detect
    from metainfer.core.engine.decoder.stepper import DecoderStepper
    from metainfer.core.engine.decoder.tokenizer import carried_tokenizer

    packed = tmp_path / "packed.onnx"
    assert main(["llm-pack", str(exported.directory), "-o", str(packed)]) == 0
    model = onnx_module.load(packed)
    signature = detect(model)
    assert signature is not None and (len(signature.layers), signature.kv_heads, signature.head_dim) == (30, 3, 64)
    assert signature.form == ("group_query_attention" if exported.form == "builder" else "attention_ops")
    assert (signature.position_ids is None) == (exported.form == "builder")
    codec = carried_tokenizer({p.key: p.value for p in model.metadata_props})
    assert codec is not None and codec.stop_ids == {2}
    session = ort.InferenceSession(str(packed), providers=["CPUExecutionProvider"])
    stepper = DecoderStepper(session, signature)
    engine = GenerationEngine(stepper, cache_budget_tokens=4096, max_context=8192)
    prompts = [prompt, prompt[:9]]
    for index, tokens in enumerate(prompts):
        engine.admit(GenerationRequest(f"r{index}", tokens, 3, SamplingParams(temperature=0.0)))
    got: dict[str, list[int]] = {"r0": [], "r1": []}
    while engine.running:
        for event in engine.iterate():
            if event.token is not None:
                got[event.request_id].append(event.token)
    for index, tokens in enumerate(prompts):
        sequence = list(tokens)
        for _ in range(3):
            logits, _ = stepper.step([sequence], [stepper.empty_cache()])
            sequence.append(int(np.argmax(logits[0])))
        assert got[f"r{index}"] == sequence[len(tokens) :]
