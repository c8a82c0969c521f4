"""KServe v2 request/response codec: every malformed request is refused with a message naming the problem."""

from __future__ import annotations

import json

import numpy as np
import pytest

from metainfer.agent.serve.protocol import (
    InferRequest,
    ProtocolError,
    Signature,
    TensorSpec,
    encode_infer_response,
    model_metadata,
    parse_infer_request,
)
from metainfer.core.engine.index_inputs import IndexBound

SIG = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, 2))),
    outputs=(TensorSpec("y", "FP32", (-1, 3)), TensorSpec("z", "INT64", (-1,))),
    max_batch=8,
)


def _body(inputs: list[dict], **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _good(batch: int = 2) -> list[dict]:
    return [
        {"name": "x", "shape": [batch, 4], "datatype": "FP32", "data": list(range(batch * 4))},
        {"name": "ids", "shape": [batch, 2], "datatype": "INT64", "data": [[1, 2]] * batch},
    ]


def test_json_request_flat_and_nested() -> None:
    req = parse_infer_request(_body(_good(), id="r1"), None, SIG)
    assert req.id == "r1"
    assert req.inputs["x"].dtype == np.float32 and req.inputs["x"].shape == (2, 4)
    assert req.inputs["ids"].dtype == np.int64 and req.inputs["ids"].tolist() == [[1, 2], [1, 2]]
    assert req.outputs == ["y", "z"] and req.binary_outputs == set()


def test_binary_inputs_and_output_selection() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ids = np.array([[3, 4], [5, 6]], dtype=np.int64)
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
                {"name": "ids", "shape": [2, 2], "datatype": "INT64", "parameters": {"binary_data_size": ids.nbytes}},
            ],
            "outputs": [{"name": "z", "parameters": {"binary_data": True}}],
        }
    ).encode()
    req = parse_infer_request(header + x.tobytes() + ids.tobytes(), str(len(header)), SIG)
    np.testing.assert_array_equal(req.inputs["x"], x)
    np.testing.assert_array_equal(req.inputs["ids"], ids)
    assert req.outputs == ["z"] and req.binary_outputs == {"z"}


def test_binary_data_output_parameter_applies_to_all_outputs() -> None:
    req = parse_infer_request(_body(_good(), parameters={"binary_data_output": True}), None, SIG)
    assert req.binary_outputs == {"y", "z"}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (_body([]), "non-empty 'inputs'"),
        (_body(_good()[:1]), "missing input(s) ['ids']"),
        (_body([*_good(), {"name": "w", "shape": [1], "datatype": "FP32", "data": [1]}]), "unknown input 'w'"),
        (_body([{**_good()[0], "datatype": "FP64"}, _good()[1]]), "input 'x': datatype 'FP64'"),
        (_body([{**_good()[0], "shape": [2, 5]}, _good()[1]]), "input 'x': axis 1 has size 5"),
        (_body([{**_good()[0], "shape": [8]}, _good()[1]]), "input 'x': shape [8] has 1 dims"),
        (_body([{**_good()[0], "data": [1, 2, 3]}, _good()[1]]), "input 'x': 3 elements"),
        (_body([{**_good()[0], "data": ["a"] * 8}, _good()[1]]), "input 'x': 'data' holds"),
        (_body([{**_good()[0], "data": [[1, 2], [3]]}, _good()[1]]), "ragged"),
        (_body([{**_good()[1], "data": [[1.5, 2]] * 2}, _good()[0]]), "input 'ids': 'data' holds"),
        (_body([{**_good()[0], "shape": "2x4"}, _good()[1]]), "'shape' must be a list"),
        (_body([_good(2)[0], _good(3)[1]]), "disagree on the batch size"),
        (_body(_good(9)), "batch 9 is larger than the allowed 8"),
        (_body(_good(), outputs=[{"name": "nope"}]), "unknown output 'nope'"),
        (_body([{"name": "x", "shape": [2, 4], "datatype": "FP32"}, _good()[1]]), "input 'x': no 'data'"),
    ],
)
def test_malformed_requests_name_the_problem(body: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(body, None, SIG)
    assert info.value.status == 400
    assert needle in str(info.value)


def test_binary_size_mismatch_and_truncation() -> None:
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
    ).encode()
    with pytest.raises(ProtocolError, match="truncated"):
        parse_infer_request(header + b"\0" * 8, str(len(header)), SIG)
    with pytest.raises(ProtocolError, match="outside"):
        parse_infer_request(header, "99999", SIG)
    with pytest.raises(ProtocolError, match="not an integer"):
        parse_infer_request(header, "abc", SIG)


def test_response_json_and_binary() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    z = np.array([7, 8], dtype=np.int64)
    plain = InferRequest(inputs={}, outputs=["y", "z"], id="abc")
    body, header = encode_infer_response("m", "1", plain, {"y": y, "z": z})
    assert header is None
    doc = json.loads(body)
    assert doc["id"] == "abc" and doc["model_name"] == "m" and doc["model_version"] == "1"
    assert doc["outputs"][0] == {"name": "y", "shape": [2, 3], "datatype": "FP32", "data": [0, 1, 2, 3, 4, 5]}

    binary = InferRequest(inputs={}, outputs=["y"], binary_outputs={"y"})
    body, header = encode_infer_response("m", "1", binary, {"y": y, "z": z})
    assert header is not None
    doc = json.loads(body[:header])
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": y.nbytes}
    np.testing.assert_array_equal(np.frombuffer(body[header:], dtype=np.float32).reshape(2, 3), y)


def test_metadata_marks_dynamic_dims() -> None:
    meta = model_metadata("m", ["1"], SIG)
    assert meta["platform"] == "onnxruntime"
    assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 4]}


def test_client_mistakes_are_400s_not_500s() -> None:
    """Found by a hostile client: an empty axis, 100k nested brackets, "false" read as true."""
    empty = _good()
    empty[0]["shape"] = [1, 0]
    empty[0]["data"] = []
    with pytest.raises(ProtocolError, match="empty") as info:
        parse_infer_request(_body(empty), None, SIG)
    assert info.value.status == 400
    with pytest.raises(ProtocolError, match="too deeply") as info:
        parse_infer_request(b"[" * 100_000 + b"]" * 100_000, None, SIG)
    assert info.value.status == 400
    for value in ("false", 0, None):
        with pytest.raises(ProtocolError, match="binary_data_output must be true or false"):
            parse_infer_request(_body(_good(), parameters={"binary_data_output": value}), None, SIG)


def test_a_nan_output_is_never_written_as_invalid_json() -> None:
    from metainfer.agent.serve.protocol import encode_infer_response

    req = parse_infer_request(_body(_good()), None, SIG)
    nan = {"y": np.full((2, 3), np.nan, dtype=np.float32), "z": np.zeros(2, dtype=np.int64)}
    with pytest.raises(ProtocolError, match="NaN or infinite") as info:
        encode_infer_response("m", "1", req, nan)
    assert info.value.status == 422
    req.binary_outputs.update(req.outputs)  # as binary data NaN is just bytes
    body, header = encode_infer_response("m", "1", req, nan)
    assert header is not None and json.loads(body[:header])


def test_the_largest_legal_body_follows_the_batch_and_the_shapes() -> None:
    from metainfer.agent.serve.protocol import BODY_OVERHEAD_BYTES, JSON_CHARS_PER_ELEMENT, max_body_bytes

    per_sample = (4 + 2) * JSON_CHARS_PER_ELEMENT  # x: 4 floats, ids: 2 integers, as JSON
    assert max_body_bytes(SIG, dynamic_dim_limit=512) == SIG.max_batch * per_sample + BODY_OVERHEAD_BYTES
    dynamic = Signature(inputs=(TensorSpec("t", "INT64", (-1, -1)),), outputs=SIG.outputs, max_batch=4)
    assert max_body_bytes(dynamic, dynamic_dim_limit=128) == 4 * 128 * JSON_CHARS_PER_ELEMENT + BODY_OVERHEAD_BYTES


def test_model_name_and_version_checks() -> None:
    from metainfer.agent.serve.protocol import check_model

    for version in (None, "", "1"):
        check_model("m", version, "m", "1")
    with pytest.raises(ProtocolError, match="unknown model 'other'; this server serves 'm'") as info:
        check_model("other", None, "m", "1")
    assert info.value.status == 404
    with pytest.raises(ProtocolError, match="model 'm' has no version '2'; it has '1'") as info:
        check_model("m", "2", "m", "1")
    assert info.value.status == 404


def test_the_element_types_a_model_may_use_are_the_ones_serving_carries() -> None:
    """load_model refuses a model whose inputs or outputs serving could not answer in: the two lists are one fact."""
    from onnx.helper import tensor_dtype_to_np_dtype

    from metainfer.agent.serve.protocol import DATATYPES
    from metainfer.core.engine.modelinfo import NUMERIC_ELEMENTS

    assert {tensor_dtype_to_np_dtype(element) for element in NUMERIC_ELEMENTS} == set(DATATYPES.values())


BOUNDED = Signature(
    inputs=(TensorSpec("input_ids", "INT64", (-1, -1)), TensorSpec("mask", "INT64", (-1, -1))),
    outputs=(TensorSpec("y", "FP32", (-1, -1, 4)),),
    max_batch=8,
    index_bounds={"input_ids": IndexBound("input_ids", 100, "embeddings.word_embeddings.weight")},
)


def _ids(values: list[list[int]]) -> bytes:
    shape = [len(values), len(values[0])]
    return _body([
        {"name": "input_ids", "shape": shape, "datatype": "INT64", "data": values},
        {"name": "mask", "shape": shape, "datatype": "INT64", "data": [[1] * shape[1]] * shape[0]},
    ])  # fmt: skip


def test_an_id_past_the_table_it_indexes_is_refused_naming_the_input_and_the_table() -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_infer_request(_ids([[1, 2, 3], [4, 100, 6]]), None, BOUNDED)
    assert refused.value.status == 400
    message = str(refused.value)
    assert "'input_ids'" in message and "value 100 at [1, 1]" in message and "[-100, 99]" in message
    assert "embeddings.word_embeddings.weight" in message
    with pytest.raises(ProtocolError, match="value -101 at"):
        parse_infer_request(_ids([[-101, 2]]), None, BOUNDED)


def test_ids_within_the_table_pass_including_onnx_negative_ones_and_other_inputs_are_not_checked() -> None:
    request = parse_infer_request(_ids([[0, 99, -100], [5, 6, 7]]), None, BOUNDED)
    assert request.inputs["input_ids"].tolist() == [[0, 99, -100], [5, 6, 7]]
    body = _body([
        {"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
        {"name": "mask", "shape": [1, 2], "datatype": "INT64", "data": [100000, -5]},
    ])  # fmt: skip
    assert parse_infer_request(body, None, BOUNDED).inputs["mask"].tolist() == [[100000, -5]]
