"""A dynamic int8 variant's outputs depend on what shares its run; `serve --batch-dependent` says what a client gets.

'combine' (the default) batches concurrent requests, so the same request can get different outputs depending on
its company (within what validation measured); 'isolate' runs each request alone, so it always gets the outputs
it gets alone. The digits example served as int8 dynamic (serve_harness.SERVED_RECIPE), eight concurrent requests
given 300 ms to meet.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from serve_harness import SERVED_RECIPE, ServeProcess, start_serving

from metainfer.agent.zoo import ExampleModel

# Alone (no neighbouring test): eight concurrent requests are given 300 ms to meet in one batch.
pytestmark = pytest.mark.alone

ROWS = 8


def _infer(served: ServeProcess, sample: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": sample.ravel().tolist()}]}
    request = urllib.request.Request(
        served.url + "/v2/models/digits/infer", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return np.asarray(json.loads(response.read())["outputs"][0]["data"], dtype=np.float32)


def _together(served: ServeProcess, samples: np.ndarray) -> list[np.ndarray]:
    """Every sample in its own request, all sent at once."""
    results: list[np.ndarray | None] = [None] * len(samples)
    start = threading.Barrier(len(samples))

    def send(index: int) -> None:
        start.wait()
        results[index] = _infer(served, samples[index])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(samples))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _run_sizes(served: ServeProcess) -> dict[str, float]:
    with urllib.request.urlopen(served.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("metainfer_inference_batch_rows_bucket")
    }


@pytest.mark.parametrize("mode", ["combine", "isolate"])
def test_what_a_client_of_a_batch_dependent_variant_gets(example: ExampleModel, tmp_path: Path, mode: str) -> None:
    assert SERVED_RECIPE.batch_dependent()
    with np.load(example.data_path) as npz:
        samples = np.ascontiguousarray(npz["input"][:ROWS], dtype=np.float32)
    served = start_serving(
        example,
        tmp_path,
        "--batch-dependent",
        mode,
        "--max-queue-delay-ms",
        "300",
        "--batch-size",
        str(ROWS),
        model_name="digits",
    )
    try:
        alone = [_infer(served, sample) for sample in samples]  # one at a time: each runs alone
        together = _together(served, samples)
        sizes = _run_sizes(served)
        log = served.log.read_text()
    finally:
        served.stop()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(alone, together, strict=True))
    if mode == "isolate":
        assert sizes["1.0"] == 2 * ROWS, sizes  # every run held one request
        assert moved == 0.0  # the same request, the same bytes, whoever else was asking
        assert "each request runs alone" in log
    else:
        assert sizes["1.0"] < 2 * ROWS, sizes  # concurrent requests shared runs
        assert moved > 0.0  # and their outputs moved with their company: what validation measures
        assert "concurrent requests are combined" in log
