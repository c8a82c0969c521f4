"""What the engine needs to know about a model before touching it.

Loading is the first place a user's mistake shows up (a missing file, a text
file, a truncated download), so every failure becomes a ``ModelError`` naming
the path and what was wrong, never a protobuf traceback.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.errors import ModelError

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


def load_model(path: Path) -> onnx.ModelProto:
    """Load and check an ONNX model, turning every failure into a ModelError."""
    if not path.exists():
        raise ModelError(str(path), "no such file")
    if not path.is_file():
        raise ModelError(str(path), "not a regular file")
    if path.stat().st_size == 0:
        raise ModelError(str(path), "file is empty")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises several unrelated types
        raise ModelError(str(path), f"not an ONNX model ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node:
        raise ModelError(str(path), "not an ONNX model (no graph nodes; is it another file format?)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        raise ModelError(str(path), f"ONNX checker rejected the model: {first_line}") from exc
    return model


def inspect_model(path: Path, model: onnx.ModelProto | None = None) -> ModelInfo:
    model = model if model is not None else load_model(path)
    initializer_names = {t.name for t in model.graph.initializer}
    ops: Counter[str] = Counter()
    for node in model.graph.node:
        ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelInfo(
        path=str(path),
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        opset=opset,
        inputs=tuple(_tensor_info(v) for v in model.graph.input if v.name not in initializer_names),
        outputs=tuple(_tensor_info(v) for v in model.graph.output),
        op_counts=dict(sorted(ops.items())),
        parameters=int(sum(np.prod(t.dims) if t.dims else 1 for t in model.graph.initializer)),
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
