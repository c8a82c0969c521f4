"""Open Inference Protocol (KServe v2) gRPC messages <-> numpy, with no I/O: the gRPC twin of ``protocol``.

Every rule about a request is ``protocol``'s (model name and version, input names, datatypes, shapes, empty axes,
element counts, value ranges, missing or repeated inputs, batch size, output names); this module only reads a
``ModelInferRequest`` into those checks and writes a ``ModelInferResponse``, so a request refused over REST is
refused over gRPC with the same message.

An input's values come either in ``raw_input_contents`` (one entry per input, in order: what tritonclient.grpc
sends) or in the typed field of ``contents`` that belongs to its datatype. Outputs always go back as
``raw_output_contents``, what tritonclient.grpc and kserve's client read by default; raw bytes also carry NaN and
infinities, which REST's JSON cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np

from metainfer.agent.serve import grpc_messages as pb
from metainfer.agent.serve.protocol import (
    InferRequest,
    ProtocolError,
    Signature,
    TensorSpec,
    array_from_bytes,
    array_from_values,
    check_input,
    check_inputs,
    check_output,
    datatype_of,
    tensor_bytes,
)

# The field of InferTensorContents that carries each datatype (FP16 has none: raw contents only), and the numpy type
# its values are read as; the shared checks then narrow them to the datatype, refusing what does not fit.
CONTENTS_FIELDS: dict[str, tuple[str, type[np.generic]]] = {
    "BOOL": ("bool_contents", np.bool_),
    "INT8": ("int_contents", np.int64),
    "INT16": ("int_contents", np.int64),
    "INT32": ("int_contents", np.int64),
    "INT64": ("int64_contents", np.int64),
    "UINT8": ("uint_contents", np.uint64),
    "UINT16": ("uint_contents", np.uint64),
    "UINT32": ("uint_contents", np.uint64),
    "UINT64": ("uint64_contents", np.uint64),
    "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64),
}

# ProtocolError's HTTP status -> the gRPC code a v2 client expects for it; the HTTP status stays the metric's label.
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(status: int) -> grpc.StatusCode:
    return STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN)


def parse_request(data: bytes) -> Any:
    """The ModelInferRequest in ``data``; a client error (400) when it is not one."""
    try:
        return pb.ModelInferRequest.FromString(data)
    except Exception as exc:  # protobuf's DecodeError, or a RuntimeError from the C parser on deep nesting
        raise ProtocolError(f"the request is not a valid ModelInferRequest ({type(exc).__name__})") from None


def parse_model_infer(request: Any, signature: Signature) -> InferRequest:
    """Check a ModelInferRequest against the model and decode its tensors."""
    if not request.inputs:
        raise ProtocolError("request needs a non-empty 'inputs' list")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: it needs one per input,"
            " in the order of 'inputs'"
        )
    arrays: list[tuple[str, np.ndarray]] = []
    for index, tensor in enumerate(request.inputs):
        spec = check_input(tensor.name, tensor.datatype, tensor.shape, signature)
        shape = tuple(tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise ProtocolError(f"input {tensor.name!r}: values in both raw_input_contents and contents")
            array = array_from_bytes(raw[index], shape, spec, f"raw_input_contents[{index}]")
        else:
            array = _from_contents(tensor.contents, shape, spec)
        arrays.append((tensor.name, array))
    inputs = check_inputs(arrays, signature)
    outputs = [check_output(output.name, signature) for output in request.outputs]
    every = [spec.name for spec in signature.outputs]
    return InferRequest(inputs=inputs, outputs=outputs or every, id=request.id or None)


def _from_contents(contents: Any, shape: tuple[int, ...], spec: TensorSpec) -> np.ndarray:
    given = [descriptor.name for descriptor, _ in contents.ListFields()]
    if spec.datatype not in CONTENTS_FIELDS:
        raise ProtocolError(f"input {spec.name!r}: {spec.datatype} values travel in raw_input_contents only")
    name, dtype = CONTENTS_FIELDS[spec.datatype]
    if not given:
        raise ProtocolError(f"input {spec.name!r}: no raw_input_contents and no contents.{name}")
    if given != [name]:
        other = next(field for field in given if field != name)
        raise ProtocolError(f"input {spec.name!r}: {spec.datatype} values go in contents.{name}, not in {other}")
    values = getattr(contents, name)
    return array_from_values(np.fromiter(values, dtype=dtype, count=len(values)), shape, spec, f"contents.{name}")


def encode_model_infer(
    model_name: str, model_version: str, request: InferRequest, results: Mapping[str, np.ndarray]
) -> bytes:
    """The serialized ModelInferResponse: every requested output as raw contents."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request.id or "")
    for name in request.outputs:
        array = np.ascontiguousarray(results[name])
        response.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
        response.raw_output_contents.append(tensor_bytes(array))
    return bytes(response.SerializeToString())


def model_metadata_response(doc: Mapping[str, Any]) -> Any:
    """``protocol.model_metadata``'s document as a ModelMetadataResponse."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=doc["name"],
        versions=doc["versions"],
        platform=doc["platform"],
        inputs=[tensor(**spec) for spec in doc["inputs"]],
        outputs=[tensor(**spec) for spec in doc["outputs"]],
    )
