"""A minute of every client at once against ``metainfer serve``, on each runtime (testkit/serve_chaos.py): deadlines
from 1 ms up, cancels at random points, connections cut mid-body and mid-answer, bursts of 500 streams, mixed batch
sizes, ids past the vocabulary, REST and gRPC together. The process must live, every answer must equal the
variant run in process, every refusal must be one a client can act on, every follow-up call must be answered, and
RSS must end within 64 MiB of where it started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_harness import start_serving

from metainfer.agent.zoo import ExampleModel
from testkit.serve_chaos import in_process, make_pool, run_chaos

# It makes its own load and judges memory: nothing beside it.
pytestmark = pytest.mark.alone

SECONDS = 60.0
VOCAB = 8192  # bert_mini's


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_minute_of_hostile_clients_leaves_the_server_serving(
    bert: ExampleModel, tmp_path: Path, runtime: str
) -> None:
    if runtime == "openvino":
        pytest.importorskip("openvino")
    recipe = json.dumps({"session": {"runtime": runtime}, "batch": 8})
    served = start_serving(bert, tmp_path, "--recipe-json", recipe, model_name="bert", grpc=True)
    assert served.proc is not None
    try:
        pool = make_pool(in_process(bert.model_path.read_bytes(), recipe), VOCAB, seed=0)
        result = run_chaos(
            served.port, served.grpc_port, served.proc.pid, "bert", pool, VOCAB, runtime=runtime, seconds=SECONDS,
            seed=0,
        )  # fmt: skip
        result.alive = served.proc.poll() is None
        print(f"chaos on {runtime}: {result.calls} calls ({result.calls_per_s:.0f}/s), {result.answered} answered,"
              f" RSS {result.rss_start_mib:.0f} -> {result.rss_end_mib:.0f} MiB: {result.outcomes}")  # fmt: skip
        assert result.alive, served.log.read_text()[-3000:]
        assert result.passed, result
        log = served.log.read_text()
        assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    finally:
        served.stop()
