"""Serving: metainfer serve side by side with in-process ONNX Runtime and kserve's ModelServer; dynamic batching.

One run, on one machine, the bert_mini example (sequence 128, hidden 256, FP32 recipe at batch 32), in parts:

``matrix`` — throughput (items/s) and client-measured p50/p99 latency at request batch 1 and 8, with 8 and 32
concurrent clients, binary tensors (tritonclient's HTTP binary extension) and JSON, for three servers of the same
model variant with the same ONNX Runtime session options:

* ``metainfer``: ``metainfer serve`` as this benchmark always starts it (dynamic batching on, its default
  worker count: cores over intra-op threads);
* ``in-process``: the same ONNX Runtime session called in this process, no HTTP: N threads calling
  ``session.run`` with the same batches, the session created exactly as ``metainfer serve`` creates it (the upper
  bound any server can reach; it has no protocol, so both protocol rows divide by it);
* ``kserve``: kserve's ``ModelServer`` (the ``kserve`` package, in its own venv built from
  bench/requirements-kserve.txt) serving the same variant through a ``kserve.Model`` wrapping an ONNX Runtime
  session (bench/kserve_peer_server.py), speaking the same v2 REST protocol, driven by the same tritonclient
  clients.

Each cell runs for ``--seconds`` after a warm-up (``--warmup`` seconds, longer until every client has had an
answer); items/s counts samples answered inside the window, latencies
are measured by the clients per request. The clients are threads of this process on the same cores as the server
(2 here): their CPU use is reported next to the server's.

``ratio`` — does dynamic batching give 32 concurrent batch-1 clients the items/s of one batch-32 client?

* ``batch32-1client``: one client sending batches of 32;
* ``batch1-32clients``: 32 concurrent clients sending one sample each, dynamic batching on (the defaults);
* ``batch1-32clients-unbatched``: the same clients against a server started with ``--batch-size 1``, which is
  how every request ran before dynamic batching.

Target (issue 14): batch1-32clients >= 0.9 x the items/s of batch32-1client.

``probes`` — /v2/health/live is timed every 20 ms while the server is saturated (the 32 clients), while three
200 KiB gzip bodies that inflate to 200 MiB each arrive at once, and while 500 idle connections and 20 stalled
uploads are held open. Target: liveness under 100 ms throughout.

``attacks`` — the clients that used to take the server out (testkit/serve_attacks.py, the drivers
tests/integration/test_serve_never_wedges.py asserts on), against a one-MatMul identity model ([n, 512] in and
out: cheap to run, large to answer) served with gRPC on and ``serve_attacks.SERVE_FLAGS``: requests of 40, 40 and
10 rows against a batch of 64, 64 REST connections or 64 gRPC streams that send headers only, 50 REST clients and
one zero-window gRPC connection that never read their 2 MiB answers. Per attack: the requests answered, failed,
refused and cut, liveness (every 50 ms), and RSS before, at its peak and after. Targets: every complete request
answered, no liveness failure, RSS after within 64 MiB of before.

``chaos`` — testkit/serve_chaos.py for a minute per runtime (ONNX Runtime, OpenVINO) against bert_mini at batch 8:
every client at once, REST and gRPC (tests/integration/test_serve_chaos.py asserts on the same driver). Targets:
no crash, every answer equal to the variant in process, every refusal one a client can act on, every follow-up
answered, RSS at the end within 64 MiB of the start.

    PYTHONSAFEPATH=1 .venv/bin/python bench/serving.py            # everything, 15 s per case: about 10 minutes
    PYTHONSAFEPATH=1 .venv/bin/python bench/serving.py --quick    # 5 s per case: about 4 minutes
    PYTHONSAFEPATH=1 .venv/bin/python bench/serving.py --matrix --seconds 2 --servers in-process kserve

A run of everything with the default selection writes bench/results/serving.json and renders its BENCHMARKS.md
section from it; any narrower run (or ``--results-dir``) writes serving.json and the section it renders to
(serving.md) to a directory of its own and leaves those alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import benchlib
from testkit import peer_env

TITLE = "Serving: side by side with ONNX Runtime and kserve, dynamic batching, liveness"
CLIENTS = 32
BATCH = 32
TARGET_RATIO = 0.9
MODEL_NAME = "bert"
OUTPUT = "last_hidden_state"
VOCAB = 8192  # bert_mini's: the chaos part sends ids past it

BENCH = Path(__file__).resolve().parent
KSERVE_SERVER = BENCH / "kserve_peer_server.py"
DEFAULT_KSERVE_VENV = peer_env.KSERVE.venv

PARTS = ("ratio", "matrix", "probes", "attacks", "chaos")
CHAOS_SECONDS = 60.0
CHAOS_RUNTIMES = ("onnxruntime", "openvino")
RSS_TARGET_MIB = 64.0
SERVERS = ("in-process", "metainfer", "kserve")
PROTOCOLS = ("binary", "json")
MATRIX_BATCHES = (1, 8)
MATRIX_CLIENTS = (8, 32)
SERVER_WORKERS = 2  # metainfer serve's --workers default; the kserve peer gets as many ONNX Runtime threads
# tritonclient sends a JSON request with no Content-Type; kserve 0.21 (FastAPI) then takes the body as raw bytes and
# answers 400 "received byte inputs, but the 'inference-header-content-length' header is missing". The JSON clients
# therefore name the type, for every server alike.
JSON_HEADERS = {"Content-Type": "application/json"}


# ---------------------------------------------------------------- servers


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{what} did not get ready in {timeout_s:.0f} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def start_server(
    model: Path,
    sha256: str,
    port: int,
    log: Path,
    *extra: str,
    batch: int = BATCH,
    name: str = MODEL_NAME,
    runtime: str = "onnxruntime",
) -> subprocess.Popen[bytes]:
    """``metainfer serve`` on 127.0.0.1:port, ready (its model loaded and warmed up)."""
    from metainfer.core.engine.recipe import Recipe

    recipe = Recipe.model_validate({"batch": batch, "session": {"runtime": runtime}}).model_dump_json()
    # No shutdown delay: nothing routes to a benchmark's server once it is stopped.
    cmd = [sys.executable, "-m", "metainfer.agent.cli", "serve", "--model-uri", model.as_uri(), "--model-sha256",
           sha256, "--recipe-json", recipe, "--model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--max-queue", "64", "--shutdown-delay", "0", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONSAFEPATH": "1"})  # fmt: skip
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/v2/health/ready", log, "metainfer serve")
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from exc
    return proc


def served_variant_sha256(log: Path) -> str | None:
    """The variant sha256 ``metainfer serve`` logged when it got ready."""
    found = re.search(r"ready: variant sha256 ([0-9a-f]{64})", log.read_text(errors="replace"))
    return found.group(1) if found else None


class KServeUnavailable(RuntimeError):
    """kserve could not be installed or does not import; the message says exactly why."""


def _kserve_env() -> dict[str, str]:
    return peer_env.subprocess_env()


def kserve_version(venv: Path) -> str | None:
    """kserve's version if the venv imports kserve and onnxruntime, else None."""
    probe = "import importlib.metadata as m, kserve, onnxruntime; print(m.version('kserve'))"
    return peer_env.probe_output(venv / "bin" / "python", probe)


def ensure_kserve(venv: Path) -> dict[str, Any]:
    """Reuse or build kserve's venv from its lock (testkit/peer_env.py), and say which kserve it holds."""
    try:
        ready = peer_env.ensure(replace(peer_env.KSERVE, venv=venv))
    except peer_env.PeerEnvUnavailable as exc:
        raise KServeUnavailable(str(exc)) from exc
    version = kserve_version(venv)
    if not version:
        raise KServeUnavailable(f"kserve in {venv} does not report its version")
    if not ready.built_now:
        return {"venv": str(venv), "kserve": version, "installed_now": False}
    return {"venv": str(venv), "kserve": version, "installed_now": True, "install_s": ready.install_s}


def start_kserve(venv: Path, variant: Path, session_options: dict[str, Any], port: int, log: Path) -> Any:
    """kserve's ModelServer (bench/kserve_peer_server.py) on 127.0.0.1:port, its model ready."""
    config = log.with_suffix(".json")
    config.write_text(json.dumps({"model_path": str(variant), "model_name": MODEL_NAME, "http_port": port,
                                  "workers": SERVER_WORKERS, "session_options": session_options}))  # fmt: skip
    cmd = [str(venv / "bin" / "python"), str(KSERVE_SERVER), str(config)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=_kserve_env(), cwd="/")
    wait_ready(proc, f"http://127.0.0.1:{port}/v2/models/{MODEL_NAME}/ready", log, "kserve ModelServer")
    return proc


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- clients


def batch_rows(data: dict[str, np.ndarray], index: int, batch: int) -> dict[str, np.ndarray]:
    """Client ``index``'s request: ``batch`` samples of the example data, the same for every server."""
    size = len(next(iter(data.values())))
    rows = [(index * batch + j) % size for j in range(batch)]
    return {name: np.ascontiguousarray(array[rows]) for name, array in data.items()}


def http_caller(port: int, feeds: dict[str, np.ndarray], protocol: str) -> tuple[Callable[[], np.ndarray], Any]:
    """A tritonclient HTTP client sending ``feeds`` as binary tensors or JSON; returns (call, client)."""
    import tritonclient.http as http

    binary = protocol == "binary"
    conn = http.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=60, network_timeout=60)
    inputs = []
    for name, array in feeds.items():
        tensor = http.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [http.InferRequestedOutput(OUTPUT, binary_data=binary)]
    headers = None if binary else JSON_HEADERS

    def call() -> np.ndarray:
        return conn.infer(MODEL_NAME, inputs, outputs=outputs, headers=headers).as_numpy(OUTPUT)

    return call, conn


def run_clients(
    make: Callable[[int], tuple[Callable[[], np.ndarray], Callable[[], None]]],
    clients: int,
    seconds: float,
    warmup: float,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """``clients`` threads calling their ``call`` in a loop; items, latencies and CPU inside the measured window."""
    stop_event, window = threading.Event(), threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    items = [0] * clients
    errors: list[str] = []
    error_count = [0] * clients
    answered = [False] * clients

    def client(index: int) -> None:
        try:
            call, close = make(index)
        except Exception as exc:  # counted and reported, never hidden
            error_count[index] += 1
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        try:
            while not stop_event.is_set():
                started = time.perf_counter()
                try:
                    rows = call().shape[0]
                except Exception as exc:  # counted and reported, never hidden
                    if window.is_set() or not answered[index]:
                        error_count[index] += 1
                        if len(errors) < 5:
                            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                    time.sleep(0.05)
                    continue
                answered[index] = True
                if window.is_set():
                    latencies[index].append(time.perf_counter() - started)
                    items[index] += rows
        finally:
            close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    # Warm-up: connections, the first batches; at least `warmup` seconds and until every client has had an answer
    # (or failed), so a slow cell is measured in its steady state, not while its first round is still queued.
    time.sleep(warmup)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(answered[i] or error_count[i] for i in range(clients)):
        time.sleep(0.05)
    server_cpu = process_cpu_s(server_pid)
    started, cpu_started = time.perf_counter(), time.process_time()
    window.set()
    time.sleep(seconds)
    window.clear()
    elapsed = time.perf_counter() - started
    bench_cpu = (time.process_time() - cpu_started) / elapsed
    server_cpu = (process_cpu_s(server_pid) - server_cpu) / elapsed
    done = sum(items)
    stop_event.set()
    for thread in threads:
        thread.join(60)
    flat = np.array([x for lat in latencies for x in lat]) * 1000
    return {
        "clients": clients,
        "items_per_s": done / elapsed,
        "requests": int(flat.size),
        "p50_ms": float(np.percentile(flat, 50)) if flat.size else None,
        "p99_ms": float(np.percentile(flat, 99)) if flat.size else None,
        "client_cpu_cores": bench_cpu,  # this process: the clients (for in-process: ONNX Runtime itself)
        "server_cpu_cores": server_cpu if server_pid else None,
        "error_count": sum(error_count),
        "errors": errors[:5],
    }


def drive(
    port: int,
    data: dict[str, np.ndarray],
    clients: int,
    batch: int,
    seconds: float,
    protocol: str = "binary",
    warmup: float = 2.0,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """``clients`` tritonclient HTTP clients, each sending batches of ``batch`` samples as fast as answered."""

    def make(index: int) -> tuple[Callable[[], np.ndarray], Callable[[], None]]:
        call, conn = http_caller(port, batch_rows(data, index, batch), protocol)
        return call, conn.close

    return {"batch": batch, "protocol": protocol, **run_clients(make, clients, seconds, warmup, server_pid)}


def drive_in_process(
    session: Any, data: dict[str, np.ndarray], clients: int, batch: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """``clients`` threads calling ``session.run`` directly with the batches the HTTP clients send."""

    def make(index: int) -> tuple[Callable[[], np.ndarray], Callable[[], None]]:
        feeds = batch_rows(data, index, batch)
        return (lambda: session.run([OUTPUT], feeds)[0]), (lambda: None)

    return {"batch": batch, "protocol": "-", **run_clients(make, clients, seconds, warmup)}


def agreement(port: int, data: dict[str, np.ndarray], reference: np.ndarray, protocol: str) -> float:
    """Largest absolute difference between a server's answer to batch 8 and in-process ONNX Runtime's."""
    call, conn = http_caller(port, batch_rows(data, 0, 8), protocol)
    try:
        return float(np.abs(call() - reference).max())
    finally:
        conn.close()


# ---------------------------------------------------------------- liveness under attack

PROBE_TARGET_MS = 100.0
# What the server is doing while probed, in the order attacks() runs (and the section lists) them.
SATURATED, GZIP_BOMBS, IDLE_AND_STALLED = (
    "saturated (32 clients)",
    "3 gzip bombs (200 MiB inflated each)",
    "500 idle + 20 stalled uploads",
)
PROBE_ORDER = (SATURATED, GZIP_BOMBS, IDLE_AND_STALLED)


class Probe:
    """Times GET /v2/health/live every 20 ms on a thread."""

    def __init__(self, port: int) -> None:
        self.port, self.ms, self._stop = port, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import http.client

        while not self._stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            started = time.perf_counter()
            try:
                conn.request("GET", "/v2/health/live")
                conn.getresponse().read()
                self.ms.append((time.perf_counter() - started) * 1000)
            except OSError:
                self.ms.append(float("inf"))
            finally:
                conn.close()
            time.sleep(0.02)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(15)
        values = np.array(self.ms)
        return {"probes": int(values.size), "p50_ms": float(np.percentile(values, 50)),
                "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max())}  # fmt: skip


def attacks(port: int, data: dict[str, np.ndarray], seconds: float) -> dict[str, dict[str, float]]:
    """Liveness while the server is saturated or attacked."""
    import gzip
    import socket

    out: dict[str, dict[str, float]] = {}
    probe = Probe(port)
    drive(port, data, CLIENTS, 1, seconds)
    out[SATURATED] = probe.stop()

    bomb = gzip.compress(b" " * (200 << 20), compresslevel=9)
    head = (f"POST /v2/models/{MODEL_NAME}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n").encode()  # fmt: skip
    probe = Probe(port)
    bombers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    for conn in bombers:
        conn.sendall(head + bomb)
    for conn in bombers:
        conn.settimeout(60)
        conn.recv(4096)  # the 413
        conn.close()
    time.sleep(1)
    out[GZIP_BOMBS] = probe.stop()

    probe = Probe(port)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]
    stalled = []
    for _ in range(20):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(f"POST /v2/models/{MODEL_NAME}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{{"
                     .encode())  # fmt: skip
        stalled.append(conn)
    time.sleep(seconds)
    out[IDLE_AND_STALLED] = probe.stop()
    for conn in [*idle, *stalled]:
        conn.close()
    return out


def mean_run_rows(port: int) -> float:
    """Rows of the ONNX Runtime run the average request was part of (serve's batch-rows histogram)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    count = values.get("metainfer_inference_batch_rows_count", 0.0)
    return values.get("metainfer_inference_batch_rows_sum", 0.0) / count if count else 0.0


# ---------------------------------------------------------------- the parts


class Example:
    """The bert_mini example, the variant every server serves, and in-process ONNX Runtime's answers."""

    def __init__(self, work: Path) -> None:
        from metainfer.agent.zoo import build_examples
        from metainfer.core.engine.recipe import Recipe
        from metainfer.core.engine.runtime import create_session
        from metainfer.core.engine.transforms import build_variant

        example = build_examples(work, ["bert_mini"])["bert_mini"]
        self.model_path, self.sha256 = example.model_path, example.sha256
        with np.load(example.data_path) as npz:
            self.data = {name: npz[name] for name in npz.files}
        self.recipe = Recipe(batch=BATCH)
        # The variant `metainfer serve` rebuilds from (base, recipe): FP32, provenance-stamped. It is deterministic,
        # so the file written here is byte for byte what serve loads (checked against the sha256 serve logs).
        variant = build_variant(example.model_path.read_bytes(), self.recipe.transform, None)
        self.variant_path = work / "variant.onnx"
        self.variant_path.write_bytes(variant)
        import hashlib

        self.variant_sha256 = hashlib.sha256(variant).hexdigest()
        self.session = create_session(variant, self.recipe)  # metainfer serve's session options, exactly
        self.reference = self.session.run([OUTPUT], batch_rows(self.data, 0, 8))[0]


def run_matrix(args: argparse.Namespace, ex: Example, work: Path) -> dict[str, Any]:
    from hack.controlplane.processes import free_port

    grid = [(batch, clients) for batch in args.batches for clients in args.clients]
    cells: list[dict[str, Any]] = []
    out: dict[str, Any] = {"cells": cells, "agreement": {}, "variant_sha256": ex.variant_sha256}

    def cell(server: str, result: dict[str, Any]) -> None:
        result = {"server": server, **result}
        cells.append(result)
        print(f"[serving] matrix {server} {result['protocol']} batch {result['batch']} clients {result['clients']}:"
              f" {result['items_per_s']:.1f} items/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms,"
              f" errors {result['error_count']}", flush=True)  # fmt: skip

    if "in-process" in args.servers:
        for batch, clients in grid:
            cell("in-process", drive_in_process(ex.session, ex.data, clients, batch, args.seconds, args.warmup))

    def http_cells(server: str, port: int, pid: int) -> None:
        for protocol in args.protocols:
            out["agreement"][f"{server}/{protocol}"] = agreement(port, ex.data, ex.reference, protocol)
        for protocol in args.protocols:
            for batch, clients in grid:
                cell(server, drive(port, ex.data, clients, batch, args.seconds, protocol, args.warmup, pid))

    if "metainfer" in args.servers:
        port, log = free_port(), work / "matrix-metainfer.log"
        proc = start_server(ex.model_path, ex.sha256, port, log)
        try:
            served = served_variant_sha256(log)
            out["metainfer_variant_sha256"] = served
            if served != ex.variant_sha256:
                print(f"[serving] WARNING: serve's variant {served} is not {ex.variant_sha256}", flush=True)
            http_cells("metainfer", port, proc.pid)
        finally:
            stop(proc)

    if "kserve" in args.servers:
        try:
            out["kserve_env"] = ensure_kserve(args.kserve_venv)
            port, log = free_port(), work / "matrix-kserve.log"
            proc = start_kserve(args.kserve_venv, ex.variant_path, ex.recipe.session_options, port, log)
        except (KServeUnavailable, RuntimeError) as exc:
            out["kserve_unavailable"] = str(exc)
            print(f"[serving] kserve unavailable: {exc}", flush=True)
        else:
            try:
                http_cells("kserve", port, proc.pid)
            finally:
                stop(proc)
    return out


# (name, serve's extra arguments, clients, batch per request), in the order the section lists them.
RATIO_CASES: tuple[tuple[str, tuple[str, ...], int, int], ...] = (
    ("batch32-1client", (), 1, BATCH),
    ("batch1-32clients", (), CLIENTS, 1),
    ("batch1-32clients-unbatched", ("--batch-size", "1"), CLIENTS, 1),
)


def run_ratio(args: argparse.Namespace, ex: Example, work: Path) -> dict[str, Any]:
    from hack.controlplane.processes import free_port

    cases: dict[str, dict[str, Any]] = {}
    for name, extra, clients, batch in RATIO_CASES:
        port = free_port()
        proc = start_server(ex.model_path, ex.sha256, port, work / f"{name}.log", *extra)
        try:
            cases[name] = drive(port, ex.data, clients, batch, args.seconds, warmup=args.warmup, server_pid=proc.pid)
            cases[name]["mean_run_rows"] = mean_run_rows(port)
        finally:
            stop(proc)
        print(f"[serving] {name}: {cases[name]}", flush=True)
    ratio = cases["batch1-32clients"]["items_per_s"] / cases["batch32-1client"]["items_per_s"]
    before = cases["batch1-32clients-unbatched"]["items_per_s"] / cases["batch32-1client"]["items_per_s"]
    return {"cases": cases, "ratio": ratio, "ratio_unbatched": before}


def run_probes(args: argparse.Namespace, ex: Example, work: Path) -> dict[str, Any]:
    from hack.controlplane.processes import free_port

    port = free_port()
    proc = start_server(ex.model_path, ex.sha256, port, work / "attacks.log")
    try:
        probes = attacks(port, ex.data, args.seconds)
    finally:
        stop(proc)
    print(f"[serving] probes: {probes}", flush=True)
    return probes


def run_attacks(work: Path) -> list[dict[str, Any]]:
    import hashlib
    from dataclasses import asdict

    from hack.controlplane.processes import free_port
    from testkit.serve_attacks import MODEL, SERVE_FLAGS, every_attack, matmul_chain

    model = work / "identity.onnx"
    model.write_bytes(matmul_chain())
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    port, grpc_port = free_port(), free_port()
    proc = start_server(model, sha256, port, work / "attacks-identity.log", "--grpc-port", str(grpc_port),
                        *SERVE_FLAGS, batch=64, name=MODEL)  # fmt: skip
    try:
        results = [asdict(result) for result in every_attack(port, grpc_port, proc.pid)]
    finally:
        stop(proc)
    for result in results:
        print(f"[serving] attack: {result}", flush=True)
    return results


def run_chaos_part(ex: Example, work: Path) -> list[dict[str, Any]]:
    """testkit/serve_chaos.py for ``CHAOS_SECONDS`` against bert_mini (FP32, batch 8) on each runtime, gRPC on."""
    import json

    from hack.controlplane.processes import free_port
    from testkit.serve_chaos import in_process, make_pool, process_alive, run_chaos

    rows = []
    for runtime in CHAOS_RUNTIMES:
        port, grpc_port = free_port(), free_port()
        proc = start_server(ex.model_path, ex.sha256, port, work / f"chaos-{runtime}.log", "--grpc-port",
                            str(grpc_port), batch=8, runtime=runtime)  # fmt: skip
        try:
            recipe = json.dumps({"batch": 8, "session": {"runtime": runtime}})
            pool = make_pool(in_process(ex.model_path.read_bytes(), recipe), VOCAB, seed=0)
            result = run_chaos(port, grpc_port, proc.pid, MODEL_NAME, pool, VOCAB, runtime=runtime,
                               seconds=CHAOS_SECONDS, seed=0)  # fmt: skip
            result.alive = process_alive(proc.pid)
        finally:
            stop(proc)
        row = {**asdict_chaos(result), "calls_per_s": round(result.calls_per_s, 1), "passed": result.passed}
        print(f"[serving] chaos: {row}", flush=True)
        rows.append(row)
    return rows


def asdict_chaos(result: Any) -> dict[str, Any]:
    from dataclasses import asdict

    row = asdict(result)
    for key in ("seconds", "rss_start_mib", "rss_peak_mib", "rss_end_mib"):
        row[key] = round(row[key], 1)
    return row


# ---------------------------------------------------------------- markdown


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _loads(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _ordered(items: dict[str, Any], order: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """A saved dict's items in the order the run made them (the JSON sorts its keys), unknown keys last."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(items.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def render(saved: dict[str, Any]) -> str:
    """The section's body from the saved result (``records.ServingResult``): bench/render.py calls it."""
    bodies = []
    if saved.get("matrix"):
        bodies.append(render_matrix(saved["matrix"], saved["machine"], saved["seconds"], saved["warmup_s"]))
    if saved.get("cases"):
        bodies.append(render_ratio(saved))
    if saved.get("probes"):
        bodies.append(render_probes(saved["probes"]))
    if saved.get("attacks"):
        bodies.append(render_attacks(saved["attacks"]))
    if saved.get("chaos"):
        bodies.append(render_chaos(saved["chaos"]))
    bodies.append(
        f"Load average (1, 5, 15 min) at the start {_loads(saved['load_start'])}, at the end"
        f" {_loads(saved['load_end'])} on {saved['machine'].get('logical_cores', '?')} cores: other processes ran"
        " beside the benchmark when these are high."
    )
    return "\n\n".join(bodies)


def render_matrix(matrix: dict[str, Any], facts: dict[str, Any], seconds: float, warmup: float) -> str:
    cells = matrix["cells"]
    base = {(c["batch"], c["clients"]): c["items_per_s"] for c in cells if c["server"] == "in-process"}
    order = {s: i for i, s in enumerate(SERVERS)}
    cells = sorted(cells, key=lambda c: (c["batch"], c["clients"], order[c["server"]], c["protocol"]))
    rows = []
    for c in cells:
        reference = base.get((c["batch"], c["clients"]))
        rows.append([
            c["server"], c["protocol"], c["batch"], c["clients"], _num(c["items_per_s"]),
            f"{c['items_per_s'] / reference:.2f}x" if reference else "-", _num(c["p50_ms"]), _num(c["p99_ms"]),
            _num(c["server_cpu_cores"], 2), _num(c["client_cpu_cores"], 2), c["error_count"],
        ])  # fmt: skip
    header = ["server", "protocol", "batch per request", "clients", "items/s", "vs in-process", "client p50 ms",
              "client p99 ms", "server CPU (cores)", "bench process CPU (cores)", "errors"]  # fmt: skip
    cores = facts.get("logical_cores", "?")
    lines = [
        f"bert_mini (sequence 128, hidden 256), FP32 recipe at batch 32, the same variant and the same ONNX Runtime"
        f" session options in every server. {seconds:g} s measured per cell after a warm-up of {warmup:g} s or until"
        " every client has had an answer, whichever is longer. The clients"
        f" (tritonclient HTTP clients, one thread each, in the benchmark's process) share the machine's {cores}"
        " cores with the server; their CPU is the bench process column (for in-process ONNX Runtime that column is"
        " the inference itself).",
        "",
        "- **in-process**: the same ONNX Runtime session created as `metainfer serve` creates it, called directly"
        " by N threads with the same batches (no HTTP, no protocol): the upper bound. Both protocol rows of a server"
        " are divided by it.",
        "- **metainfer**: `metainfer serve` with its defaults (dynamic batching up to the recipe's 32 rows, one"
        " inference worker: the usable cores over the recipe's intra-op threads, which are ONNX Runtime's default"
        " of all cores; --max-queue 64).",
    ]
    env = matrix.get("kserve_env")
    if env:
        lines.append(
            f"- **kserve**: kserve {env['kserve']}'s `ModelServer` (venv `{env['venv']}` from"
            " bench/requirements-kserve.txt) with a `kserve.Model` wrapping an ONNX Runtime session"
            " (bench/kserve_peer_server.py): async `predict` running `session.run` on 2 threads, kserve defaults"
            " otherwise (one uvicorn worker, uvloop, latency logging on, no dynamic batching: kserve's Python"
            " server has none), gRPC off."
        )
    if matrix.get("kserve_unavailable"):
        lines.append(f"- **kserve**: not measured: {matrix['kserve_unavailable']}")
    lines.append(
        "- JSON rows: tensors and the output as JSON numbers (`binary_data=False`) with `Content-Type:"
        " application/json`, which tritonclient does not send by itself and kserve 0.21 requires (without it FastAPI"
        " hands kserve the body as bytes and it answers 400 'received byte inputs, but the"
        " inference-header-content-length header is missing')."
    )
    lines += ["", benchlib.markdown_table(header, rows), ""]
    if any(
        c["server"] != "in-process" and base.get((c["batch"], c["clients"]), 1e30) < c["items_per_s"] for c in cells
    ):
        lines.append(
            "A server above 1.00x: `metainfer serve`'s dynamic batching combines concurrent requests into larger ONNX"
            " Runtime runs (up to 32 rows on 2 workers), which N threads each running their own batch on one"
            " session do not get; in-process is the upper bound for the same runs, not for fewer, larger ones."
        )
    agree = matrix.get("agreement", {})
    if agree:
        worst = max(agree.values())
        lines.append(
            "Answers agree with in-process ONNX Runtime (batch 8, largest absolute difference: "
            + ", ".join(f"{k} {v:.2g}" for k, v in _ordered(agree, [f"{s}/{p}" for s in SERVERS for p in PROTOCOLS]))
            + f"){'.' if worst == 0 else ' - not bit-identical.'}"
        )
    served = matrix.get("metainfer_variant_sha256")
    if served and served != matrix["variant_sha256"]:
        lines.append(f"WARNING: `metainfer serve` served variant {served}, not {matrix['variant_sha256']}.")
    by_key = {(c["server"], c["protocol"], c["batch"], c["clients"]): c["items_per_s"] for c in cells}
    for protocol in PROTOCOLS:
        ratios = [
            by_key[("metainfer", protocol, b, n)] / by_key[("kserve", protocol, b, n)]
            for (s, p, b, n) in by_key
            if s == "metainfer" and p == protocol and by_key.get(("kserve", protocol, b, n))
        ]
        if ratios:
            lines.append(
                f"- metainfer serve vs kserve, {protocol}: {min(ratios):.2f}x to {max(ratios):.2f}x the items/s"
                f" across the {len(ratios)} (batch, clients) cells."
            )
    return "\n".join(lines)


def render_ratio(ratio: dict[str, Any]) -> str:
    cases = ratio["cases"]
    rows = "\n".join(
        f"| {name} | {c['clients']} | {c['batch']} | {c['items_per_s']:.1f} | {_num(c['p50_ms'])} | {_num(c['p99_ms'])}"
        f" | {c['mean_run_rows']:.1f} | {c['client_cpu_cores']:.2f} | {c['error_count']} |"
        for name, c in _ordered(cases, [case[0] for case in RATIO_CASES])
    )
    r, before = ratio["ratio"], ratio["ratio_unbatched"]
    verdict = "met" if r >= TARGET_RATIO else "missed"
    return (
        "Dynamic batching: bert_mini, FP32 recipe at batch 32, binary tensors, clients on the same cores.\n\n"
        "| case | clients | batch per request | items/s | client p50 ms | client p99 ms | rows per run | client CPU"
        " (cores) | errors |\n|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"- **{verdict}**. 32 concurrent batch-1 clients get {r:.2f}x the items/s of one batch-32 client with"
        f" dynamic batching (target >= {TARGET_RATIO}x); without it (`--batch-size 1`) {before:.2f}x."
        f" Runs combined {cases['batch1-32clients']['mean_run_rows']:.1f} rows on average (the row-weighted mean"
        " a request saw). The clients took"
        f" {cases['batch1-32clients']['client_cpu_cores']:.2f} cores from the machine (one client"
        f" {cases['batch32-1client']['client_cpu_cores']:.2f}); the rest of the gap is the server's work per"
        " request rather than per item (HTTP, decoding, concatenating and splitting the batch: 32 requests for"
        " 32 items instead of one), on its event loop."
    )


def render_probes(probes: dict[str, dict[str, float]]) -> str:
    worst = max(p["max_ms"] for p in probes.values())
    probe_rows = "\n".join(
        f"| {name} | {p['probes']} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['max_ms']:.1f} |"
        for name, p in _ordered(probes, PROBE_ORDER)
    )
    return (
        "Liveness (`GET /v2/health/live`, a new connection every 20 ms) while the server is saturated or attacked:\n\n"
        "| while | probes | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n"
        f"{probe_rows}\n\n"
        f"- **{'met' if worst < PROBE_TARGET_MS else 'missed'}**. Liveness under {PROBE_TARGET_MS:g} ms throughout:"
        f" the slowest probe took {worst:.1f} ms."
    )


def render_attacks(attacks: list[dict[str, Any]]) -> str:
    rows = "\n".join(
        f"| {a['name']} | {a['answered']} | {a['failed']} | {a['refused']} | {a['cut']}"
        f" | {a['liveness_max_ms']:.1f} | {a['liveness_failures']} | {a['rss_baseline_mib']:.0f}"
        f" | {a['rss_peak_mib']:.0f} | {a['rss_after_mib']:.0f} | {a['rss_after_mib'] - a['rss_baseline_mib']:+.0f}"
        f" | {a['seconds']:.1f} |"
        for a in attacks
    )
    failed = sum(a["failed"] for a in attacks)
    dead = sum(a["liveness_failures"] for a in attacks)
    worst_rss = max(a["rss_after_mib"] - a["rss_baseline_mib"] for a in attacks)
    worst_live = max(a["liveness_max_ms"] for a in attacks)
    met = failed == 0 and dead == 0 and worst_rss <= RSS_TARGET_MIB
    return (
        "Attacks (testkit/serve_attacks.py) on a one-MatMul identity model, [n, 512] in and out, batch 64, gRPC on,"
        " `--max-batch 1024 --max-queue-delay-ms 20 --write-timeout 3 --body-timeout 20`, one after another on one"
        " server; liveness timed every 50 ms, RSS sampled meanwhile and read again once settled:\n\n"
        "| attack | answered | failed | refused | cut | liveness max ms | liveness failures | RSS before MiB"
        " | RSS peak MiB | RSS after MiB | after - before | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        "- answered / failed: the complete requests sent beside the attack (slow senders), or the attack's own"
        " requests (mixed batch sizes: 10 rounds of 40, 40 and 10 rows, then one more; unread answers: answered"
        " into the socket buffers); refused: 503 (over the unsent-answer budget) or a refused stream; cut: written off"
        " at the write timeout (REST: connection closed; gRPC: the call ends, its answer stays in gRPC until the"
        " connection closes, counted in the budget meanwhile).\n"
        f"- **{'met' if met else 'missed'}**. {failed} complete request(s) failed, {dead} liveness failure(s), the"
        f" slowest liveness probe {worst_live:.1f} ms; RSS after each attack within {worst_rss:.0f} MiB of before"
        f" (target {RSS_TARGET_MIB:g} MiB)."
    )


def render_chaos(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"Chaos (testkit/serve_chaos.py, seed 0): {rows[0]['seconds']:.0f} s of a seeded mix of clients against"
        " bert_mini (FP32, batch 8, gRPC on, serve's defaults otherwise) on each runtime: gRPC calls with deadlines"
        " from 1 ms up, cancelled at random points, bursts of 500 streams on one connection, REST requests (some"
        " with client timeouts), connections cut mid-body and mid-answer, token ids past the vocabulary, batch"
        " sizes 1-8 and lengths 8-32, six client loops at once. Every answer is compared with the variant run in"
        " the benchmark's process; a refusal is right when a client can act on it (400 / INVALID_ARGUMENT for a"
        " bad id and nothing else, 503 / UNAVAILABLE with a retry hint, a deadline); then each of the 24 requests"
        " of the pool is sent again over both protocols.\n",
        "| runtime | calls | calls/s survived | answered | differing answers | wrong refusals | follow-ups failed |"
        " crashes | RSS start MiB | RSS peak MiB | RSS end MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['runtime']} | {row['calls']} | {row['calls_per_s']:.0f} | {row['answered']} |"
            f" {row['mismatched']} | {row['wrong']} | {row['followup_failures']} of {row['followups']} |"
            f" {0 if row['alive'] else 1} | {row['rss_start_mib']:.0f} | {row['rss_peak_mib']:.0f} |"
            f" {row['rss_end_mib']:.0f} |"
        )
    met = all(row["passed"] for row in rows)
    worst = max(row["rss_end_mib"] - row["rss_start_mib"] for row in rows)
    lines.append(
        f"\n- **{'met' if met else 'missed'}**. {sum(not row['alive'] for row in rows)} crash(es), "
        f"{sum(row['mismatched'] for row in rows)} differing answer(s), {sum(row['wrong'] for row in rows)} wrong"
        f" refusal(s), {sum(row['followup_failures'] for row in rows)} failed follow-up(s); RSS at the end within"
        f" {worst:.0f} MiB of the start (target 64 MiB)."
    )
    outcomes = {row["runtime"]: row["outcomes"] for row in rows}
    for runtime, counts in outcomes.items():
        lines.append(f"- {runtime}: " + ", ".join(f"{key} {value}" for key, value in counts.items()) + ".")
    return "\n".join(lines)


def write_elsewhere(directory: Path, payload: dict[str, Any]) -> None:
    """serving.json, and its section as bench/render.py renders it, in ``directory``; BENCHMARKS.md untouched."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "serving.json").write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    section = "\n\n".join([f"## {TITLE}", f"Command: `{benchlib.retypeable(payload['command'])}`",
                           benchlib.machine_line(payload["machine"]), body(payload),
                           f"Raw results: `{directory / 'serving.json'}`."])  # fmt: skip
    (directory / "serving.md").write_text(section + "\n")
    print(f"[serving] results in {directory}/serving.{{json,md}} (BENCHMARKS.md untouched)", flush=True)


def body(payload: dict[str, Any]) -> str:
    """The section's body of a result about to be saved, validated as bench/render.py will read it."""
    from bench.records import ServingResult

    return render(ServingResult.model_validate(payload).model_dump())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per case (default 15)")
    parser.add_argument("--quick", action="store_true", help="5 s per case (everything in about 4 minutes)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before each case is measured (default 2)")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default all)")
    parser.add_argument("--matrix", action="store_true", help="the side-by-side matrix only (--only matrix)")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="matrix servers")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS), help="matrix protocols")
    parser.add_argument("--batches", nargs="+", type=int, default=list(MATRIX_BATCHES), help="matrix request batches")
    parser.add_argument("--clients", nargs="+", type=int, default=list(MATRIX_CLIENTS), help="matrix client counts")
    parser.add_argument("--kserve-venv", type=Path, default=DEFAULT_KSERVE_VENV, help=f"default {DEFAULT_KSERVE_VENV}")
    parser.add_argument(
        "--results-dir", type=Path,
        help="write serving.{json,md} here, not to bench/results and BENCHMARKS.md (narrower runs always do, by"
        " default to a new temporary directory)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 5.0
    if args.matrix:
        args.only = ["matrix"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    full = (
        set(args.only) == set(PARTS)
        and set(args.servers) == set(SERVERS)
        and set(args.protocols) == set(PROTOCOLS)
        and sorted(args.batches) == sorted(MATRIX_BATCHES)
        and sorted(args.clients) == sorted(MATRIX_CLIENTS)
    )
    work = Path(tempfile.mkdtemp(prefix="metainfer-bench-serving-"))
    results_dir = args.results_dir or (None if full else work / "results")
    cells = (
        len(args.batches)
        * len(args.clients)
        * (("in-process" in args.servers) + len(args.protocols) * (len(set(args.servers) - {"in-process"})))
    )
    estimate = (args.seconds + args.warmup) * (cells * ("matrix" in args.only) + 3 * ("ratio" in args.only))
    estimate += (3 * args.seconds + 10) * ("probes" in args.only) + 150 * ("attacks" in args.only)
    estimate += (CHAOS_SECONDS + 30) * len(CHAOS_RUNTIMES) * ("chaos" in args.only)
    print(f"[serving] parts {args.only}; about {estimate / 60:.1f} min of measurement plus server starts;"
          f" work dir {work}", flush=True)  # fmt: skip
    ex = Example(work)
    facts = benchlib.machine()
    data: dict[str, Any] = {"seconds": args.seconds, "warmup_s": args.warmup, "parts": args.only,
                            "load_start": os.getloadavg()}  # fmt: skip
    if "matrix" in args.only:
        data["matrix"] = run_matrix(args, ex, work)
    if "ratio" in args.only:
        data.update(run_ratio(args, ex, work))
    if "probes" in args.only:
        data["probes"] = run_probes(args, ex, work)
    if "attacks" in args.only:
        data["attacks"] = run_attacks(work)
    if "chaos" in args.only:
        data["chaos"] = run_chaos_part(ex, work)
    data["load_end"] = os.getloadavg()
    payload = {"benchmark": "serving", "command": benchlib.command_line(), "machine": facts, **data}
    if results_dir is None:
        benchlib.write_result("serving", TITLE, data, facts=facts)
    else:
        write_elsewhere(results_dir, payload)
    print(body(payload), flush=True)
    failed = [c for c in data.get("matrix", {}).get("cells", []) if c["error_count"] or not c["requests"]]
    failed += [c for c in data.get("cases", {}).values() if c["error_count"] or not c["requests"]]
    failed += [a for a in data.get("attacks", []) if a["failed"] or a["liveness_failures"]]
    failed += [c for c in data.get("chaos", []) if not c["passed"]]
    return 1 if failed or data.get("matrix", {}).get("kserve_unavailable") else 0


if __name__ == "__main__":
    raise SystemExit(main())
