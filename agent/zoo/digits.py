"""Digits classifier: a small MLP trained on scikit-learn's bundled digits data, in integer arithmetic.

It is the example the end-to-end test and ``make demo`` adapt, so it has to be
cheap to build (about a second), need no download, and carry labels so that the
pipeline's top-1 accuracy path is exercised. The network is exported by hand as
plain MatMul/Add/Relu so that the ONNX file has no sklearn-specific operators
and every quantizer and execution provider can handle it.

The example policies pin the model's sha256, so the file must be the same on
every machine. Training in floating point cannot give that: BLAS and SIMD kernels
sum in machine-dependent orders, and the last bits of every weight follow (a
scikit-learn MLP trained here gave three different files under three OpenBLAS
kernels). So the model is trained in fixed point, with int64 arrays only, where
every operation is exact whatever the order:

- the first layer is fixed: bell-shaped random integer weights (``_exact``) and
  biases that centre each unit on the training data, so the ReLU features are
  random projections of the centred image;
- the second and third layers are trained with mini-batch SGD with momentum on
  the squared error to one-hot targets. Each layer's input is centred and
  scaled by a power of two (the centring folds into the exported bias), which is
  what lets plain SGD converge in a few epochs; learning rate, momentum and
  batch size are powers of two, so every update is a rounded shift;
- the exported weights are those integers times powers of two: float32 holds
  them exactly (biases wider than 24 bits are rounded in integer arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from metainfer.agent.zoo._exact import bell, round_shift, to_float32, uniform_below
from metainfer.agent.zoo._onnx import IR_VERSION, OPSET

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
HIDDEN: tuple[int, ...] = (256, 128)
N_FEATURES = 64
N_CLASSES = 10
# Pixel intensities in load_digits run from 0 to 16; the model takes them in [0, 1].
PIXEL_MAX = 16
PIXEL_EXPONENT = 4  # PIXEL_MAX == 2**PIXEL_EXPONENT: dividing by it is exact
VALIDATION_FRACTION = 5  # one sample in five (per class) is held out

# First layer: integer weights times 2**-FIRST_EXPONENT, a bell of four 4-bit draws (standard deviation ~9, so
# ~0.29 once scaled: the float weights look like an ordinary initialisation).
FIRST_WIDTH = 16
FIRST_EXPONENT = 5
# Fixed point of training: activations and gradients carry ACT_BITS fractional bits, weights WEIGHT_BITS.
ACT_BITS = 10
WEIGHT_BITS = 16
# The second layer starts as a bell of standard deviation ~2**-4 on the normalized input (~4.7k / 2**16).
SECOND_WIDTH = 1 << 13
EPOCHS = 16
BATCH_SHIFT = 5  # batches of 32
LEARNING_SHIFT = 5  # learning rate 2**-5, halved every quarter of the epochs
MOMENTUM_SHIFT = 3  # momentum 1 - 2**-3
# The bound on int64 products that every matrix product is checked against, with room for the sums after it.
_SAFE = 1 << 60


@dataclass(frozen=True)
class DigitsExample:
    """The exported model, its labelled validation split and its top-1 accuracy on that split."""

    model: onnx.ModelProto
    inputs: np.ndarray
    labels: np.ndarray
    accuracy: float


@dataclass(frozen=True)
class _Layer:
    """A trained layer in fixed point: ``(x - centre) / 2**scale`` times ``weight / 2**WEIGHT_BITS`` plus ``bias /
    2**WEIGHT_BITS``, where ``x`` is the layer's input in integer units."""

    centre: np.ndarray
    scale: int
    weight: np.ndarray
    bias: np.ndarray


def _split(labels: np.ndarray, seed: int) -> np.ndarray:
    """A stratified hold-out mask: in each class, a seeded shuffle's first fifth (rounded) is validation."""
    keys = uniform_below(f"{seed}/digits/split", len(labels), 1 << 32)
    validation = np.zeros(len(labels), bool)
    for label in range(N_CLASSES):
        members = np.flatnonzero(labels == label)
        # Stable: a tie of two 32-bit keys keeps the data's order, so the result does not depend on the sort used.
        shuffled = members[np.argsort(keys[members], kind="stable")]
        validation[shuffled[: (len(members) + VALIDATION_FRACTION // 2) // VALIDATION_FRACTION]] = True
    return validation


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An int64 matrix product that refuses operands whose sum of products could overflow.

    einsum rather than ``@``: numpy has no BLAS for integers, and einsum's integer
    loops take half the time of matmul's here (training is mostly these products).
    """
    bound = int(np.abs(a).max(initial=0)) * int(np.abs(b).max(initial=0)) * a.shape[-1]
    if bound >= _SAFE:
        raise OverflowError(f"int64 product bound {bound} too large: the fixed-point scales need adjusting")
    product: np.ndarray = np.einsum("...i,ij->...j", a, b)
    return product


def _centre_and_scale(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-column means rounded to integers, and the least power of two at or above the standard deviation.

    At or above: a normalized input of standard deviation up to 1 keeps the
    learning rate's effective size at or below its nominal one (up to 2 would let
    it grow fourfold, and SGD diverge).
    """
    count = x.shape[0]
    centre = (2 * x.sum(axis=0) + count) // (2 * count)
    deviation = x - centre
    variance = int((deviation * deviation).sum()) // deviation.size
    return centre, ((max(variance, 1) - 1).bit_length() + 1) // 2  # least s with 4**s >= variance


def _first_layer(pixels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed random weights and the biases that centre each unit on ``pixels`` (the training images)."""
    weight = bell(f"{seed}/digits/fc0.weight", (N_FEATURES, HIDDEN[0]), FIRST_WIDTH)
    count = pixels.shape[0]
    bias = -((2 * _matmul(pixels.sum(axis=0), weight) + count) // (2 * count))
    return weight, bias


def _forward(layer: _Layer, x: np.ndarray, out_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer's centred input and its pre-activation rounded to ACT_BITS fractional bits."""
    centred = x - layer.centre
    total = _matmul(centred, layer.weight) + (layer.bias << layer.scale)
    return centred, round_shift(total, out_shift)


class _Trainer:
    """Layers 2 and 3 of the MLP, trained in place on the fixed first layer's features."""

    def __init__(self, features: np.ndarray, seed: int) -> None:
        centre, scale = _centre_and_scale(features)
        weight = bell(f"{seed}/digits/fc1.weight", (HIDDEN[0], HIDDEN[1]), SECOND_WIDTH)
        self.hidden = _Layer(centre, scale, weight, np.zeros(HIDDEN[1], np.int64))
        # The output layer's input statistics are those of the initial hidden layer (then fixed, like the first
        # layer's), and it starts at zero.
        hidden = np.maximum(_forward(self.hidden, features, self._shift(self.hidden))[1], 0)
        centre, scale = _centre_and_scale(hidden)
        zeros = np.zeros((HIDDEN[1], N_CLASSES), np.int64)
        self.output = _Layer(centre, scale, zeros, np.zeros(N_CLASSES, np.int64))
        self.velocity = {key: np.zeros_like(value) for key, value in self._parameters().items()}

    @staticmethod
    def _shift(layer: _Layer) -> int:
        """From the product's units (WEIGHT_BITS + scale fractional bits) to ACT_BITS."""
        return WEIGHT_BITS + layer.scale - ACT_BITS

    def _parameters(self) -> dict[str, np.ndarray]:
        return {
            "w1": self.hidden.weight,
            "b1": self.hidden.bias,
            "w2": self.output.weight,
            "b2": self.output.bias,
        }

    def logits(self, features: np.ndarray) -> np.ndarray:
        """Output in ACT_BITS fixed point (the exported model computes the same up to rounding)."""
        hidden = np.maximum(_forward(self.hidden, features, self._shift(self.hidden))[1], 0)
        return _forward(self.output, hidden, self._shift(self.output))[1]

    def step(self, features: np.ndarray, targets: np.ndarray, learning_shift: int) -> None:
        """One SGD step with momentum on ``0.5 * |logits - targets|**2`` averaged over the batch."""
        centred1, pre1 = _forward(self.hidden, features, self._shift(self.hidden))
        active = pre1 > 0
        centred2, out = _forward(self.output, np.maximum(pre1, 0), self._shift(self.output))
        grad_out = out - targets  # ACT_BITS
        back = round_shift(_matmul(grad_out, self.output.weight.T), self._shift(self.output))
        grad_hidden = np.where(active, back, 0)  # ACT_BITS
        # Raw sums of (input units) x (ACT_BITS); a parameter moves by velocity * 2**-shift (see _shift_for).
        raw = {
            "w1": _matmul(centred1.T, grad_hidden),
            "b1": grad_hidden.sum(axis=0),
            "w2": _matmul(centred2.T, grad_out),
            "b2": grad_out.sum(axis=0),
        }
        for key, parameter in self._parameters().items():
            velocity = self.velocity[key]
            velocity -= round_shift(velocity, MOMENTUM_SHIFT)
            velocity += raw[key]
            parameter -= round_shift(velocity, self._shift_for(key, learning_shift))

    def _shift_for(self, key: str, learning_shift: int) -> int:
        """The shift from a raw gradient sum to WEIGHT_BITS units, with the batch mean and learning rate in it.

        A weight's gradient is ``centred / 2**scale`` times the ACT_BITS gradient; a
        bias's has no input factor.
        """
        scale = {"w1": self.hidden.scale, "w2": self.output.scale}.get(key, 0)
        shift = scale + ACT_BITS + BATCH_SHIFT + learning_shift - WEIGHT_BITS
        if shift < 1:
            raise ValueError(f"update shift {shift} for {key}: the fixed-point scales need adjusting")
        return shift


def _train(pixels: np.ndarray, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, _Trainer]:
    first_weight, first_bias = _first_layer(pixels, seed)
    features = np.maximum(_matmul(pixels, first_weight) + first_bias, 0)
    trainer = _Trainer(features, seed)
    targets = np.zeros((len(labels), N_CLASSES), np.int64)
    targets[np.arange(len(labels)), labels] = 1 << ACT_BITS
    batch = 1 << BATCH_SHIFT
    for epoch in range(EPOCHS):
        keys = uniform_below(f"{seed}/digits/epoch/{epoch}", len(labels), 1 << 32)
        order = np.argsort(keys, kind="stable")
        # A last batch shorter than the others would need its own mean; it is dropped (a new order every epoch).
        for start in range(0, len(order) - batch + 1, batch):
            rows = order[start : start + batch]
            trainer.step(features[rows], targets[rows], LEARNING_SHIFT + 4 * epoch // EPOCHS)
    return first_weight, first_bias, trainer


def _export(first_weight: np.ndarray, first_bias: np.ndarray, trainer: _Trainer) -> onnx.ModelProto:
    """Write the layers as MatMul + Add (+ Relu between layers), ending in raw logits.

    Input units: ``x = pixels * 2**-4``, so the first layer's output is its integer
    features times ``2**-(FIRST_EXPONENT + 4)``. Each trained layer computes
    ``(h - centre) / 2**scale @ W + b`` on its input ``h`` in integer units ``u``;
    on the float input ``h * u`` that is ``h @ (W * u**-1 / 2**scale) + (b - centre /
    2**scale @ W)``. The output is logits rather than probabilities: argmax is the
    same, and a Softmax at the end would only add an op for quantizers to worry about.
    """
    hidden, output = trainer.hidden, trainer.output
    first_units = FIRST_EXPONENT + PIXEL_EXPONENT
    hidden_units = ACT_BITS
    # (name, weight ints, weight exponent, bias ints, bias exponent)
    layers = [
        ("fc0", first_weight, FIRST_EXPONENT, first_bias, first_units),
        (
            "fc1",
            hidden.weight,
            WEIGHT_BITS + hidden.scale - first_units,
            (hidden.bias << hidden.scale) - hidden.centre @ hidden.weight,
            WEIGHT_BITS + hidden.scale,
        ),
        (
            "fc2",
            output.weight,
            WEIGHT_BITS + output.scale - hidden_units,
            (output.bias << output.scale) - output.centre @ output.weight,
            WEIGHT_BITS + output.scale,
        ),
    ]
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = INPUT_NAME
    for index, (prefix, weight, weight_exponent, bias, bias_exponent) in enumerate(layers):
        initializers.append(numpy_helper.from_array(to_float32(weight, weight_exponent), f"{prefix}.weight"))
        initializers.append(numpy_helper.from_array(to_float32(bias, bias_exponent), f"{prefix}.bias"))
        nodes.append(helper.make_node("MatMul", [current, f"{prefix}.weight"], [f"{prefix}.matmul"]))
        last = index == len(layers) - 1
        added = OUTPUT_NAME if last else f"{prefix}.add"
        nodes.append(helper.make_node("Add", [f"{prefix}.matmul", f"{prefix}.bias"], [added]))
        if not last:
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
        doc_string="MLP 64-256-128-10 trained in fixed point on sklearn load_digits; input is pixels / 16.",
    )
    model.ir_version = IR_VERSION
    return model


def _forward_float(model: onnx.ModelProto, inputs: np.ndarray) -> np.ndarray:
    """Run the exported graph with numpy in float64, to check the export without a runtime.

    Only the three op types the exporter writes are understood; anything else is a
    bug in ``_export`` and raises.
    """
    values = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    values[INPUT_NAME] = inputs.astype(np.float64)
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

    The accuracy is the fixed-point model's on the held-out fifth. Raises
    ``RuntimeError`` when the exported graph's logits stray from the fixed-point
    model's by more than its rounding explains: a silently wrong example model
    would make every accuracy number downstream meaningless.
    """
    digits = load_digits()
    pixels = digits.data.astype(np.int64)
    if not np.array_equal(pixels, digits.data) or pixels.min() < 0 or pixels.max() > PIXEL_MAX:
        raise RuntimeError(f"load_digits no longer gives integer pixels in [0, {PIXEL_MAX}]")
    labels = digits.target.astype(np.int64)
    validation = _split(labels, seed)
    first_weight, first_bias, trainer = _train(pixels[~validation], labels[~validation], seed)
    model = _export(first_weight, first_bias, trainer)

    val_pixels, val_labels = pixels[validation], labels[validation]
    features = np.maximum(_matmul(val_pixels, first_weight) + first_bias, 0)
    fixed = trainer.logits(features)
    inputs = (val_pixels.astype(np.float32) * np.float32(2.0**-PIXEL_EXPONENT)).astype(np.float32)
    exported = _forward_float(model, inputs)
    # The fixed-point forward rounds each layer to ACT_BITS; the float graph does not. A few units in the last
    # place of the logits is that rounding, anything larger is an export bug.
    error = float(np.abs(exported - fixed * 2.0**-ACT_BITS).max())
    if error > 2.0 ** (4 - ACT_BITS):
        raise RuntimeError(f"ONNX export disagrees with the fixed-point model: logits differ by up to {error:.4g}")
    accuracy = float((fixed.argmax(axis=1) == val_labels).mean())
    return DigitsExample(model, inputs, val_labels, accuracy)
