"""Static int8 on conv nets as packages ship them (testkit/cnn_models.py): quality on trained weights.

The trained detectors (YOLOv8n from the nudenet wheel, a YOLOX-style text detector
from the ddddocr wheel) run on crops of real photographs; every static int8 form
the search can pick (QDQ or ONNX Runtime's integer operators, with and without conv
fusion) must keep the output within the default quality budget (cosine >= 0.99).
The light nets (constant weights) check the structure instead: after conv fusion
no Sum or LRN is left in float between integer convolutions.

The first run downloads the two wheels (about 50 MB) into ~/.cache/metainfer.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.profile.fingerprint import detect_machine
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant
from testkit.cnn_models import NETS, ConvNet, feed_for

pytestmark = pytest.mark.timeout(900)
# The nets shipped as ONNX: the TensorFlow Lite ones need TensorFlow's exporter (a 600 MB venv) first, which
# the bench builds and this tier does not.
TRAINED = [n for n in NETS if n.trained and not n.member.endswith(".tflite")]
LIGHT = [n for n in NETS if not n.trained and n.name in ("light_resnet50", "light_inception_v1")]
FORMS = [("qdq", "none"), ("qoperator", "none"), ("qdq", "conv"), ("qoperator", "conv")]


# Without VNNI, ONNX Runtime's u8s8 kernels add pairs of 8-bit products in 16 bits, which saturate on full-range
# weights: the YOLOX detector fell to cosine 0.987 on an AVX2-only EPYC (0.996 with 7-bit weights), while VNNI
# CPUs keep 0.995 at full range. Such a CPU gets the 7-bit weights its int8 needs (QuantizationSpec.reduce_range).
VNNI = any(flag in detect_machine().cpu_flags for flag in ("avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_int8"))


def _spec(fmt: str, fusion: str) -> TransformSpec:
    quantization = QuantizationSpec(
        mode="int8_static",
        per_channel=True,
        format=fmt,
        reduce_range=not VNNI,  # type: ignore[arg-type]
    )
    return TransformSpec(fusion=fusion, quantization=quantization)  # type: ignore[arg-type]


def _outputs(model: bytes, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = create_session(model, Recipe(batch=1, session=SessionSpec(intra_op_num_threads=2)))
    (name, images) = next(iter(feed.items()))
    return np.stack([session.run(None, {name: image[None]})[0][0] for image in images])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    pairs = zip(a, b, strict=True)
    return float(np.mean([np.dot(x.ravel(), y.ravel()) / np.linalg.norm(x) / np.linalg.norm(y) for x, y in pairs]))


@pytest.mark.parametrize("net", TRAINED, ids=lambda n: n.name)
@pytest.mark.parametrize(("fmt", "fusion"), FORMS, ids=lambda v: v)
def test_static_int8_keeps_a_trained_detector_within_budget(net: ConvNet, fmt: str, fusion: str) -> None:
    base = net.path().read_bytes()
    calibration = Dataset(feed_for(net, 32, seed=0))
    held_out = feed_for(net, 8, seed=1)  # other crops than calibration saw
    variant = build_variant(base, _spec(fmt, fusion), calibration)
    cosine = _cosine(_outputs(base, held_out), _outputs(variant, held_out))
    assert cosine >= 0.99, f"{net.name} {fmt}/{fusion}: cosine {cosine:.5f}"


@pytest.mark.parametrize("net", LIGHT, ids=lambda n: n.name)
def test_conv_fusion_leaves_no_float_island_between_integer_convolutions(net: ConvNet) -> None:
    base = net.path().read_bytes()
    variant = onnx.load_from_string(build_variant(base, _spec("qoperator", "conv"), Dataset(feed_for(net, 8))))
    ops = [n.op_type for n in variant.graph.node]
    assert "Sum" not in ops and "LRN" not in ops
    assert ops.count("QuantizeLinear") <= 4  # the input, and the LRN windows' float power and division
    assert ops.count("QLinearConv") >= 50
