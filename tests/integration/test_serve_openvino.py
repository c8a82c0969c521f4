"""`metainfer serve` of a variant on OpenVINO: the same KServe v2 endpoint, answers equal to ONNX Runtime's within
float tolerance (a run past its deadline: tests/integration/test_serve_deadlines.py, on both runtimes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
pytest.importorskip("openvino")
from serve_harness import start_serving  # noqa: E402

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
