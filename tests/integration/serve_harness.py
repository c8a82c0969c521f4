"""``metainfer serve`` for the serving, drift and canary tests: the real process, or a stand-in for its metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from hack.controlplane.processes import free_port, stop_child
from metainfer.agent.zoo.build import ExampleModel
from metainfer.core.engine.recipe import Recipe
from testkit.serve_attacks import matmul_chain

LABELS = ["policy", "hardware_class", "variant"]  # serve's series labels, in its order
BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServeProcess:
    """One ``metainfer serve`` on 127.0.0.1:``port`` (a free one by default), logging to ``log_dir``.

    With ``grpc`` its KServe v2 gRPC API listens on a free port too (``grpc_address``); without, it is off, so that
    servers started side by side never contend for the default gRPC port. ``shutdown_delay`` is 0 unless a test
    asks for it: a stop then drains at once, as the tests that do not watch the delay expect.
    """

    def __init__(
        self, log_dir: Path, port: int | None = None, *, grpc: bool = False, shutdown_delay: float = 0.0
    ) -> None:
        self.port = port or free_port()
        self.grpc_port = free_port() if grpc else 0
        self.shutdown_delay = shutdown_delay
        self.log = log_dir / f"serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def grpc_address(self) -> str:
        assert self.grpc_port, "started without grpc=True"
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, args: list[str], env: dict[str, str]) -> ServeProcess:
        """Run ``metainfer <args>`` (``serve ...``, listening on ``port``) with ``env`` added to this one's; the gRPC
        port and the shutdown delay are appended (the last flag wins, also over one in ``args``)."""
        cmd = [
            sys.executable, "-m", "metainfer.agent.cli", *args,
            "--grpc-port", str(self.grpc_port), "--shutdown-delay", f"{self.shutdown_delay:g}",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env={**os.environ, **env, "PYTHONSAFEPATH": "1"}, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until /v2/health/ready answers 200; fails the test with the log's tail if serve exits or stays unready.

        A probe that times out is one more "not yet": a serve still warming up on a starved machine (both lanes of
        a cold `make test` at their busiest) accepts the connection and answers late."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:  # URLError, a refused or reset connection, a read that timed out
                pass
            time.sleep(0.1)
        pytest.fail(f"serve not ready after {timeout:g}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (serve waits its shutdown delay, then drains its requests in flight), SIGKILL after 15 s."""
        stop_child(self.proc)


def slow_model(layers: int = 400, width: int = 512) -> bytes:
    """A chain of identity MatMuls: a [2048, 512] request takes seconds, a [1, 512] one not; many kernels, so ONNX
    Runtime can stop a run between them (the deadline tests)."""
    return matmul_chain(layers, width)


# What the serving tests serve: the digits example, int8 dynamic, batches of up to 4.
SERVED_RECIPE = Recipe.model_validate({"transform": {"quantization": {"mode": "int8_dynamic"}}, "batch": 4})


def start_serving(
    example: ExampleModel,
    log_dir: Path,
    *extra: str,
    model_name: str | None = None,
    env: dict[str, str] | None = None,
    grpc: bool = False,
    ready: bool = True,
    shutdown_delay: float = 0.0,
) -> ServeProcess:
    """``metainfer serve`` of ``example`` with ``SERVED_RECIPE`` on free loopback ports, ``extra`` flags last;
    waits until it is ready unless ``ready`` is False (a test that watches it start)."""
    served = ServeProcess(log_dir, grpc=grpc, shutdown_delay=shutdown_delay)
    args = [
        "serve", "--model-uri", example.model_path.as_uri(), "--model-sha256", example.sha256,
        "--recipe-json", SERVED_RECIPE.model_dump_json(), "--host", "127.0.0.1", "--port", str(served.port),
        *(["--model-name", model_name] if model_name else []), *extra,
    ]  # fmt: skip
    served.start(args, env or {})
    if ready:
        served.wait_ready()
    return served


class ServingMetrics:
    """What ``metainfer serve`` pods export, faked in this process for a real Prometheus to scrape.

    The latency histograms carry serve's names and labels (the total, and its parts compute and queue wait); a
    subclass adds series and says in ``tick`` what the pods observed (``observe``). Within ``with``, ``tick`` runs
    every ``interval_s`` on a daemon thread.
    """

    def __init__(self, interval_s: float) -> None:
        self.registry = CollectorRegistry()
        self.histogram = Histogram(
            "metainfer_inference_latency_seconds", "stand-in", LABELS, buckets=BUCKETS, registry=self.registry
        )
        self.compute = Histogram(
            "metainfer_inference_compute_seconds", "stand-in", LABELS, buckets=BUCKETS, registry=self.registry
        )
        self.queue = Histogram(
            "metainfer_inference_queue_seconds", "stand-in", LABELS, buckets=BUCKETS, registry=self.registry
        )
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self._interval_s = interval_s
        self._stop = threading.Event()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def observe(self, labels: tuple[str, ...], compute_s: float, queue_s: float = 0.0) -> None:
        """One request as serve records it: its compute time, its wait for a worker, and their total."""
        self.compute.labels(*labels).observe(compute_s)
        self.queue.labels(*labels).observe(queue_s)
        self.histogram.labels(*labels).observe(compute_s + queue_s)

    def tick(self) -> None:
        raise NotImplementedError

    def _feed(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.tick()

    def __enter__(self) -> Self:
        threading.Thread(target=self._feed, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self.server.shutdown()
