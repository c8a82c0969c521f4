"""Digits classifier: a small MLP trained on scikit-learn's bundled digits data.

It is the example the end-to-end test and ``make demo`` adapt, so it has to be
cheap to build (about a second), need no download, and carry labels so that the
pipeline's top-1 accuracy path is exercised. The network is exported by hand as
plain MatMul/Add/Relu so that the ONNX file has no sklearn-specific operators
and every quantizer and execution provider can handle it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

from metainfer.agent.zoo._onnx import IR_VERSION, OPSET

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
HIDDEN: tuple[int, ...] = (256, 128)
N_FEATURES = 64
N_CLASSES = 10
# Pixel intensities in load_digits run from 0 to 16; the model takes them in [0, 1].
PIXEL_MAX = 16.0


@dataclass(frozen=True)
class DigitsExample:
    """The exported model, its labelled validation split and its float32 accuracy."""

    model: onnx.ModelProto
    inputs: np.ndarray
    labels: np.ndarray
    accuracy: float
    sklearn_predictions: np.ndarray


def _train(seed: int) -> tuple[MLPClassifier, np.ndarray, np.ndarray]:
    """Train the MLP on a seeded stratified 80/20 split; return it with the validation split.

    BLAS is pinned to one thread: multithreaded GEMM may sum in a different order
    and change the last bits of the weights, which would change the model's sha256.
    """
    digits = load_digits()
    features = (digits.data / PIXEL_MAX).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    classifier = MLPClassifier(hidden_layer_sizes=HIDDEN, max_iter=60, random_state=seed)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        # A fixed, short schedule is the point (speed, determinism); it still reaches ~98 %.
        warnings.simplefilter("ignore", ConvergenceWarning)
        classifier.fit(x_train, y_train)
    return classifier, x_val, y_val


def _export(classifier: MLPClassifier) -> onnx.ModelProto:
    """Write the trained layers as MatMul + Add (+ Relu between layers), ending in raw logits.

    The output is logits rather than probabilities: argmax is the same, and a
    Softmax at the end would only add an op for quantizers to worry about.
    """
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = INPUT_NAME
    last = len(classifier.coefs_) - 1
    for index, (weight, bias) in enumerate(zip(classifier.coefs_, classifier.intercepts_, strict=True)):
        prefix = f"fc{index}"
        initializers.append(numpy_helper.from_array(weight.astype(np.float32), f"{prefix}.weight"))
        initializers.append(numpy_helper.from_array(bias.astype(np.float32), f"{prefix}.bias"))
        nodes.append(helper.make_node("MatMul", [current, f"{prefix}.weight"], [f"{prefix}.matmul"]))
        added = OUTPUT_NAME if index == last else f"{prefix}.add"
        nodes.append(helper.make_node("Add", [f"{prefix}.matmul", f"{prefix}.bias"], [added]))
        if index != last:
            nodes.append(helper.make_node("Relu", [added], [f"{prefix}.relu"]))
            current = f"{prefix}.relu"
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", N_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", N_CLASSES])],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="metainfer.zoo",
        doc_string="MLP 64-256-128-10 trained on sklearn load_digits; input is pixels / 16.",
    )
    model.ir_version = IR_VERSION
    return model


def _forward(model: onnx.ModelProto, inputs: np.ndarray) -> np.ndarray:
    """Run the exported graph with numpy, to check the export without a runtime.

    Only the three op types the exporter writes are understood; anything else is a
    bug in ``_export`` and raises.
    """
    values: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values[INPUT_NAME] = inputs
    for node in model.graph.node:
        a = values[node.input[0]]
        if node.op_type == "MatMul":
            values[node.output[0]] = a @ values[node.input[1]]
        elif node.op_type == "Add":
            values[node.output[0]] = a + values[node.input[1]]
        elif node.op_type == "Relu":
            values[node.output[0]] = np.maximum(a, 0)
        else:
            raise ValueError(f"unexpected op {node.op_type} in the digits export")
    return values[OUTPUT_NAME]


def build_digits(seed: int = 0) -> DigitsExample:
    """Train, export and check the digits classifier.

    Raises ``RuntimeError`` when the ONNX graph's argmax disagrees with sklearn's
    ``predict`` on any validation sample: a silently wrong example model would
    make every accuracy number downstream meaningless.
    """
    classifier, x_val, y_val = _train(seed)
    model = _export(classifier)
    expected = classifier.predict(x_val).astype(np.int64)
    predicted = _forward(model, x_val).argmax(axis=1).astype(np.int64)
    mismatches = int((predicted != expected).sum())
    if mismatches:
        raise RuntimeError(f"ONNX export disagrees with sklearn on {mismatches} of {len(x_val)} samples")
    accuracy = float((predicted == y_val).mean())
    return DigitsExample(model, x_val, y_val, accuracy, expected)
