"""KServe v2 gRPC request/response codec: the same checks and messages as REST, and gRPC's own encodings."""

from __future__ import annotations

import json
from typing import Any

import grpc
import numpy as np
import pytest

from metainfer.agent.cli import build_parser
from metainfer.agent.serve import grpc_messages as pb
from metainfer.agent.serve.command import config_from_args
from metainfer.agent.serve.grpc_protocol import (
    encode_model_infer,
    grpc_code,
    model_metadata_response,
    parse_model_infer,
    parse_request,
)
from metainfer.agent.serve.protocol import (
    InferRequest,
    ProtocolError,
    Signature,
    TensorSpec,
    model_metadata,
    parse_infer_request,
)
from metainfer.core.engine.errors import InputError

SIG = Signature(
    inputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, 2))),
    outputs=(TensorSpec("y", "FP32", (-1, 3)), TensorSpec("z", "INT64", (-1,))),
    max_batch=8,
)


def _good(batch: int = 2) -> list[dict[str, Any]]:
    return [
        {"name": "x", "shape": [batch, 4], "datatype": "FP32", "data": list(range(batch * 4))},
        {"name": "ids", "shape": [batch, 2], "datatype": "INT64", "data": [1, 2] * batch},
    ]


def _grpc(inputs: list[dict[str, Any]], outputs: tuple[str, ...] = (), *, raw: bool = True) -> Any:
    """The gRPC twin of a REST request: each input's 'data' as raw little-endian bytes, or as typed contents."""
    request = pb.ModelInferRequest(model_name="m", outputs=[{"name": name} for name in outputs])
    for spec in inputs:
        tensor = request.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        values = np.asarray(spec["data"])
        if raw:
            dtype = {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8"}[spec["datatype"]]
            request.raw_input_contents.append(values.astype(dtype).tobytes())
        elif spec["datatype"] == "INT64":
            tensor.contents.int64_contents.extend(values.tolist())
        else:
            tensor.contents.fp32_contents.extend(values.tolist())
    return request


def _rest(inputs: list[dict[str, Any]], outputs: tuple[str, ...] = ()) -> bytes:
    doc: dict[str, Any] = {"inputs": inputs}
    if outputs:
        doc["outputs"] = [{"name": name} for name in outputs]
    return json.dumps(doc).encode()


def _refusal(call: Any) -> str:
    with pytest.raises(ProtocolError) as info:
        call()
    assert info.value.status == 400
    return str(info.value)


@pytest.mark.parametrize(
    ("inputs", "outputs", "needle"),
    [
        ([{**_good()[0], "datatype": "FP64"}, _good()[1]], (), "input 'x': datatype 'FP64' does not match"),
        ([{**_good()[0], "shape": [2, 5], "data": list(range(10))}, _good()[1]], (), "axis 1 has size 5"),
        ([{**_good()[0], "shape": [8], "data": list(range(8))}, _good()[1]], (), "shape [8] has 1 dims"),
        ([{**_good()[0], "shape": [2, 0], "data": []}, _good()[1]], (), "has an empty (0) dimension"),
        ([{**_good()[0], "shape": [-2, 4], "data": []}, _good()[1]], (), "has a negative dimension"),
        (_good(9), (), "batch 9 is larger than the allowed 8"),
        ([_good(2)[0], _good(3)[1]], (), "disagree on the batch size"),
        (_good()[:1], (), "missing input(s) ['ids']"),
        ([*_good(), {"name": "w", "shape": [1], "datatype": "FP32", "data": [1]}], (), "unknown input 'w'"),
        ([*_good(), _good()[0]], (), "input 'x' is given twice"),
        (_good(), ("nope",), "unknown output 'nope'"),
    ],
)
def test_a_request_refused_over_rest_is_refused_over_grpc_with_the_same_words(
    inputs: list[dict[str, Any]], outputs: tuple[str, ...], needle: str
) -> None:
    over_rest = _refusal(lambda: parse_infer_request(_rest(inputs, outputs), None, SIG))
    over_grpc_raw = _refusal(lambda: parse_model_infer(_grpc(inputs, outputs), SIG))
    over_grpc_typed = _refusal(lambda: parse_model_infer(_grpc(inputs, outputs, raw=False), SIG))
    assert needle in over_rest
    assert over_grpc_raw == over_rest and over_grpc_typed == over_rest


def test_raw_and_typed_contents_decode_to_what_rest_decodes() -> None:
    rest = parse_infer_request(_rest(_good(), ("z",)), None, SIG)
    for raw in (True, False):
        request = _grpc(_good(), ("z",), raw=raw)
        request.id = "r1"
        grpc_request = parse_model_infer(request, SIG)
        assert grpc_request.outputs == rest.outputs == ["z"] and grpc_request.id == "r1"
        for name, array in rest.inputs.items():
            assert grpc_request.inputs[name].dtype == array.dtype
            np.testing.assert_array_equal(grpc_request.inputs[name], array)
    every = parse_model_infer(_grpc(_good()), SIG)
    assert every.outputs == ["y", "z"] and every.id is None


def test_each_datatype_takes_its_own_typed_field_and_its_range() -> None:
    sig = Signature(
        inputs=(TensorSpec("b", "BOOL", (2,)), TensorSpec("i8", "INT8", (2,)), TensorSpec("u16", "UINT16", (2,))),
        outputs=(TensorSpec("o", "FP32", (1,)),),
        max_batch=8,
    )

    def request(i8: list[int], u16: list[int]) -> Any:
        req = pb.ModelInferRequest(model_name="m")
        req.inputs.add(name="b", datatype="BOOL", shape=[2]).contents.bool_contents.extend([True, False])
        req.inputs.add(name="i8", datatype="INT8", shape=[2]).contents.int_contents.extend(i8)
        req.inputs.add(name="u16", datatype="UINT16", shape=[2]).contents.uint_contents.extend(u16)
        return req

    decoded = parse_model_infer(request([-128, 127], [0, 65535]), sig).inputs
    assert decoded["b"].dtype == np.bool_ and decoded["b"].tolist() == [True, False]
    assert decoded["i8"].dtype == np.int8 and decoded["i8"].tolist() == [-128, 127]
    assert decoded["u16"].dtype == np.uint16 and decoded["u16"].tolist() == [0, 65535]
    assert "input 'i8': a value in contents.int_contents does not fit INT8" in _refusal(
        lambda: parse_model_infer(request([0, 128], [0, 1]), sig)
    )
    assert "input 'u16': a value in contents.uint_contents does not fit UINT16" in _refusal(
        lambda: parse_model_infer(request([0, 1], [0, 65536]), sig)
    )


def test_fp16_travels_as_raw_contents_only() -> None:
    sig = Signature(
        inputs=(TensorSpec("h", "FP16", (-1, 2)),), outputs=(TensorSpec("o", "FP16", (-1, 2)),), max_batch=4
    )
    half = np.array([[0.5, -2.0]], dtype=np.float16)
    raw = pb.ModelInferRequest(model_name="m", raw_input_contents=[half.tobytes()])
    raw.inputs.add(name="h", datatype="FP16", shape=[1, 2])
    np.testing.assert_array_equal(parse_model_infer(raw, sig).inputs["h"], half)
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="h", datatype="FP16", shape=[1, 2]).contents.fp32_contents.extend([0.5, -2.0])
    assert "FP16 values travel in raw_input_contents only" in _refusal(lambda: parse_model_infer(typed, sig))


def test_grpc_encoding_mistakes_name_the_problem() -> None:
    short = _grpc(_good())
    del short.raw_input_contents[1]
    assert "raw_input_contents has 1 entries for 2 inputs" in _refusal(lambda: parse_model_infer(short, SIG))

    both = _grpc(_good())
    both.inputs[0].contents.fp32_contents.append(1.0)
    assert "input 'x': values in both raw_input_contents and contents" in _refusal(lambda: parse_model_infer(both, SIG))

    truncated = _grpc(_good())
    truncated.raw_input_contents[0] = truncated.raw_input_contents[0][:-4]
    assert "input 'x': raw_input_contents[0] holds 28 bytes, shape [2, 4] of FP32 needs 32" in _refusal(
        lambda: parse_model_infer(truncated, SIG)
    )

    wrong_field = _grpc(_good(), raw=False)
    wrong_field.inputs[1].ClearField("contents")
    wrong_field.inputs[1].contents.int_contents.extend([1, 2, 1, 2])
    assert "input 'ids': INT64 values go in contents.int64_contents, not in int_contents" in _refusal(
        lambda: parse_model_infer(wrong_field, SIG)
    )

    empty = _grpc(_good(), raw=False)
    empty.inputs[0].ClearField("contents")
    assert "input 'x': no raw_input_contents and no contents.fp32_contents" in _refusal(
        lambda: parse_model_infer(empty, SIG)
    )

    too_few = _grpc(_good(), raw=False)
    del too_few.inputs[0].contents.fp32_contents[-1]
    assert "input 'x': 7 elements in contents.fp32_contents but shape [2, 4] needs 8" in _refusal(
        lambda: parse_model_infer(too_few, SIG)
    )

    assert "non-empty 'inputs'" in _refusal(lambda: parse_model_infer(pb.ModelInferRequest(model_name="m"), SIG))
    assert "not a valid ModelInferRequest" in _refusal(lambda: parse_request(b"\xff\xff\xff\xff"))


def test_the_response_carries_every_output_as_raw_little_endian_bytes() -> None:
    y = np.array([[np.nan, np.inf, -1.0]], dtype=np.float32)  # what REST's JSON cannot carry
    z = np.array([7], dtype=np.int64)
    data = encode_model_infer("m", "1", InferRequest(inputs={}, outputs=["z", "y"], id="r9"), {"y": y, "z": z})
    response = pb.ModelInferResponse.FromString(data)
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r9")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("z", "INT64", [1]),
        ("y", "FP32", [1, 3]),
    ]
    assert response.raw_output_contents[0] == z.astype("<i8").tobytes()
    assert response.raw_output_contents[1] == y.astype("<f4").tobytes()


def test_metadata_is_rests_document() -> None:
    response = model_metadata_response(model_metadata("m", ["1"], SIG))
    assert (response.name, list(response.versions), response.platform) == ("m", ["1"], "onnxruntime")
    assert [(t.name, t.datatype, list(t.shape)) for t in response.inputs] == [
        ("x", "FP32", [-1, 4]),
        ("ids", "INT64", [-1, 2]),
    ]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (404, grpc.StatusCode.NOT_FOUND),
        (408, grpc.StatusCode.DEADLINE_EXCEEDED),
        (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (422, grpc.StatusCode.INVALID_ARGUMENT),
        (499, grpc.StatusCode.CANCELLED),
        (500, grpc.StatusCode.INTERNAL),
        (503, grpc.StatusCode.UNAVAILABLE),
        (418, grpc.StatusCode.UNKNOWN),
    ],
)
def test_http_statuses_map_to_the_grpc_codes_clients_expect(status: int, code: grpc.StatusCode) -> None:
    assert grpc_code(status) == code


def _args(*extra: str) -> Any:
    return build_parser().parse_args(["serve", "--model-uri", "file:///m.onnx", "--recipe-json", "{}", *extra])


def test_grpc_port_flag() -> None:
    assert config_from_args(_args()).grpc_port == 8081
    assert config_from_args(_args("--grpc-port", "0")).grpc_port == 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--grpc-port", "70000"], "must be a port number"), (["--grpc-port", "9000", "--port", "9000"], "also --port")],
)
def test_grpc_port_flag_mistakes_name_the_flag(extra: list[str], needle: str) -> None:
    with pytest.raises(InputError, match="--grpc-port") as info:
        config_from_args(_args(*extra))
    assert needle in str(info.value)
