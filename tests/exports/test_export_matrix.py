"""Transformer fusion and padding removal on encoders as users export them (testkit/exports.py).

Each flavour is all-MiniLM-L6-v2 with its real weights, written by a real exporter
(torch TorchScript at opsets 12-17, eager and SDPA attention, with and without
token_type_ids, int64 and int32 masks; torch dynamo; optimum) from transformers 4.57
and 5.24. For every one: the export matches PyTorch, fusion yields one Attention per
layer, padding removal applies and keeps every real token, and the int8 variant
that this enables keeps the sentence embeddings (cosine >= 0.99).

The first run builds the exporters' venvs (torch, about 3 GiB each to download)
and the exports under ~/.cache/metainfer; later runs reuse them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.reference import mean_cosine, mean_pooled
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant, check_padding_removable
from metainfer.core.engine.transforms.fusion import fuse_transformer
from testkit.exports import FLAVOURS, ExportSet, Flavour, build_exports

LAYERS = 6
BATCH = 8
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def exports() -> ExportSet:
    return build_exports()


def _feed(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feed = {}
    for value in model.graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feed[value.name] = inputs[value.name].astype(dtype)
    return feed


def _outputs(model: bytes, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = create_session(model, Recipe(batch=BATCH, session=SessionSpec(intra_op_num_threads=2)))
    n = next(iter(feed.values())).shape[0]
    chunks = [session.run(None, {k: v[i : i + BATCH] for k, v in feed.items()})[0] for i in range(0, n, BATCH)]
    return np.concatenate(chunks)


def _pooled_cosine(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return mean_cosine(mean_pooled(a, mask), mean_pooled(b, mask))


def test_both_transformers_generations_tokenise_alike(exports: ExportSet) -> None:
    first, second = (exports.inputs(env) for env in ("transformers-4.57", "transformers-5.24"))
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])


@pytest.mark.parametrize("flavour", FLAVOURS, ids=[f.name for f in FLAVOURS])
def test_fusion_and_padding_removal_apply_and_quality_holds(exports: ExportSet, flavour: Flavour) -> None:
    export = exports.exports[flavour.name]
    assert export.path is not None, f"the {flavour.exporter} exporter failed: {export.error}"
    base = export.path.read_bytes()
    model = onnx.load_from_string(base)
    inputs = exports.inputs(flavour.environment)
    feed = _feed(model, inputs)
    assert ("token_type_ids" in feed) == flavour.token_type_ids
    mask = inputs["attention_mask"]
    real = mask.astype(bool)
    assert not real.all()  # the texts are padded, where a wrong mask would show

    fp32 = _outputs(base, feed)
    assert _pooled_cosine(fp32, exports.torch_output(flavour.environment), mask) > 0.99999  # a faithful export

    fused = fuse_transformer(model)
    assert sum(n.op_type == "Attention" for n in fused.graph.node) == LAYERS
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    check_padding_removable(fused)

    unpadded = _outputs(build_variant(base, TransformSpec(fusion="transformer", padding="remove")), feed)
    np.testing.assert_allclose(unpadded[real], fp32[real], atol=2e-3, rtol=1e-3)
    assert np.all(unpadded[~real] == 0)

    int8 = TransformSpec(
        quantization=QuantizationSpec(mode="int8_dynamic", per_channel=True), fusion="transformer", padding="remove"
    )
    quantized = _outputs(build_variant(base, int8), feed)
    assert _pooled_cosine(quantized, fp32, mask) >= 0.99
