"""Variants are deterministic and do what their recipe says."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import load_npz
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant, quantizable_nodes
from metainfer.core.engine.transforms.layout import to_nhwc

SPECS = {
    "fp32": TransformSpec(),
    "fp16": TransformSpec(quantization=QuantizationSpec(mode="fp16")),
    "dynamic": TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic", per_channel=True)),
    "static": TransformSpec(quantization=QuantizationSpec(mode="int8_static", calibration="percentile")),
}


def _ops(blob: bytes) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load_from_string(blob).graph.node)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_same_base_and_recipe_give_identical_bytes(name: str, digits) -> None:
    base, _, data = digits
    first = build_variant(base, SPECS[name], data.head(16))
    second = build_variant(base, SPECS[name], data.head(16))
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()


def test_variants_differ_and_carry_provenance(digits) -> None:
    base, _, data = digits
    blobs = {name: build_variant(base, spec, data.head(16)) for name, spec in SPECS.items()}
    assert len({hashlib.sha256(b).hexdigest() for b in blobs.values()}) == len(SPECS)
    props = {p.key: p.value for p in onnx.load_from_string(blobs["dynamic"]).metadata_props}
    assert props["metainfer.base_sha256"] == hashlib.sha256(base).hexdigest()
    assert TransformSpec.model_validate_json(props["metainfer.transform"]) == SPECS["dynamic"]
    assert _ops(blobs["dynamic"])["MatMulInteger"] == 3
    assert _ops(blobs["static"])["QuantizeLinear"] > 0
    assert _ops(blobs["fp16"])["Cast"] >= 2  # fp32 interface kept
    onnx.checker.check_model(onnx.load_from_string(blobs["fp16"]))  # nodes in topological order


def test_keep_float_leaves_named_layers_unquantized(digits) -> None:
    base, _, _ = digits
    nodes = quantizable_nodes(onnx.load_from_string(base), "int8_dynamic")
    assert len(nodes) == 3
    spec = TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic", keep_float=(nodes[0],)))
    variant = onnx.load_from_string(build_variant(base, spec))
    kept = [n for n in variant.graph.node if n.name == nodes[0]]
    assert kept and kept[0].op_type == "MatMul"
    assert Counter(n.op_type for n in variant.graph.node)["MatMulInteger"] == 2


def test_quantized_variants_run_and_stay_close(digits) -> None:
    base, _, data = digits
    feed = data.batch(0, 32)
    ref = create_session(base, Recipe()).run(None, feed)[0]
    for name in ("dynamic", "static"):
        out = create_session(build_variant(base, SPECS[name], data.head(64)), Recipe()).run(None, feed)[0]
        agree = np.mean(np.argmax(out, 1) == np.argmax(ref, 1))
        assert agree > 0.9, name


def test_static_conv_quantization_and_nhwc_rewrite(tiny_conv: tuple[Path, Path]) -> None:
    path, data_path = tiny_conv
    base = path.read_bytes()
    data = load_npz(data_path, inspect_model(path))
    static = build_variant(base, SPECS["static"], data)
    assert _ops(static)["QuantizeLinear"] >= 2
    create_session(static, Recipe()).run(None, data.batch(0, 4))
    nhwc = to_nhwc(onnx.load_from_string(base))
    ops = Counter(n.op_type for n in nhwc.graph.node)
    assert ops["NhwcConv"] == 2 and ops["Transpose"] == 4 and ops["Conv"] == 0
    assert any(o.domain == "com.microsoft" for o in nhwc.opset_import)
    onnx.checker.check_model(nhwc)


def test_static_qdq_on_an_opset_12_model_builds_a_valid_graph() -> None:
    """Per-channel QDQ (and mixed precision) need opset 13; older models are upgraded, not broken."""
    from metainfer.agent.zoo.bert import BertConfig, build_bert_inputs, build_bert_model
    from metainfer.core.engine.data import Dataset

    cfg = BertConfig(layers=1, hidden=32, heads=2, intermediate=64, vocab=64, max_positions=32)
    model = build_bert_model(cfg)
    assert model.opset_import[0].version == 12
    base = model.SerializeToString()
    data = Dataset(build_bert_inputs(samples=8, seq_len=16, cfg=cfg))
    kept = quantizable_nodes(model, "int8_static")[0]
    for quant in (
        QuantizationSpec(mode="int8_static", per_channel=True),
        QuantizationSpec(mode="int8_static", keep_float=(kept,)),
    ):
        variant = build_variant(base, TransformSpec(quantization=quant), data)
        out = create_session(variant, Recipe()).run(None, data.batch(0, 2))[0]
        assert np.isfinite(out).all()


def _chain(nodes: list[tuple[str, str, str, str]], consts: dict[str, np.ndarray], x_dim: int, y_dim: int) -> bytes:
    """A float graph x[n, x_dim] -> y[n, y_dim] of binary ops (op, left, right, out) over constant tensors."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node(op, [a, b] if b else [a], [out]) for op, a, b, out in nodes],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", x_dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", y_dim])],
        [numpy_helper.from_array(value, name) for name, value in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _wide_mlp() -> bytes:
    """64 -> 4096 -> 10: each sample's hidden activations are 32 KB, large beside its 256-byte input."""
    rng = np.random.default_rng(0)
    consts = {
        "w1": rng.standard_normal((64, 4096)).astype(np.float32),
        "w2": rng.standard_normal((4096, 10)).astype(np.float32),
    }
    nodes = [("MatMul", "x", "w1", "h"), ("Relu", "h", "", "r"), ("MatMul", "r", "w2", "y")]
    return _chain(nodes, consts, 64, 10)


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_static_calibration_memory_does_not_grow_with_the_sample_count(method: str) -> None:
    """ORT's calibrators hold every intermediate tensor they read; ours read one batch at a time."""
    import tracemalloc

    from metainfer.core.engine.data import Dataset

    base = _wide_mlp()
    spec = TransformSpec(quantization=QuantizationSpec(mode="int8_static", calibration=method))
    rng = np.random.default_rng(1)
    peaks = []
    for samples in (64, 512):
        data = Dataset({"x": rng.standard_normal((samples, 64)).astype(np.float32)})
        tracemalloc.start()
        try:
            build_variant(base, spec, data)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    # Holding all 512 samples' activations costs 8x the 64-sample run (17 MB against 3 MB when measured).
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_strided_minmax_calibration_matches_reading_everything_at_once() -> None:
    """Per-batch min/max merged by ORT must give the same scales as one pass over all samples."""
    import contextlib
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from metainfer.core.engine.data import Dataset
    from metainfer.core.engine.transforms.quantize import EXTRA

    base = _wide_mlp()
    data = Dataset({"x": np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)})
    ours = onnx.load_from_string(
        build_variant(base, TransformSpec(quantization=QuantizationSpec(mode="int8_static")), data)
    )

    class Everything(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter([b for b, _ in data.batches(8)])

        def get_next(self):
            return next(self._feeds, None)

    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        Path("in.onnx").write_bytes(base)
        quantize_static("in.onnx", "out.onnx", Everything(), quant_format=QuantFormat.QDQ, extra_options=EXTRA)
        reference = onnx.load("out.onnx")

    def scales(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_scale")}

    ours_scales, reference_scales = scales(ours), scales(reference)
    assert ours_scales.keys() == reference_scales.keys() and len(ours_scales) >= 3
    for name, value in reference_scales.items():
        np.testing.assert_array_equal(ours_scales[name], value, err_msg=name)


def test_static_quantization_without_a_full_calibration_batch_names_the_data() -> None:
    from metainfer.core.engine.data import Dataset
    from metainfer.core.engine.errors import InputError

    data = Dataset({"x": np.zeros((5, 64), np.float32)})
    with pytest.raises(InputError, match="full calibration batch of 8 samples; got 5"):
        build_variant(_wide_mlp(), TransformSpec(quantization=QuantizationSpec(mode="int8_static")), data)


def test_histogram_calibration_on_a_constant_huge_activation_says_what_to_use() -> None:
    """numpy cannot make 2048 bins around one value near 3e29; the error names the cause and minmax."""
    from metainfer.core.engine.data import Dataset

    rng = np.random.default_rng(0)
    consts = {
        "w1": rng.standard_normal((16, 16)).astype(np.float32),
        "zero": np.zeros(16, np.float32),
        "huge": np.full(16, 3e29, np.float32),
        "w2": rng.standard_normal((16, 4)).astype(np.float32),
    }
    nodes = [
        ("MatMul", "x", "w1", "h"),
        ("Mul", "h", "zero", "z"),
        ("Add", "z", "huge", "c"),
        ("MatMul", "c", "w2", "y"),
    ]
    model = _chain(nodes, consts, 16, 4)
    data = Dataset({"x": rng.standard_normal((16, 16)).astype(np.float32)})
    with pytest.raises(ValueError, match=r"percentile calibration failed.*minmax calibration works"):
        build_variant(
            model,
            TransformSpec(quantization=QuantizationSpec(mode="int8_static", calibration="percentile")),
            data,
        )
    minmax = TransformSpec(quantization=QuantizationSpec(mode="int8_static"))
    assert _ops(build_variant(model, minmax, data))["QuantizeLinear"] >= 2


def _count_calibrations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import importlib

    # The package re-exports a function named ``quantize``, which shadows the module as an attribute.
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    calls: list[str] = []
    real = ort_quantize.create_calibrator

    def counting(*args, **kwargs):
        calls.append(str(kwargs.get("calibrate_method")))
        return real(*args, **kwargs)

    monkeypatch.setattr(ort_quantize, "create_calibrator", counting)
    return calls


def test_static_builds_that_differ_only_after_calibration_calibrate_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-channel weights and layers kept in float do not change what the calibrator reads: one calibration,
    and every build byte-identical to one that calibrated afresh."""
    from metainfer.core.engine.data import Dataset
    from metainfer.core.engine.transforms import quantize

    if not quantize._ORT_CACHES_CALIBRATION:
        pytest.skip("this ONNX Runtime cannot read stored calibration ranges")
    base = _wide_mlp()
    data = Dataset({"x": np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)})
    kept = quantizable_nodes(onnx.load_from_string(base), "int8_static")[0]
    specs = [
        QuantizationSpec(mode="int8_static", calibration="percentile"),
        QuantizationSpec(mode="int8_static", calibration="percentile", per_channel=True),
        QuantizationSpec(mode="int8_static", calibration="percentile", keep_float=(kept,)),
        QuantizationSpec(mode="int8_static", calibration="percentile", format="qoperator"),
    ]
    monkeypatch.setattr(quantize, "CALIBRATIONS", quantize.CalibrationCache())
    calls = _count_calibrations(monkeypatch)
    reused = [build_variant(base, TransformSpec(quantization=q), data) for q in specs]
    assert len(calls) == 1, calls
    fresh = []
    for q in specs:
        monkeypatch.setattr(quantize, "CALIBRATIONS", quantize.CalibrationCache())
        fresh.append(build_variant(base, TransformSpec(quantization=q), data))
    assert len(calls) == 1 + len(specs)
    for spec, a, b in zip(specs, reused, fresh, strict=True):
        assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest(), spec


def test_other_samples_methods_or_graphs_calibrate_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from metainfer.core.engine.data import Dataset
    from metainfer.core.engine.transforms import quantize

    if not quantize._ORT_CACHES_CALIBRATION:
        pytest.skip("this ONNX Runtime cannot read stored calibration ranges")
    monkeypatch.setattr(quantize, "CALIBRATIONS", quantize.CalibrationCache())
    calls = _count_calibrations(monkeypatch)
    rng = np.random.default_rng(4)
    first = Dataset({"x": rng.standard_normal((16, 64)).astype(np.float32)})
    second = Dataset({"x": first.inputs["x"] * 2})
    minmax = TransformSpec(quantization=QuantizationSpec(mode="int8_static"))
    percentile = TransformSpec(quantization=QuantizationSpec(mode="int8_static", calibration="percentile"))
    scaled = build_variant(_wide_mlp(), minmax, second)
    plain = build_variant(_wide_mlp(), minmax, first)
    build_variant(_wide_mlp(), percentile, first)
    other_graph = _chain([("MatMul", "x", "w", "y")], {"w": rng.standard_normal((64, 10)).astype(np.float32)}, 64, 10)
    build_variant(other_graph, minmax, first)
    assert len(calls) == 4, calls
    assert scaled != plain


def test_the_calibration_cache_keeps_its_bound() -> None:
    from metainfer.core.engine.transforms.quantize import CalibrationCache

    cache = CalibrationCache(max_entries=2)
    for key in ("a", "b", "c"):
        cache.put(key, key.encode())
    assert len(cache) == 2 and cache.get("a") is None and cache.get("c") == b"c"
    cache.get("b")
    cache.put("d", b"d")
    assert cache.get("b") == b"b" and cache.get("c") is None


def test_quantizing_quiets_only_the_building_thread(caplog: pytest.LogCaptureFixture) -> None:
    """ORT's quantizer logs advice on the root logger from the thread that builds; another thread's log (serve's
    "SIGTERM received" while its load thread quantizes) must still be written."""
    from metainfer.core.engine.transforms.quantize import _quiet

    caplog.set_level(logging.INFO)
    with _quiet():
        logging.warning("advice from the quantizer")
        logging.error("an error of the build")
        other = threading.Thread(target=lambda: logging.getLogger("metainfer.serve").info("SIGTERM received"))
        other.start()
        other.join()
    logging.info("after the build")
    assert [r.getMessage() for r in caplog.records] == ["an error of the build", "SIGTERM received", "after the build"]
