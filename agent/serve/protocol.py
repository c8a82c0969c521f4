"""Open Inference Protocol (KServe v2) requests and responses <-> numpy, with no I/O.

Kept pure so every malformed-request rule is unit-tested without a server: a
front end only turns a ``ProtocolError`` into its answer (an HTTP status and a
JSON ``{"error": ...}``, or a gRPC status). Each message names the input and the
problem, because the caller is usually a person debugging a client.

What is checked does not depend on how a request is encoded, so the checks
live here once and both decoders call them: the model name and version
(``check_model``), each input's name, datatype and shape (``check_input``), its
values (``array_from_bytes``, ``array_from_values``), the set of inputs and the
batch (``check_inputs``), the requested outputs (``check_output``). The REST
decoder is below; the gRPC one is ``grpc_protocol``.

Two REST encodings are accepted, as Triton and KServe do:

* JSON: ``data`` holds the elements, flat (row-major) or nested;
* the binary tensor extension (tritonclient's default): the JSON header is the
  first ``Inference-Header-Content-Length`` bytes of the body, and an input
  with ``parameters.binary_data_size`` takes that many raw little-endian bytes
  from what follows, in input order. Outputs are returned the same way when the
  request asks for it (``parameters.binary_data_output`` or a requested
  output's ``parameters.binary_data``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from metainfer.core.engine.index_inputs import IndexBound

# v2 datatype names <-> numpy. BYTES/BF16 are left out: load_model refuses models that take or give them
# (core.engine.modelinfo.NUMERIC_ELEMENTS, the same types; a unit test keeps the two lists equal).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


class ProtocolError(Exception):
    """A request the server refuses; ``status`` is the HTTP code (400 unless said otherwise)."""

    def __init__(self, message: str, status: int = 400, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


def datatype_of(dtype: np.dtype[Any] | str) -> str:
    """The v2 datatype name of a numpy dtype (``float32`` -> ``FP32``)."""
    try:
        return _NAMES[np.dtype(dtype)]
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"dtype {dtype} has no Open Inference Protocol datatype", status=500) from exc


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the protocol describes it; -1 marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    """What requests are checked against: the model's inputs/outputs and the largest batch allowed."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    # The runtime that runs the variant (the recipe's session.runtime), as model metadata's "platform".
    platform: str = "onnxruntime"
    # Inputs that index a constant table (token, position, type ids), checked against it: core.engine.index_inputs.
    index_bounds: Mapping[str, IndexBound] = field(default_factory=dict)

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    @property
    def dynamic_first_axes(self) -> bool:
        """Every input and output has a dynamic first axis: the shapes allow combining requests along it."""
        return all(spec.shape and spec.shape[0] < 0 for spec in (*self.inputs, *self.outputs))


@dataclass
class InferRequest:
    """A checked request: arrays ready for ONNX Runtime and how to send each output back."""

    inputs: dict[str, np.ndarray]
    outputs: list[str]
    binary_outputs: set[str] = field(default_factory=set)
    id: str | None = None


# -- the checks every encoding shares ------------------------------------------------------------------------------
def check_model(name: str, version: str | None, served: str, served_version: str) -> None:
    """A request addressed to the served model: 404 for another name, or a version it does not have (no version,
    or an empty one, lets the server choose)."""
    if name != served:
        raise ProtocolError(f"unknown model {name!r}; this server serves {served!r}", 404)
    if version and version != served_version:
        raise ProtocolError(f"model {name!r} has no version {version!r}; it has {served_version!r}", 404)


def check_input(name: str, datatype: Any, shape: Sequence[int], signature: Signature) -> TensorSpec:
    """The model's spec of input ``name``, once the input is known and its shape and datatype fit the model."""
    spec = signature.input(name)
    if spec is None:
        raise ProtocolError(f"unknown input {name!r}; the model's inputs are {_names(signature.inputs)}")
    dims = list(shape)
    if any(d < 0 for d in dims):
        raise ProtocolError(f"input {name!r}: shape {dims} has a negative dimension")
    if any(d == 0 for d in dims):  # an empty tensor: ONNX Runtime's kernels fail on it with a 500 otherwise
        raise ProtocolError(f"input {name!r}: shape {dims} has an empty (0) dimension")
    if datatype != spec.datatype:
        raise ProtocolError(f"input {name!r}: datatype {datatype!r} does not match the model's {spec.datatype}")
    _check_shape(tuple(dims), spec)
    return spec


def array_from_bytes(raw: bytes | memoryview, shape: tuple[int, ...], spec: TensorSpec, where: str) -> np.ndarray:
    """An input's array from its raw little-endian bytes (``where`` names them in errors)."""
    dtype, count = DATATYPES[spec.datatype], math.prod(shape)
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {spec.name!r}: {where} holds {len(raw)} bytes, shape {list(shape)} of {spec.datatype} needs"
            f" {count * dtype.itemsize}"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=count)
    return array.astype(dtype).reshape(shape)


def array_from_values(data: Any, shape: tuple[int, ...], spec: TensorSpec, where: str = "'data'") -> np.ndarray:
    """An input's array from a (possibly nested) sequence of values: as many as the shape holds, of a kind the
    datatype takes, each within its range (``where`` names the values in errors)."""
    name, datatype, dtype = spec.name, spec.datatype, DATATYPES[spec.datatype]
    try:
        flat = np.asarray(data).reshape(-1)
    except ValueError:
        raise ProtocolError(f"input {name!r}: {where} is a ragged nested list") from None
    except RecursionError:
        raise ProtocolError(f"input {name!r}: {where} nests lists too deeply") from None
    if flat.size != math.prod(shape):
        raise ProtocolError(
            f"input {name!r}: {flat.size} elements in {where} but shape {list(shape)} needs {math.prod(shape)}"
        )
    kind = flat.dtype.kind if flat.size else dtype.kind
    allowed = {"b": "b", "u": "biu", "i": "biu", "f": "biuf"}[dtype.kind]
    if kind not in allowed:
        raise ProtocolError(f"input {name!r}: {where} holds {flat.dtype} values, not {datatype}")
    if dtype.kind in "iu" and flat.size and (flat.min() < np.iinfo(dtype).min or flat.max() > np.iinfo(dtype).max):
        raise ProtocolError(f"input {name!r}: a value in {where} does not fit {datatype}")
    return flat.astype(dtype).reshape(shape)


def check_inputs(arrays: Sequence[tuple[str, np.ndarray]], signature: Signature) -> dict[str, np.ndarray]:
    """The decoded inputs by name: each given once, none missing, one batch size within the allowed one."""
    inputs: dict[str, np.ndarray] = {}
    for name, array in arrays:
        if name in inputs:
            raise ProtocolError(f"input {name!r} is given twice")
        inputs[name] = array
    missing = [spec.name for spec in signature.inputs if spec.name not in inputs]
    if missing:
        raise ProtocolError(f"missing input(s) {missing}; the model's inputs are {_names(signature.inputs)}")
    batches = {name: array.shape[0] for name, array in inputs.items() if array.ndim}
    if len(set(batches.values())) > 1:
        raise ProtocolError(f"inputs disagree on the batch size (first axis): {batches}")
    for name, batch in batches.items():
        if batch > signature.max_batch:
            raise ProtocolError(f"input {name!r}: batch {batch} is larger than the allowed {signature.max_batch}")
        if batch == 0:
            raise ProtocolError(f"input {name!r}: batch size is 0")
    for name, bound in signature.index_bounds.items():
        check_indices(inputs[name], bound)
    return inputs


def check_indices(array: np.ndarray, bound: IndexBound) -> None:
    """An index input's values, each within the table it indexes: runtimes disagree on an id past the table (one
    refuses the run, another answers with numbers), so the server refuses it before any runtime sees it."""
    if array.dtype.kind not in "iu" or not array.size:
        return  # a float index is cast by the graph itself; what it becomes is the runtime's to say
    low, high = int(array.min()), int(array.max())
    rows = bound.rows
    if low >= -rows and high < rows:
        return
    bad = high if high >= rows else low
    at = [int(i) for i in np.argwhere(array == bad)[0]]
    raise ProtocolError(
        f"input {bound.input!r}: value {bad} at {at} is outside [{-rows}, {rows - 1}]: it indexes the {rows} rows of"
        f" {bound.table[:80]!r} (a token id past the vocabulary, or a position past the longest sequence?)"
    )


def check_output(name: str, signature: Signature) -> str:
    """A requested output the model has."""
    known = _names(signature.outputs)
    if name not in known:
        raise ProtocolError(f"unknown output {name!r}; the model's outputs are {known}")
    return name


def tensor_bytes(array: np.ndarray) -> bytes:
    """An output's elements, row-major and little-endian, as both binary encodings carry them."""
    array = np.ascontiguousarray(array)
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def _check_shape(shape: tuple[int, ...], spec: TensorSpec) -> None:
    if len(shape) != len(spec.shape):
        raise ProtocolError(
            f"input {spec.name!r}: shape {list(shape)} has {len(shape)} dims, the model expects"
            f" {len(spec.shape)} {list(spec.shape)}"
        )
    for axis, (have, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if want >= 0 and have != want:
            raise ProtocolError(
                f"input {spec.name!r}: axis {axis} has size {have}, the model expects {want} (shape {list(spec.shape)})"
            )


# -- REST: JSON and the binary tensor extension ----------------------------------------------------------------------
def split_body(body: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """The parsed JSON header and the binary tail (empty for a pure JSON request)."""
    if header_length is None:
        head, tail = body, b""
    else:
        try:
            size = int(header_length)
        except ValueError:
            raise ProtocolError(f"Inference-Header-Content-Length {header_length!r} is not an integer") from None
        if not 0 < size <= len(body):
            raise ProtocolError(f"Inference-Header-Content-Length {size} is outside the {len(body)} byte request body")
        head, tail = body[:size], body[size:]
    try:
        return json.loads(head), tail
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # 100k nested brackets: a client error, never a 500
        raise ProtocolError("request body nests JSON arrays or objects too deeply") from None


def parse_infer_request(body: bytes, header_length: str | None, signature: Signature) -> InferRequest:
    """Check a v2 inference request against the model and decode its tensors."""
    doc, tail = split_body(body, header_length)
    if not isinstance(doc, dict):
        raise ProtocolError("request body must be a JSON object with an 'inputs' list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("request needs a non-empty 'inputs' list")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError("'id' must be a string")
    arrays: list[tuple[str, np.ndarray]] = []
    offset = 0
    for index, raw in enumerate(raw_inputs):
        array, used = _decode_input(raw, index, tail, offset, signature)
        offset += used
        arrays.append((raw["name"], array))
    if offset != len(tail):
        raise ProtocolError(f"request carries {len(tail) - offset} binary bytes that no input claims")
    inputs = check_inputs(arrays, signature)
    outputs, binary = _requested_outputs(doc, signature)
    return InferRequest(inputs=inputs, outputs=outputs, binary_outputs=binary, id=request_id)


def _decode_input(raw: Any, index: int, tail: bytes, offset: int, signature: Signature) -> tuple[np.ndarray, int]:
    """One input's array and the number of binary bytes it consumed."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ProtocolError(f"inputs[{index}] must be an object with a string 'name'")
    name = raw["name"]
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ProtocolError(f"input {name!r}: 'shape' must be a list of integers")
    spec = check_input(name, raw.get("datatype"), shape, signature)
    shape = tuple(shape)
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError(f"input {name!r}: 'parameters' must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        needed = math.prod(shape) * DATATYPES[spec.datatype].itemsize
        if not isinstance(size, int) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be a non-negative integer")
        if size != needed:
            raise ProtocolError(
                f"input {name!r}: binary_data_size {size} bytes does not hold shape {list(shape)} of {spec.datatype}"
                f" ({needed} bytes)"
            )
        if offset + size > len(tail):
            raise ProtocolError(f"input {name!r}: binary data is truncated ({len(tail) - offset} of {size} bytes)")
        return array_from_bytes(memoryview(tail)[offset : offset + size], shape, spec, "binary data"), size
    if "data" not in raw:
        raise ProtocolError(f"input {name!r}: no 'data' and no binary_data_size parameter")
    return array_from_values(raw["data"], shape, spec), 0


def _requested_outputs(doc: Mapping[str, Any], signature: Signature) -> tuple[list[str], set[str]]:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("'parameters' must be an object")
    default_binary = _flag(params.get("binary_data_output", False), "parameters.binary_data_output")
    requested = doc.get("outputs")
    if requested is None:
        known = _names(signature.outputs)
        return known, set(known) if default_binary else set()
    if not isinstance(requested, list):
        raise ProtocolError("'outputs' must be a list")
    names: list[str] = []
    binary: set[str] = set()
    for index, raw in enumerate(requested):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ProtocolError(f"outputs[{index}] must be an object with a string 'name'")
        name = check_output(raw["name"], signature)
        out_params = raw.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise ProtocolError(f"output {name!r}: 'parameters' must be an object")
        if _flag(out_params.get("binary_data", default_binary), f"output {name!r}: parameters.binary_data"):
            binary.add(name)
        names.append(name)
    return names, binary


def _flag(value: Any, where: str) -> bool:
    """A boolean parameter; the string "false" used to read as true."""
    if not isinstance(value, bool):
        raise ProtocolError(f"{where} must be true or false, got {json.dumps(value)[:40]}")
    return value


def encode_infer_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name in request.outputs:
        array = np.ascontiguousarray(results[name])
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype_of(array.dtype)}
        if name in request.binary_outputs:
            raw = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise ProtocolError(
                    f"output {name!r} holds NaN or infinite values, which JSON cannot carry: request it as binary data"
                    ' (parameters: {"binary_data": true})',
                    status=422,
                )
            entry["data"] = array.reshape(-1)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": outputs}
    if request.id is not None:
        doc["id"] = request.id
    # orjson writes numpy arrays without a Python float per value: 23 ms instead of 690 ms for a [1024, 512] FP32
    # output, and each value as the shortest text that reads back to the same float32 (5.7 MB instead of 10.3 MB).
    # The time matters beyond the request: a JSON encoder holds the GIL from start to end, and the event loop needs
    # the GIL at every step of every other request, liveness probes included (2.4 s probes while 50 such answers
    # were encoded with json.dumps).
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def model_metadata(name: str, versions: Sequence[str], signature: Signature) -> dict[str, Any]:
    """The v2 model metadata document."""
    return {
        "name": name,
        "versions": list(versions),
        "platform": signature.platform,
        "inputs": [spec.metadata() for spec in signature.inputs],
        "outputs": [spec.metadata() for spec in signature.outputs],
    }


def _names(specs: Sequence[TensorSpec]) -> list[str]:
    return [spec.name for spec in specs]


# JSON spends at most this many characters per element: a float32 as repr ("-1.2345678e-05") and its ", ".
# Protobuf spends at most 10 bytes (a varint) on one, so the bound holds for a gRPC message too.
JSON_CHARS_PER_ELEMENT = 24
BODY_OVERHEAD_BYTES = 64 << 10  # names, shapes, parameters, id


def max_body_bytes(signature: Signature, dynamic_dim_limit: int) -> int:
    """The largest body a legal request can need: every input at the largest batch, each dynamic non-batch axis
    at ``dynamic_dim_limit``, written as JSON (the larger of JSON and binary). Anything bigger is refused from its
    Content-Length, before a byte of it is read."""
    total = 0
    for spec in signature.inputs:
        dims = list(spec.shape)
        if dims:
            dims[0] = signature.max_batch
        elements = math.prod(d if d >= 0 else dynamic_dim_limit for d in dims)
        total += elements * max(JSON_CHARS_PER_ELEMENT, DATATYPES[spec.datatype].itemsize)
    return total + BODY_OVERHEAD_BYTES
