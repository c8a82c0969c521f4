"""`metainfer serve` of a variant on OpenVINO: the same KServe v2 endpoint, answers equal to ONNX Runtime's within
float tolerance, and a run past its request's deadline stopped as on ONNX Runtime (wall-clock: integration)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
pytest.importorskip("openvino")
from serve_harness import start_serving  # noqa: E402

from bench.serve_attacks import matmul_chain  # noqa: E402
from metainfer.agent.serve.deadlines import DeadlineExceeded  # noqa: E402
from metainfer.agent.serve.model import LoadedModel  # noqa: E402
from metainfer.agent.serve.protocol import Signature  # noqa: E402
from metainfer.agent.zoo import ExampleModel  # noqa: E402
from metainfer.core.engine.recipe import Recipe  # noqa: E402
from metainfer.core.engine.runtime import create_session  # noqa: E402

ON_OPENVINO = Recipe.model_validate({"session": {"runtime": "openvino"}, "batch": 4})
MODEL = "digits-on-openvino"


def test_serve_runs_an_openvino_variant_behind_the_same_endpoint(example: ExampleModel, tmp_path: Path) -> None:
    served = start_serving(
        example, tmp_path, "--recipe-json", ON_OPENVINO.model_dump_json(), model_name=MODEL
    )  # the later --recipe-json replaces the harness's
    client = tritonhttp.InferenceServerClient(served.address)
    try:
        meta = client.get_model_metadata(MODEL)
        assert meta["platform"] == "openvino"
        with np.load(example.data_path) as npz:
            samples = np.ascontiguousarray(npz["input"][:6], dtype=np.float32)
        tensor = tritonhttp.InferInput("input", list(samples.shape), "FP32")
        tensor.set_data_from_numpy(samples, binary_data=True)
        got = client.infer(MODEL, [tensor]).as_numpy("logits")
        expected = create_session(example.model_path.read_bytes(), Recipe()).run(None, {"input": samples})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        assert "serving FP32, default threads, on OpenVINO (latency hint)" in served.log.read_text()
    finally:
        client.close()
        served.stop()


def test_a_run_on_openvino_past_its_deadline_is_stopped_and_the_session_keeps_serving() -> None:
    session = create_session(matmul_chain(400, 512), Recipe(session={"runtime": "openvino"}))
    loaded = LoadedModel(session, Signature(inputs=(), outputs=(), max_batch=4096), "b" * 64, "v" * 64)
    big = {"x": np.ones((1024, 512), dtype=np.float32)}
    started = time.perf_counter()
    full = loaded.infer(big, ["y"])
    full_s = time.perf_counter() - started
    assert full_s > 0.5, f"the model must be slow enough to interrupt ({full_s:.2f} s)"
    started = time.perf_counter()
    with pytest.raises(DeadlineExceeded):
        loaded.infer(big, ["y"], deadline=time.perf_counter() + 0.1)
    stopped_s = time.perf_counter() - started
    assert stopped_s < full_s / 2, f"stopped after {stopped_s:.2f} s, a whole run takes {full_s:.2f} s"
    small = {"x": np.full((1, 512), 3.0, dtype=np.float32)}
    out = loaded.infer(small, ["y"], deadline=time.perf_counter() + 30)
    np.testing.assert_array_equal(out["y"], small["x"])
    assert full["y"].shape == (1024, 512)
