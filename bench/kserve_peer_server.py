"""kserve's ModelServer serving an ONNX model over the KServe v2 REST protocol: the peer in bench/serving.py.

Runs in kserve's own venv (~/.cache/metainfer/kserve-venv, from bench/requirements-kserve.txt), never the
project's, and imports nothing of metainfer. ``bench/serving.py`` starts it as

    ~/.cache/metainfer/kserve-venv/bin/python bench/kserve_peer_server.py CONFIG.json

with CONFIG.json: ``{"model_path", "model_name", "http_port", "workers", "session_options"}``, the session
options as ONNX Runtime attribute names and values (the same ``Recipe.session_options`` ``metainfer serve``
creates its session with). The configuration comes as one file, not flags, because ``kserve.model_server``
parses ``sys.argv`` at import time and would take flags of ours (``--model...``) as abbreviations of its own.

The model is a plain ``kserve.Model`` subclass, written as kserve's documentation writes custom predictors
(``load`` creates the session, ``predict`` takes an ``InferRequest`` and returns an ``InferResponse``), with one
change in kserve's favour: ``predict`` is async and runs ``session.run`` on a pool of ``workers`` threads (2, as
``metainfer serve --workers``), so the event loop keeps decoding and encoding while ONNX Runtime computes
(ONNX Runtime releases the GIL). A synchronous ``predict`` would run on the event loop itself. kserve's Python
server has no dynamic batching: every request is one ``session.run``.

Everything else is kserve's default: one uvicorn worker (uvloop), latency logging on, access log as configured
by kserve. gRPC is off (the benchmark drives REST only, and its default port 8081 is ``metainfer serve``'s too).
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CONFIG = json.loads(open(sys.argv[1]).read()) if len(sys.argv) > 1 else None  # noqa: SIM115 (read before kserve)
sys.argv = sys.argv[:1]  # kserve.model_server parses sys.argv when it is imported

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer  # noqa: E402

ORT_ENUMS = {"graph_optimization_level": ort.GraphOptimizationLevel, "execution_mode": ort.ExecutionMode}
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


class OnnxModel(Model):
    """One ONNX Runtime session behind kserve's v2 data plane."""

    def __init__(self, name: str, path: str, session_options: dict[str, Any], workers: int) -> None:
        super().__init__(name)
        self.path, self.session_options = path, session_options
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ort")
        self.session: ort.InferenceSession | None = None
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        for key, value in self.session_options.items():
            setattr(options, key, getattr(ORT_ENUMS[key], value) if key in ORT_ENUMS else value)
        options.log_severity_level = 3
        self.session = ort.InferenceSession(self.path, sess_options=options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        assert self.session is not None
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        values = await asyncio.get_running_loop().run_in_executor(self.pool, self.session.run, self.output_names, feeds)
        outputs = [  # numpy data: kserve's to_rest encodes it binary or JSON, as the request asked
            InferOutput(name=name, shape=list(value.shape), datatype=DATATYPES[value.dtype], data=value)
            for name, value in zip(self.output_names, values, strict=True)
        ]
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


def main() -> int:
    if CONFIG is None:
        print(__doc__, file=sys.stderr)
        return 2
    model = OnnxModel(CONFIG["model_name"], CONFIG["model_path"], CONFIG["session_options"], CONFIG["workers"])
    ModelServer(http_port=CONFIG["http_port"], enable_grpc=False).start([model])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
