"""What the engine needs to know about a model before touching it.

Loading is the first place a user's mistake shows up (a missing file, a text
file, a truncated download), so every failure becomes a ``ModelError`` naming
the path and what was wrong, never a protobuf traceback.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.errors import ModelError

# What one serialised ModelProto can hold (protobuf's limit); variants are built and shipped as one file.
MAX_MODEL_BYTES = 2**31

# The element types a model may take and give: KServe v2's numeric and bool types (serving does not carry BYTES).
NUMERIC_ELEMENTS = frozenset({
    TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
})  # fmt: skip

ONNX_TO_NUMPY: dict[int, type[np.generic]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.BOOL: np.bool_,
}


class TensorInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    dtype: str = Field(description="numpy dtype name, e.g. float32")
    shape: tuple[int | str | None, ...] = Field(description="int for fixed dims, str/None for dynamic ones")

    @property
    def batch_is_dynamic(self) -> bool:
        return bool(self.shape) and not isinstance(self.shape[0], int)


# The ops transforms.conv rewrites (kept here so planning need not import the transform).
CONV_FUSED_OPS = ("Sum", "LRN")


class ModelInfo(BaseModel):
    """A model's identity and structure, enough to plan a search."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    sha256: str
    size_bytes: int
    opset: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_counts: dict[str, int] = Field(description="Node count per op type (domain-qualified if not ai.onnx)")
    parameters: int = Field(description="Number of scalars stored in initializers")

    @property
    def op_types(self) -> list[str]:
        return sorted(self.op_counts)

    @property
    def has_convs(self) -> bool:
        return "Conv" in self.op_counts

    @property
    def has_matmuls(self) -> bool:
        return any(op in self.op_counts for op in ("MatMul", "Gemm"))

    @property
    def conv_fusable(self) -> bool:
        """Conv fusion (``transforms.conv``) would change something: a conv net with Sum or LRN."""
        return self.has_convs and any(op in self.op_counts for op in CONV_FUSED_OPS)

    @property
    def is_transformer(self) -> bool:
        return "Softmax" in self.op_counts and self.op_counts.get("MatMul", 0) >= 4

    @property
    def batch_is_dynamic(self) -> bool:
        return all(i.batch_is_dynamic for i in self.inputs)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """The files (relative locations, in order of first use) that hold tensors of ``model`` outside it."""
    locations: dict[str, None] = {}
    for tensor in _tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            locations.setdefault(entries.get("location", ""), None)
    return list(locations)


def _tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor a model stores: initializers and attribute tensors, in subgraphs and functions too."""

    def of_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[TensorProto]:
        for node in nodes:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from of_graph(graph)

    def of_graph(graph: onnx.GraphProto) -> Iterator[TensorProto]:
        yield from graph.initializer
        yield from of_nodes(graph.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)


def _load_external_data(path: Path, model: onnx.ModelProto) -> None:
    """Read the tensors a model keeps in files beside it (the dynamo exporter writes ``model.onnx.data``), each
    file checked first: only a plain relative name or path under the model's folder, present as a regular file.
    A model URI fetches one file, so in a cluster a model must hold its weights itself."""
    files = external_data_files(model)
    if not files:
        return
    for location in files:
        parts = Path(location).parts
        if not location or Path(location).is_absolute() or ".." in parts:
            raise ModelError(
                str(path), f"external data location {location[:200]!r} is not a path under the model's folder"
            )
    missing = [location for location in files if not (path.parent / location).is_file()]
    if missing:
        shown = ", ".join(repr(location[:200]) for location in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ModelError(
            str(path),
            f"its weights are in external data files that are not beside it ({shown}): put them beside it, or (a model "
            "URI fetches one file) save the model as one, under 2 GiB: "
            "onnx.save_model(onnx.load(p), p, save_as_external_data=False)",
        )
    whole = path.stat().st_size + sum((path.parent / location).stat().st_size for location in files)
    if whole >= MAX_MODEL_BYTES:
        raise ModelError(
            str(path),
            f"with its external data it is {whole / 2**30:.1f} GiB: over the 2 GiB that one ONNX file (a protobuf) "
            "can hold, and metainfer builds and ships each variant as one file",
        )
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:  # a short file, a symlink out of the folder
        raise ModelError(str(path), f"cannot read its external data ({type(exc).__name__}: {str(exc)[:300]})") from exc
    for tensor in _tensors(model):  # left set to DEFAULT: unset, the model is the one a single-file export gives
        tensor.ClearField("data_location")


def weights_beside(path: Path, model: onnx.ModelProto) -> bool:
    """Whether ``model`` (as ``load_model`` read it from ``path``) holds tensors its file does not: weights read
    from external data files beside it. A file shorter than the model serialised lacks something (protobuf writes
    each field one way); one as long may still point outside for tensors smaller than their location entries,
    so a small one is read again to see."""
    size = path.stat().st_size
    if size < model.ByteSize():
        return True
    if size > SMALL_GRAPH_BYTES:  # as long as the whole model and big: its weights are in it
        return False
    return bool(external_data_files(onnx.load(str(path), load_external_data=False)))


SMALL_GRAPH_BYTES = 64 << 20


def model_bytes(path: Path, model: onnx.ModelProto) -> bytes:
    """The model as one file, what a session and every transform is given: the file itself, or, for a model whose
    weights are in files beside it, the model ``load_model`` assembled (byte for byte the single-file export).
    ONNX Runtime cannot resolve external data for a model given as bytes, so the split file alone would fail."""
    return model.SerializeToString() if weights_beside(path, model) else path.read_bytes()


def load_model(path: Path) -> onnx.ModelProto:
    """Load and check an ONNX model, turning every failure into a ModelError."""
    if not path.exists():
        raise ModelError(str(path), "no such file")
    if not path.is_file():
        raise ModelError(str(path), "not a regular file")
    if path.stat().st_size == 0:
        raise ModelError(str(path), "file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types
        raise ModelError(str(path), f"not an ONNX model ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node:
        raise ModelError(str(path), "not an ONNX model (no graph nodes; is it another file format?)")
    _load_external_data(path, model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        if not _runtime_registers(first_line):
            raise ModelError(str(path), f"ONNX checker rejected the model: {first_line}") from exc
    except Exception as exc:  # protobuf's EncodeError: a model too large to serialise for the checker
        raise ModelError(str(path), f"cannot check the model ({type(exc).__name__}: {str(exc)[:300]})") from exc
    _only_numeric_tensors_in_and_out(path, model)
    return model


_UNREGISTERED = re.compile(r"No Op registered for (\w+) with domain_version")


def _runtime_registers(checker_error: str) -> bool:
    """Whether the checker's complaint is only an operator it does not know and ONNX Runtime registers in the
    default domain: ONNX Runtime GenAI's builder writes its SimplifiedLayerNormalization there, and every export
    from it failed the checker though ONNX Runtime runs it (a session on the model checks it further)."""
    match = _UNREGISTERED.search(checker_error)
    if match is None:
        return False
    from onnxruntime.capi import onnxruntime_pybind11_state as native

    return any(op.name == match.group(1) and op.domain == "" for op in native.get_all_operator_schema())


def _only_numeric_tensors_in_and_out(path: Path, model: onnx.ModelProto) -> None:
    """Inputs and outputs must be numeric or bool tensors: the quality checks compare arrays, and serving answers
    in KServe v2's numeric types (not BYTES). A scikit-learn classifier exported by skl2onnx has a sequence of maps
    (ZipMap) as its probabilities, which crashed the quality check with a bare AttributeError; a string input
    crashed reading the data ("data type 'string' not understood")."""
    initializers = {t.name for t in model.graph.initializer}
    values = [("input", v) for v in model.graph.input if v.name not in initializers]
    values += [("output", v) for v in model.graph.output]
    other = [(kind, v) for kind, v in values if not _numeric_tensor(v.type)]
    if not other:
        return
    described = ", ".join(f"{kind} {v.name[:100]!r} is a {_type_name(v.type)}" for kind, v in other[:3])
    zipmap = any(node.op_type == "ZipMap" for node in model.graph.node)
    strings = any(v.type.tensor_type.elem_type == TensorProto.STRING for _, v in other)
    raise ModelError(
        str(path),
        f"{described}: metainfer measures and serves numeric and bool tensors only (the types KServe v2 carries "
        "besides BYTES); export the model without it"
        + (" (skl2onnx: options={'zipmap': False})" if zipmap else "")
        + (", with the strings turned into numbers before the graph (a tokenizer)" if strings else ""),
    )


def _numeric_tensor(value_type: onnx.TypeProto) -> bool:
    return value_type.WhichOneof("value") == "tensor_type" and value_type.tensor_type.elem_type in NUMERIC_ELEMENTS


def _type_name(value_type: onnx.TypeProto) -> str:
    """ONNX's own notation of a type, e.g. ``sequence(map(int64, tensor(float)))``."""

    def element(elem_type: int) -> str:
        return TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"

    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({element(value_type.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({element(value_type.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"sequence({_type_name(value_type.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({element(value_type.map_type.key_type)}, {_type_name(value_type.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({_type_name(value_type.optional_type.elem_type)})"
    return kind or "no type"


def inspect_model(path: Path, model: onnx.ModelProto | None = None) -> ModelInfo:
    model = model if model is not None else load_model(path)
    initializer_names = {t.name for t in model.graph.initializer}
    ops: Counter[str] = Counter()
    for node in model.graph.node:
        ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    parameters = int(sum(np.prod(t.dims) if t.dims else 1 for t in model.graph.initializer))
    size = model.ByteSize() if weights_beside(path, model) else path.stat().st_size
    return ModelInfo(
        path=str(path),
        sha256=sha256_file(path),
        size_bytes=size,
        opset=opset,
        inputs=tuple(_tensor_info(v) for v in model.graph.input if v.name not in initializer_names),
        outputs=tuple(_tensor_info(v) for v in model.graph.output),
        op_counts=dict(sorted(ops.items())),
        parameters=parameters,
    )


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor_type = value.type.tensor_type
    dtype = ONNX_TO_NUMPY.get(tensor_type.elem_type)
    dims: list[int | str | None] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or None)
    return TensorInfo(
        name=value.name,
        dtype=np.dtype(dtype).name if dtype else TensorProto.DataType.Name(tensor_type.elem_type).lower(),
        shape=tuple(dims),
    )
