"""The example models: deterministic bytes, right shapes, and ORT runs and fuses them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from metainfer.agent.zoo import DEFAULT_EXAMPLES, ExampleModel, build_examples, list_light_models
from metainfer.agent.zoo.bert import BertConfig, build_bert_model

LIGHT_MODELS = sorted(list_light_models())
# The three with >60 M parameters materialise hundreds of MB when ORT folds their fills.
HEAVY_LIGHT = {"light_bvlc_alexnet", "light_vgg19", "light_zfnet512"}


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExampleModel]:
    return build_examples(tmp_path_factory.mktemp("zoo"))


def _session(path: Path, level: ort.GraphOptimizationLevel | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feed(example: ExampleModel, rows: slice) -> dict[str, np.ndarray]:
    with np.load(example.data_path) as data:
        return {name: data[name][rows] for name in example.input_names}


def test_default_examples_are_digits_and_bert(examples: dict[str, ExampleModel]) -> None:
    assert tuple(examples) == DEFAULT_EXAMPLES == ("digits", "bert_mini")
    for example in examples.values():
        assert example.model_path.is_file() and example.data_path.is_file()
        onnx.checker.check_model(onnx.load(example.model_path), full_check=True)


def test_rebuild_gives_identical_bytes(examples: dict[str, ExampleModel], tmp_path: Path) -> None:
    again = build_examples(tmp_path)
    for name, example in examples.items():
        assert again[name].sha256 == example.sha256
        assert again[name].data_sha256 == example.data_sha256
        assert again[name].model_path.read_bytes() == example.model_path.read_bytes()


def test_unknown_name_is_rejected_before_writing(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="known: digits"):
        build_examples(tmp_path, ["digits", "resnet9000"])
    assert not any(tmp_path.iterdir())


def test_digits_shapes_labels_and_accuracy(examples: dict[str, ExampleModel]) -> None:
    digits = examples["digits"]
    assert digits.input_names == ("input",) and digits.has_labels and digits.fixed_batch is None
    with np.load(digits.data_path) as data:
        inputs, labels = data["input"], data["labels"]
    assert inputs.dtype == np.float32 and inputs.shape == (360, 64) and 0 <= inputs.min() <= inputs.max() <= 1
    assert labels.dtype == np.int64 and labels.shape == (360,)
    model = onnx.load(digits.model_path)
    assert {node.op_type for node in model.graph.node} == {"MatMul", "Add", "Relu"}
    assert model.opset_import[0].version >= 17
    logits = _session(digits.model_path).run(["logits"], {"input": inputs})[0]
    assert logits.shape == (360, 10)
    assert (logits.argmax(axis=1) == labels).mean() > 0.9


@pytest.mark.parametrize("batch", [1, 8])
def test_bert_runs_at_batch(examples: dict[str, ExampleModel], batch: int) -> None:
    bert = examples["bert_mini"]
    feed = _feed(bert, slice(0, batch))
    assert all(array.dtype == np.int64 and array.shape == (batch, 128) for array in feed.values())
    hidden = _session(bert.model_path).run(["last_hidden_state"], feed)[0]
    assert hidden.shape == (batch, 128, 256) and hidden.dtype == np.float32
    assert np.isfinite(hidden).all()
    assert hidden[0].std(axis=0).mean() > 0.5  # tokens differ from one another


def test_bert_inputs_are_padded_and_outputs_vary_across_inputs(examples: dict[str, ExampleModel]) -> None:
    bert = examples["bert_mini"]
    feed = _feed(bert, slice(0, 8))
    lengths = feed["attention_mask"].sum(axis=1)
    assert lengths.min() < 128 and len(set(lengths.tolist())) > 4
    assert feed["input_ids"][feed["attention_mask"] == 0].max() == 0  # pad id after the true length
    hidden = _session(bert.model_path).run(["last_hidden_state"], feed)[0]
    assert np.abs(hidden[1, 5] - hidden[2, 5]).max() > 0.1


def test_bert_sequence_is_dynamic_and_padding_is_masked(examples: dict[str, ExampleModel]) -> None:
    bert = examples["bert_mini"]
    feed = _feed(bert, slice(1, 2))
    length = int(feed["attention_mask"].sum())
    session = _session(bert.model_path)
    padded = session.run(["last_hidden_state"], feed)[0]
    trimmed = session.run(["last_hidden_state"], {k: v[:, :length] for k, v in feed.items()})[0]
    np.testing.assert_allclose(trimmed[0], padded[0, :length], atol=1e-4)


def _fused_ops(path: Path, tmp_path: Path) -> Counter[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


def test_bert_fuses_in_ort_builtin_optimizer(examples: dict[str, ExampleModel], tmp_path: Path) -> None:
    ops = _fused_ops(examples["bert_mini"].model_path, tmp_path)
    assert ops["Attention"] == 4
    assert ops["SkipLayerNormalization"] == 8
    assert ops["BiasGelu"] == 4


def test_bert_fused_outputs_match_unfused(examples: dict[str, ExampleModel]) -> None:
    bert = examples["bert_mini"]
    feed = _feed(bert, slice(0, 4))
    plain = _session(bert.model_path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feed)[0]
    fused = _session(bert.model_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL).run(None, feed)[0]
    np.testing.assert_allclose(fused, plain, atol=1e-3)


def test_bert_opset17_has_same_weights_and_outputs(examples: dict[str, ExampleModel]) -> None:
    bert = examples["bert_mini"]
    feed = _feed(bert, slice(0, 2))
    reference = _session(bert.model_path).run(None, feed)[0]
    modern = build_bert_model(BertConfig(opset=17))
    assert "LayerNormalization" in {node.op_type for node in modern.graph.node}
    session = ort.InferenceSession(modern.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feed)[0], reference, atol=1e-4)


def test_transformers_optimizer_fuses_bert(examples: dict[str, ExampleModel]) -> None:
    pytest.importorskip("sympy", reason="onnxruntime.transformers needs sympy for shape inference")
    from onnxruntime.transformers.optimizer import optimize_model

    # opt_level=0: ORT 1.32's opt_level>=1 path imports torch unconditionally.
    optimized = optimize_model(
        str(examples["bert_mini"].model_path), model_type="bert", num_heads=4, hidden_size=256, opt_level=0
    )
    ops = Counter(node.op_type for node in optimized.model.graph.node)
    assert ops["Attention"] == 4 and ops["SkipLayerNormalization"] == 8
    assert ops["EmbedLayerNormalization"] == 1 and ops["BiasGelu"] == 4


def test_light_models_are_the_nine_shipped() -> None:
    assert len(LIGHT_MODELS) == 9 and "light_resnet50" in LIGHT_MODELS


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY_LIGHT else n for n in LIGHT_MODELS]
)
def test_light_model_runs_on_its_data(name: str, tmp_path: Path) -> None:
    example = build_examples(tmp_path, [name])[name]
    assert example.fixed_batch == 1 and not example.has_labels and example.samples == 16
    (input_name,) = example.input_names
    with np.load(example.data_path) as data:
        images = data[input_name]
    assert images.shape == (16, 3, 224, 224) and images.dtype == np.float32
    session = _session(example.model_path)
    outputs = [session.run(None, {input_name: images[i : i + 1]})[0] for i in (0, 1)]
    assert outputs[0].shape[:2] == (1, 1000) and np.isfinite(outputs[0]).all()
    # "light": the weights are constant fills, so the output does not depend on the input.
    np.testing.assert_allclose(outputs[0], outputs[1])
