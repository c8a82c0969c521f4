"""Bad models and bad data fail with one line naming the file, array or axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import load_npz, make_dataset
from metainfer.core.engine.errors import DataError, ModelError
from metainfer.core.engine.modelinfo import (
    ModelInfo,
    TensorInfo,
    inspect_model,
    load_model,
    model_bytes,
    weights_beside,
)


def test_model_errors_name_the_file_and_problem(tmp_path: Path, examples: dict[str, Path]) -> None:
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(empty)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(text)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(examples["digits"].read_bytes()[:5000])
    with pytest.raises(ModelError) as err:
        load_model(truncated)
    assert str(truncated) in str(err.value)


def _with_external_data(source: Path, folder: Path, location: str = "model.onnx.data") -> Path:
    """``source`` saved as the dynamo exporter saves it: the graph in model.onnx, every weight in ``location``."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "model.onnx"
    onnx.save_model(
        onnx.load(str(source)), str(target), save_as_external_data=True, location=location, size_threshold=0
    )
    return target


def test_a_model_with_its_weights_in_a_file_beside_it_loads_whole(tmp_path: Path, examples: dict[str, Path]) -> None:
    split = _with_external_data(examples["digits"], tmp_path / "split")
    assert (split.parent / "model.onnx.data").stat().st_size > split.stat().st_size
    whole = load_model(examples["digits"])
    loaded = load_model(split)
    assert loaded.SerializeToString() == whole.SerializeToString()  # the same model as the single-file export
    split_info, whole_info = inspect_model(split, loaded), inspect_model(examples["digits"])
    assert (split_info.parameters, split_info.size_bytes) == (whole_info.parameters, whole_info.size_bytes)


def test_a_split_model_is_handed_on_whole_so_a_session_made_from_its_bytes_runs(
    tmp_path: Path, examples: dict[str, Path]
) -> None:
    """Found with `metainfer adapt` on a split export: the graph file's bytes were handed on, and ONNX Runtime
    cannot find external data for a model given as bytes ("External data path ... escapes working directory")."""
    import onnxruntime as ort  # after metainfer.core (imported above): its telemetry opt-out comes first

    split = _with_external_data(examples["digits"], tmp_path / "split")
    loaded = load_model(split)
    assert weights_beside(split, loaded)
    handed = model_bytes(split, loaded)
    assert handed == load_model(examples["digits"]).SerializeToString()
    session = ort.InferenceSession(handed, providers=["CPUExecutionProvider"])
    (x,) = session.get_inputs()
    sample = np.zeros([1, *x.shape[1:]], np.float32)
    assert session.run(None, {x.name: sample})[0].shape[0] == 1
    with pytest.raises(Exception, match="xternal data"):  # what the graph file alone did
        ort.InferenceSession(split.read_bytes(), providers=["CPUExecutionProvider"])
    whole = load_model(examples["digits"])
    assert not weights_beside(examples["digits"], whole)
    assert model_bytes(examples["digits"], whole) == examples["digits"].read_bytes()  # one file: its own bytes


def test_a_model_whose_external_data_is_missing_says_so_and_how_to_make_one_file(
    tmp_path: Path, examples: dict[str, Path]
) -> None:
    """A model URI fetches one file: a dynamo export fetched alone failed as "not an ONNX model", naming a
    temporary path."""
    split = _with_external_data(examples["digits"], tmp_path / "alone")
    (split.parent / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"external data files that are not beside it \('model.onnx.data'\)") as err:
        load_model(split)
    assert "save_as_external_data=False" in str(err.value)


def test_a_model_over_2_gib_with_its_external_data_is_refused_before_it_is_read(
    tmp_path: Path, examples: dict[str, Path]
) -> None:
    """One ONNX file cannot hold it, and each variant is one: the checker failed with a bare EncodeError after
    reading all of it (9 s, 4.6 GB of memory for 2.2 GB of weights)."""
    split = _with_external_data(examples["digits"], tmp_path / "big")
    with (split.parent / "model.onnx.data").open("r+b") as data:
        data.truncate(2**31)  # sparse: nothing written, nothing read
    with pytest.raises(ModelError, match=r"with its external data it is 2\.0 GiB: over the 2 GiB"):
        load_model(split)


@pytest.mark.parametrize("location", ["../outside.data", "/etc/passwd"])
def test_external_data_outside_the_models_folder_is_refused(
    tmp_path: Path, examples: dict[str, Path], location: str
) -> None:
    model = onnx.load(str(examples["digits"]))
    tensor = model.graph.initializer[0]
    onnx.external_data_helper.set_external_data(tensor, location=location, offset=0, length=16)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    (tmp_path / "m").mkdir()
    (tmp_path / "outside.data").write_bytes(bytes(64))
    hostile = tmp_path / "m" / "model.onnx"
    hostile.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="is not a path under the model's folder"):
        load_model(hostile)


def _classifier(zipmap: bool) -> onnx.ModelProto:
    """A linear classifier as skl2onnx exports one: a label, and the probabilities through ZipMap by default."""
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    nodes = [
        h.make_node("MatMul", ["input", "W"], ["logits"]),
        h.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        h.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
    ]
    outputs = [h.make_tensor_value_info("label", TensorProto.INT64, ["N"])]
    if zipmap:
        nodes.append(h.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                                 classlabels_int64s=[0, 1, 2]))  # fmt: skip
        float_map = h.make_map_type_proto(TensorProto.INT64, h.make_tensor_type_proto(TensorProto.FLOAT, []))
        outputs.append(h.make_value_info("output_probability", h.make_sequence_type_proto(float_map)))
    else:
        outputs.append(h.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3]))
    graph = h.make_graph(nodes, "classifier", [h.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
                         outputs, [nh.from_array(np.ones((4, 3), np.float32), "W")])  # fmt: skip
    opsets = [h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)]
    return h.make_model(graph, opset_imports=opsets, ir_version=8)


def test_a_sequence_of_maps_output_is_refused_by_name_with_how_to_export_without_it(tmp_path: Path) -> None:
    """skl2onnx's default for every classifier: the quality check crashed on it with a bare AttributeError."""
    path = tmp_path / "classifier.onnx"
    onnx.save(_classifier(zipmap=True), str(path))
    with pytest.raises(ModelError) as err:
        load_model(path)
    message = str(err.value)
    assert "output 'output_probability' is a sequence(map(int64, tensor(float)))" in message
    assert "options={'zipmap': False}" in message
    onnx.save(_classifier(zipmap=False), str(path))
    assert [o.name for o in inspect_model(path).outputs] == ["label", "probabilities"]


def test_model_info(examples: dict[str, Path]) -> None:
    info = inspect_model(examples["digits"])
    assert [i.name for i in info.inputs] == ["input"]
    assert info.batch_is_dynamic and info.has_matmuls and not info.has_convs
    assert len(info.sha256) == 64 and info.parameters > 10_000


def test_data_must_match_the_model(digits) -> None:
    _, info, data = digits
    x = data.inputs["input"]
    with pytest.raises(DataError, match=r"\['pixels'\] are not model inputs"):
        make_dataset({"pixels": x}, info)
    with pytest.raises(DataError, match="missing array"):
        make_dataset({}, info)
    with pytest.raises(DataError, match="axis 1 has size 63, the model expects 64"):
        make_dataset({"input": x[:, :63]}, info)
    with pytest.raises(DataError, match=r"has 4 dims .* or 3 dims, samples of the whole input"):
        make_dataset({"input": x[:, :, None, None]}, info)
    with pytest.raises(DataError, match="axis 2 has size 1, the model expects 64"):  # one more axis: whole inputs
        make_dataset({"input": x[:, :, None]}, info)
    with pytest.raises(DataError, match="dtype"):
        make_dataset({"input": x.astype(np.int64)}, info)
    with pytest.raises(DataError, match="labels"):
        make_dataset({"input": x, "labels": np.zeros(3, np.int64)}, info)
    with pytest.raises(DataError, match="zero samples"):
        make_dataset({"input": x[:0]}, info)
    ok = make_dataset({"input": x.astype(np.float64), "labels": data.labels}, info)
    assert ok.inputs["input"].dtype == np.float32 and ok.n_samples == len(x)


def test_npz_errors(tmp_path: Path, digits) -> None:
    _, info, _ = digits
    with pytest.raises(DataError, match="no such file"):
        load_npz(tmp_path / "none.npz", info)
    bad = tmp_path / "bad.npz"
    bad.write_text("garbage")
    with pytest.raises(DataError, match=r"not a readable \.npz"):
        load_npz(bad, info)


def test_batches_wrap_around(digits) -> None:
    _, _, data = digits
    n = data.n_samples
    batch = data.batch(n - 2, 5)["input"]
    assert batch.shape[0] == 5
    np.testing.assert_array_equal(batch[2], data.inputs["input"][0])
    covered = sum(sl.stop - sl.start for _, sl in data.batches(64))
    assert covered == n


def test_a_string_input_is_refused_by_name_with_the_way_out(tmp_path: Path) -> None:
    """Serving answers in KServe v2's numeric types: reading the data crashed ("data type 'string' not understood")."""
    from onnx import TensorProto
    from onnx import helper as h

    nodes = [
        h.make_node("StringNormalizer", ["text"], ["lower"], case_change_action="LOWER"),
        h.make_node("Shape", ["lower"], ["shape"]),
        h.make_node("Cast", ["shape"], ["length"], to=TensorProto.FLOAT),
    ]
    text = h.make_tensor_value_info("text", TensorProto.STRING, ["N"])
    graph = h.make_graph(nodes, "strings", [text], [h.make_tensor_value_info("length", TensorProto.FLOAT, [1])])
    path = tmp_path / "strings.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
    with pytest.raises(ModelError, match=r"input 'text' is a tensor\(string\): .* numeric and bool tensors") as err:
        load_model(path)
    assert "strings turned into numbers before the graph" in str(err.value)


def test_samples_of_an_input_without_a_samples_axis_are_fed_whole_one_per_run(tmp_path: Path) -> None:
    """torchvision's detectors take one [3, H, W] image: data of [samples, 3, H, W] was refused ("has 4 dims, the
    model expects 3"), though it is exactly what such a model runs on."""
    from odd_exports import unbatched_conv

    path = tmp_path / "model.onnx"
    path.write_bytes(unbatched_conv())
    info = inspect_model(path)
    images = np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32)
    data = make_dataset({"x": images}, info)
    assert data.unbatched == {"x"} and data.n_samples == 5
    feeds = [feed["x"] for feed, _ in data.batches(1)]
    assert [f.shape for f in feeds] == [(3, 8, 8)] * 5 and np.array_equal(feeds[4], images[4])
    assert data.head(2).unbatched == data.tail(2).unbatched == {"x"}
    with pytest.raises(
        DataError, match=r"\['x'\] have no samples axis .* differ between samples, .* not 2: use --batch 1"
    ):
        data.batch(0, 2)
    with pytest.raises(DataError, match="axis 1 has size 4, the model expects 3"):
        make_dataset({"x": np.zeros((5, 4, 8, 8), np.float32)}, info)
    same = make_dataset({"x": np.broadcast_to(images[:1], images.shape).copy()}, info)
    assert same.one_sample_per_run  # the same image every time, but no other input carries the samples
    with pytest.raises(DataError, match=r"no input has a samples axis .* not 2: use --batch 1"):
        same.batch(0, 2)


def _images_and_threshold(tmp_path: Path) -> ModelInfo:
    """A YOLO-style export: a batch of rows and a scalar score threshold beside it."""
    from onnx import helper as h
    from onnx import numpy_helper

    weights = numpy_helper.from_array(np.ones((16, 4), np.float32), "W")
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["z"]), h.make_node("Mul", ["z", "threshold"], ["y"])],
        "thresholded",
        [h.make_tensor_value_info("x", 1, ["N", 16]), h.make_tensor_value_info("threshold", 1, [])],
        [h.make_tensor_value_info("y", 1, ["N", 4])],
        [weights],
    )
    path = tmp_path / "model.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
    return inspect_model(path)


def test_a_setting_the_same_for_every_sample_lets_runs_hold_many_samples(tmp_path: Path) -> None:
    """Found probing exports: images plus a scalar threshold were refused at --batch 8 ("every run holds one
    sample"), and the threshold given once, as the model takes it (a 0-d array), crashed with an IndexError."""
    info = _images_and_threshold(tmp_path)
    rows = np.random.default_rng(0).standard_normal((10, 16)).astype(np.float32)
    for threshold in (np.full(10, 0.5, np.float32), np.array(0.5, np.float32)):
        data = make_dataset({"x": rows, "threshold": threshold}, info)
        assert data.per_run == {"threshold"} and not data.one_sample_per_run and data.n_samples == 10
        feed = data.batch(2, 4)
        assert feed["threshold"].shape == () and float(feed["threshold"]) == 0.5
        assert np.array_equal(feed["x"], rows[2:6])
        assert not data.head(3).one_sample_per_run and data.tail(7).n_samples == 3
    varying = make_dataset({"x": rows, "threshold": np.linspace(0, 1, 10, dtype=np.float32)}, info)
    assert varying.one_sample_per_run
    with pytest.raises(DataError, match=r"input\(s\) \['threshold'\] have no samples axis .* not 4"):
        varying.batch(0, 4)


def test_a_scalar_only_model_given_its_one_value_has_one_sample() -> None:
    """A 0-d array for a model whose only input is a scalar crashed with an IndexError."""
    info = ModelInfo(
        path="m.onnx", sha256="0" * 64, size_bytes=1, opset=17, parameters=0, op_counts={"Neg": 1},
        inputs=(TensorInfo(name="s", dtype="float32", shape=()),),
        outputs=(TensorInfo(name="y", dtype="float32", shape=()),),
    )  # fmt: skip
    data = make_dataset({"s": np.array(0.5, np.float32)}, info)
    assert data.n_samples == 1 and data.unbatched == {"s"}
    assert float(data.batch(0, 1)["s"]) == 0.5


def test_arrays_that_all_match_a_fixed_batch_are_samples_not_settings(tmp_path: Path) -> None:
    """A model with its batch fixed at 1 given exactly one sample: every array is shaped as its input, and that
    is one sample, not a setting given once."""
    from onnx import helper as h

    graph = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["y"])],
        "fixed",
        [h.make_tensor_value_info("a", 1, [1, 4]), h.make_tensor_value_info("b", 1, [1, 4])],
        [h.make_tensor_value_info("y", 1, [1, 4])],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
    data = make_dataset({"a": np.ones((1, 4), np.float32), "b": np.ones((1, 4), np.float32)}, inspect_model(path))
    assert not data.unbatched and data.n_samples == 1
    graph = h.make_graph(
        [h.make_node("Mul", ["a", "t"], ["y"])],
        "fixed_and_scalar",
        [h.make_tensor_value_info("a", 1, [2, 4]), h.make_tensor_value_info("t", 1, [])],
        [h.make_tensor_value_info("y", 1, [2, 4])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
    data = make_dataset({"a": np.ones((2, 4), np.float32), "t": np.array(2.0, np.float32)}, inspect_model(path))
    assert data.n_samples == 2 and data.per_run == {"t"} and not data.one_sample_per_run


def test_a_split_model_of_tiny_tensors_is_still_handed_on_whole(tmp_path: Path) -> None:
    """Each tensor kept beside costs its location entries (about 60 bytes): a model of tiny tensors split that way
    is no shorter than the model whole, and the file's size alone took it for one file."""
    from onnx import helper as h
    from onnx import numpy_helper

    graph = h.make_graph(
        [h.make_node("Add", ["x", "b"], ["y"])],
        "tiny",
        [h.make_tensor_value_info("x", 1, ["N", 2])],
        [h.make_tensor_value_info("y", 1, ["N", 2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "b")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    loaded = load_model(path)
    assert path.stat().st_size >= loaded.ByteSize() and weights_beside(path, loaded)
    assert model_bytes(path, loaded) == loaded.SerializeToString()


def test_an_array_as_long_as_the_samples_is_read_as_samples_not_as_a_setting(tmp_path: Path) -> None:
    """A fixed [4, 8] input given 4 rows beside 4 samples: samples, as ever (the rows would pair with them)."""
    from onnx import helper as h

    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "table"], ["y"])],
        "ambiguous",
        [h.make_tensor_value_info("x", 1, ["N", 4]), h.make_tensor_value_info("table", 1, [4, 8])],
        [h.make_tensor_value_info("y", 1, ["N", 8])],
    )
    path = tmp_path / "model.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
    info = inspect_model(path)
    four = make_dataset({"x": np.ones((4, 4), np.float32), "table": np.ones((4, 8), np.float32)}, info)
    assert not four.unbatched and four.n_samples == 4
    nine = make_dataset({"x": np.ones((9, 4), np.float32), "table": np.ones((4, 8), np.float32)}, info)
    assert nine.per_run == {"table"} and nine.n_samples == 9
