"""The nine ``light_*`` conv nets that the onnx package ships for its backend tests.

They are the only real-architecture CNNs on this machine without a download:
AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
VGG-19 and ZFNet-512 from the ONNX model zoo, exported by onnx-caffe2 (IR 3,
opset 9). "Light" means the weights are not stored: every large initializer is
replaced by a ConstantOfShape node that fills it with 0.02 when the model runs.
So shapes, op mix and FLOPs are real, but the outputs are the same for every
input (a uniform softmax), which makes them good for latency work and useless
for accuracy: any quality check on them passes trivially. Each also has a fixed
batch of 1 in its input shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def list_light_models() -> dict[str, Path]:
    """``{"light_resnet50": path, ...}`` for every light model the installed onnx ships."""
    return {path.stem: path for path in sorted(LIGHT_DIR.glob("light_*.onnx"))}


def light_model_path(name: str) -> Path:
    """Path of one light model; ``KeyError`` naming the known ones when ``name`` is not one."""
    models = list_light_models()
    if name not in models:
        raise KeyError(f"unknown light model {name!r}; known: {', '.join(models) or 'none'}")
    return models[name]


def load_light_model(name: str) -> onnx.ModelProto:
    return onnx.load(light_model_path(name))


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inputs a caller must feed: IR 3 models also list every initializer as an input."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def input_shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    """Static shape of an input; the light models have no symbolic dimensions."""
    dims = value.type.tensor_type.shape.dim
    if not all(dim.HasField("dim_value") for dim in dims):
        raise ValueError(f"input {value.name} has a symbolic dimension")
    return tuple(dim.dim_value for dim in dims)


def build_light_inputs(model: onnx.ModelProto, samples: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal images, ``samples`` along the first axis.

    The models' batch is fixed at 1, so sample ``i`` is fed as ``x[i:i+1]``.
    Standard normal is what ImageNet-normalised pixels look like; since the
    weights are constants the values only matter for not being NaN.
    """
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for value in graph_inputs(model):
        shape = input_shape(value)
        arrays[value.name] = rng.standard_normal((samples, *shape[1:]), dtype=np.float32)
    return arrays
