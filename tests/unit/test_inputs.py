"""Bad models and bad data fail with one line naming the file, array or axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from metainfer.core.engine.data import load_npz, make_dataset
from metainfer.core.engine.errors import DataError, ModelError
from metainfer.core.engine.modelinfo import inspect_model, load_model


def test_model_errors_name_the_file_and_problem(tmp_path: Path, examples: dict[str, Path]) -> None:
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(empty)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(text)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(examples["digits"].read_bytes()[:5000])
    with pytest.raises(ModelError) as err:
        load_model(truncated)
    assert str(truncated) in str(err.value)


def test_model_info(examples: dict[str, Path]) -> None:
    info = inspect_model(examples["digits"])
    assert [i.name for i in info.inputs] == ["input"]
    assert info.batch_is_dynamic and info.has_matmuls and not info.has_convs
    assert len(info.sha256) == 64 and info.parameters > 10_000


def test_data_must_match_the_model(digits) -> None:
    _, info, data = digits
    x = data.inputs["input"]
    with pytest.raises(DataError, match=r"\['pixels'\] are not model inputs"):
        make_dataset({"pixels": x}, info)
    with pytest.raises(DataError, match="missing array"):
        make_dataset({}, info)
    with pytest.raises(DataError, match="axis 1 has size 63, the model expects 64"):
        make_dataset({"input": x[:, :63]}, info)
    with pytest.raises(DataError, match="has 3 dims"):
        make_dataset({"input": x[:, :, None]}, info)
    with pytest.raises(DataError, match="dtype"):
        make_dataset({"input": x.astype(np.int64)}, info)
    with pytest.raises(DataError, match="labels"):
        make_dataset({"input": x, "labels": np.zeros(3, np.int64)}, info)
    with pytest.raises(DataError, match="zero samples"):
        make_dataset({"input": x[:0]}, info)
    ok = make_dataset({"input": x.astype(np.float64), "labels": data.labels}, info)
    assert ok.inputs["input"].dtype == np.float32 and ok.n_samples == len(x)


def test_npz_errors(tmp_path: Path, digits) -> None:
    _, info, _ = digits
    with pytest.raises(DataError, match="no such file"):
        load_npz(tmp_path / "none.npz", info)
    bad = tmp_path / "bad.npz"
    bad.write_text("garbage")
    with pytest.raises(DataError, match=r"not a readable \.npz"):
        load_npz(bad, info)


def test_batches_wrap_around(digits) -> None:
    _, _, data = digits
    n = data.n_samples
    batch = data.batch(n - 2, 5)["input"]
    assert batch.shape[0] == 5
    np.testing.assert_array_equal(batch[2], data.inputs["input"][0])
    covered = sum(sl.stop - sl.start for _, sl in data.batches(64))
    assert covered == n
