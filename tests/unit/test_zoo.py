"""The example models: deterministic bytes on any machine, right shapes, and ORT runs and fuses them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from metainfer.agent.zoo import DEFAULT_EXAMPLES, ExampleModel, build_examples, list_light_models
from metainfer.agent.zoo.bert import BertConfig, build_bert_model

ROOT = Path(__file__).resolve().parents[2]
LIGHT_MODELS = sorted(list_light_models())
# The three with >60 M parameters materialise hundreds of MB when ORT folds their fills.


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
    # A stratified fifth of load_digits' 1797 images.
    assert 350 <= digits.samples <= 370 and np.bincount(labels).min() >= 35
    assert inputs.dtype == np.float32 and inputs.shape == (digits.samples, 64)
    assert 0 <= inputs.min() <= inputs.max() <= 1
    assert labels.dtype == np.int64 and labels.shape == (digits.samples,)
    model = onnx.load(digits.model_path)
    assert {node.op_type for node in model.graph.node} == {"MatMul", "Add", "Relu"}
    assert model.opset_import[0].version >= 17
    logits = _session(digits.model_path).run(["logits"], {"input": inputs})[0]
    assert logits.shape == (digits.samples, 10)
    assert (logits.argmax(axis=1) == labels).mean() > 0.95


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


@pytest.mark.parametrize("name", LIGHT_MODELS)
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


# Which example each policy in examples/ adapts: its model (and data) sha256 must be what `metainfer examples build`
# writes for that example, on any machine.
POLICY_EXAMPLES = {
    "digits-policy.yaml": "digits",
    "digits-cpu-policy.yaml": "digits",
    "bert-mini-policy.yaml": "bert_mini",
    "tiny-decoder-policy.yaml": "tiny_decoder",
}
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_CHILD = """
import json, sys
from pathlib import Path
from threadpoolctl import threadpool_info
from metainfer.agent.zoo import build_examples
try:
    from numpy._core._multiarray_umath import __cpu_features__
except ImportError:  # numpy 1.x
    from numpy.core._multiarray_umath import __cpu_features__
built = build_examples(Path(sys.argv[1]))
print(json.dumps({
    "built": {name: {"model": e.sha256, "data": e.data_sha256} for name, e in built.items()},
    "blas": [info for info in threadpool_info() if info["user_api"] == "blas"],
    "cpu": {name: bool(on) for name, on in __cpu_features__.items()},
}))
"""


def _numpy_simd() -> tuple[list[str], dict[str, bool]]:
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return list(__cpu_dispatch__), dict(__cpu_features__)


def _pins() -> dict[tuple[str, str], str]:
    """(example, "model" or "data") -> the sha256 the policies in examples/ pin for it."""
    pins: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            model = (document or {}).get("spec", {}).get("model", {})
            if "sha256" not in model:
                continue
            assert path.name in POLICY_EXAMPLES, f"{path.name} pins a model: add it to POLICY_EXAMPLES"
            example = POLICY_EXAMPLES[path.name]
            for kind, sha in (("model", model["sha256"]), ("data", model.get("data", {}).get("sha256"))):
                if sha is not None:
                    assert pins.setdefault((example, kind), sha) == sha, (
                        f"examples/ pin two {kind} sha256 for {example}"
                    )
    return pins


def _assert_pinned(built: dict[str, dict[str, str]], where: str) -> None:
    pins = _pins()
    assert pins, "examples/ pin no sha256"
    wrong = {
        f"{example} {kind}": f"built {built[example][kind]}, pinned {sha}"
        for (example, kind), sha in pins.items()
        if example in built and built[example][kind] != sha
    }
    assert not wrong, f"{where}: `metainfer examples build` does not write what examples/*.yaml pin: {wrong}"


def test_example_policies_pin_what_the_build_writes(examples: dict[str, ExampleModel], tmp_path: Path) -> None:
    every = {**examples, **build_examples(tmp_path, ["tiny_decoder"])}
    built = {name: {"model": e.sha256, "data": e.data_sha256} for name, e in every.items()}
    assert {example for example, _ in _pins()} <= set(built)
    _assert_pinned(built, "this process")


def _condition(name: str) -> tuple[dict[str, str], str | None]:
    """The environment of one way to change floating-point dispatch, or why this machine cannot have it."""
    one = dict.fromkeys(_THREAD_VARIABLES, "1")
    two = dict.fromkeys(_THREAD_VARIABLES, "2")
    if name == "one-thread":
        return one, None
    if name == "two-threads-baseline-simd":
        # Only numpy's dispatch targets can be switched off (it refuses to disable its compiled-in baseline).
        dispatch, features = _numpy_simd()
        enabled = [feature for feature in dispatch if features.get(feature)]
        return {**two, "NPY_DISABLE_CPU_FEATURES": " ".join(enabled)}, (
            None if enabled else "this CPU has none of numpy's dispatchable SIMD features"
        )
    if name == "openblas-nehalem":
        # OpenBLAS's SSE4.2 kernels (no AVX, no FMA) instead of this CPU's: with the digits MLP that sklearn used to
        # train in float, this alone changed the model's sha256 (SkylakeX, Haswell and Nehalem kernels on one
        # machine gave three different files).
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        return {**two, "OPENBLAS_CORETYPE": "Nehalem"}, None if x86 else "Nehalem is an x86-64 OpenBLAS kernel"
    raise ValueError(name)


@pytest.mark.parametrize("name", ["one-thread", "two-threads-baseline-simd", "openblas-nehalem"])
def test_example_build_is_identical_under_other_floating_point_dispatch(name: str, tmp_path: Path) -> None:
    """Build in a fresh process whose BLAS threads, numpy SIMD level or BLAS kernels differ from this one's.

    Without OPENBLAS_CORETYPE, OpenBLAS picks the kernels of the CPU it runs on, which this process's environment
    may have pinned otherwise.
    """
    overrides, unavailable = _condition(name)
    if unavailable:
        pytest.skip(unavailable)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {*_THREAD_VARIABLES, "NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE"}
    }
    env.update(overrides)
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The condition took effect in the child, else this test would check nothing new.
    for feature in overrides.get("NPY_DISABLE_CPU_FEATURES", "").split():
        assert report["cpu"][feature] is False, f"numpy in the child still uses {feature}"
    # BLAS libraries cap their threads at the CPUs this process may use.
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = min(int(overrides[_THREAD_VARIABLES[0]]), cpus)
    assert report["blas"] and all(info["num_threads"] == threads for info in report["blas"]), report["blas"]
    if "OPENBLAS_CORETYPE" in overrides:
        openblas = [info for info in report["blas"] if info["internal_api"] == "openblas"]
        if not openblas:
            pytest.skip("numpy and scipy here use no OpenBLAS")
        assert {info["architecture"] for info in openblas} == {"Nehalem"}, openblas
    _assert_pinned(report["built"], f"a process with {overrides}")
