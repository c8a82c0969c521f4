"""Serving throughput: does dynamic batching give 32 concurrent batch-1 clients the items/s of one batch-32 client?

One run, side by side on one machine: ``metainfer serve`` serving the bert_mini example (sequence 128, FP32
recipe at batch 32) to tritonclient's HTTP client with binary tensors, as a production client would:

* ``batch32-1client``: one client sending batches of 32;
* ``batch1-32clients``: 32 concurrent clients sending one sample each, dynamic batching on (the defaults);
* ``batch1-32clients-unbatched``: the same clients against a server started with ``--batch-size 1``, which is
  how every request ran before dynamic batching.

Each case runs for ``--seconds`` after a warm-up; items/s counts samples answered, latencies are measured by
the clients (p50/p99 per request). The clients run on the same cores as the server (2 here), which costs the
32-client cases some CPU; the section says so with the numbers.

Target (issue 14): batch1-32clients >= 0.9 x the items/s of batch32-1client.

Then the probes under attack: /v2/health/live is timed every 20 ms while the server is saturated (the 32
clients), while three 200 KiB gzip bodies that inflate to 200 MiB each arrive at once, and while 500 idle
connections and 20 stalled uploads are held open. Target: liveness under 100 ms throughout.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import benchlib

TITLE = "Serving: dynamic batching"
CLIENTS = 32
BATCH = 32
TARGET_RATIO = 0.9


def start_server(model: Path, sha256: str, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    from metainfer.core.engine.recipe import Recipe

    recipe = Recipe(batch=BATCH).model_dump_json()
    cmd = [sys.executable, "-m", "metainfer.agent.cli", "serve", "--model-uri", model.as_uri(), "--model-sha256",
           sha256, "--recipe-json", recipe, "--model-name", "bert", "--host", "127.0.0.1", "--port", str(port),
           "--max-queue", "64", *extra]  # fmt: skip
    out = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONSAFEPATH": "1"})
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit("serve did not get ready")


def drive(port: int, data: dict[str, np.ndarray], clients: int, batch: int, seconds: float) -> dict[str, Any]:
    import tritonclient.http as http

    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    items = [0] * clients
    errors: list[str] = []

    def client(index: int) -> None:
        conn = http.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=60, network_timeout=60)
        rows = [(index * batch + j) % len(next(iter(data.values()))) for j in range(batch)]
        inputs = []
        for name, array in data.items():
            tensor = http.InferInput(name, [batch, array.shape[1]], "INT64")
            tensor.set_data_from_numpy(np.ascontiguousarray(array[rows]), binary_data=True)
            inputs.append(tensor)
        outputs = [http.InferRequestedOutput("last_hidden_state", binary_data=True)]
        try:
            while not stop.is_set():
                started = time.perf_counter()
                result = conn.infer("bert", inputs, outputs=outputs)
                latencies[index].append(time.perf_counter() - started)
                items[index] += result.as_numpy("last_hidden_state").shape[0]
        except Exception as exc:  # counted and reported, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)  # warm-up: connections, the first batches
    base = sum(items)
    for lat in latencies:
        lat.clear()
    started, cpu_started = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    done = sum(items) - base
    elapsed = time.perf_counter() - started
    client_cpu = (time.process_time() - cpu_started) / elapsed
    stop.set()
    for thread in threads:
        thread.join(60)
    flat = np.array([x for lat in latencies for x in lat]) * 1000
    return {
        "clients": clients,
        "batch": batch,
        "items_per_s": done / elapsed,
        "requests": int(flat.size),
        "p50_ms": float(np.percentile(flat, 50)) if flat.size else None,
        "p99_ms": float(np.percentile(flat, 99)) if flat.size else None,
        "client_cpu_cores": client_cpu,
        "errors": errors[:5],
    }


PROBE_TARGET_MS = 100.0


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
    out["saturated (32 clients)"] = probe.stop()

    bomb = gzip.compress(b" " * (200 << 20), compresslevel=9)
    head = (f"POST /v2/models/bert/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
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
    out["3 gzip bombs (200 MiB inflated each)"] = probe.stop()

    probe = Probe(port)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(500)]
    stalled = []
    for _ in range(20):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"POST /v2/models/bert/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
        stalled.append(conn)
    time.sleep(seconds)
    out["500 idle + 20 stalled uploads"] = probe.stop()
    for conn in [*idle, *stalled]:
        conn.close()
    return out


def mean_run_rows(port: int) -> float:
    """Rows of the ONNX Runtime run the average request was part of (serve's batch-rows histogram)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    count = values.get("metainfer_inference_batch_rows_count", 0.0)
    return values.get("metainfer_inference_batch_rows_sum", 0.0) / count if count else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per case (default 15)")
    parser.add_argument("--quick", action="store_true", help="5 s per case")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 5.0
    from hack.controlplane.processes import free_port
    from metainfer.agent.zoo import build_examples

    work = Path(tempfile.mkdtemp(prefix="metainfer-bench-serving-"))
    example = build_examples(work, ["bert_mini"])["bert_mini"]
    with np.load(example.data_path) as npz:
        data = {name: npz[name] for name in npz.files}
    cases: dict[str, dict[str, Any]] = {}
    for name, extra, clients, batch in [
        ("batch32-1client", (), 1, BATCH),
        ("batch1-32clients", (), CLIENTS, 1),
        ("batch1-32clients-unbatched", ("--batch-size", "1"), CLIENTS, 1),
    ]:
        port = free_port()
        proc = start_server(example.model_path, example.sha256, port, work / f"{name}.log", *extra)
        try:
            cases[name] = drive(port, data, clients, batch, args.seconds)
            cases[name]["mean_run_rows"] = mean_run_rows(port)
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"[serving] {name}: {cases[name]}", flush=True)
    port = free_port()
    proc = start_server(example.model_path, example.sha256, port, work / "attacks.log")
    try:
        probes = attacks(port, data, args.seconds)
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"[serving] probes: {probes}", flush=True)
    ratio = cases["batch1-32clients"]["items_per_s"] / cases["batch32-1client"]["items_per_s"]
    before = cases["batch1-32clients-unbatched"]["items_per_s"] / cases["batch32-1client"]["items_per_s"]
    rows = "\n".join(
        f"| {name} | {c['clients']} | {c['batch']} | {c['items_per_s']:.1f} | {c['p50_ms']:.1f} | {c['p99_ms']:.1f} |"
        f" {c['mean_run_rows']:.1f} | {c['client_cpu_cores']:.2f} | {len(c['errors'])} |"
        for name, c in cases.items()
    )
    verdict = "met" if ratio >= TARGET_RATIO else "missed"
    worst = max(p["max_ms"] for p in probes.values())
    probe_rows = "\n".join(
        f"| {name} | {p['probes']} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['max_ms']:.1f} |"
        for name, p in probes.items()
    )
    body = (
        "bert_mini (sequence 128, hidden 256), FP32 recipe at batch 32, binary tensors, clients on the same cores.\n\n"
        "| case | clients | batch per request | items/s | client p50 ms | client p99 ms | rows per run | client CPU"
        " (cores) | errors |\n|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"- **{verdict}**. 32 concurrent batch-1 clients get {ratio:.2f}x the items/s of one batch-32 client with"
        f" dynamic batching (target >= {TARGET_RATIO}x); without it (`--batch-size 1`) {before:.2f}x."
        f" Runs combined {cases['batch1-32clients']['mean_run_rows']:.1f} rows on average (the row-weighted mean"
        " a request saw). The clients took"
        f" {cases['batch1-32clients']['client_cpu_cores']:.2f} cores from the machine (one client"
        f" {cases['batch32-1client']['client_cpu_cores']:.2f}); the rest of the gap is the server's work per"
        " request rather than per item (HTTP, decoding, concatenating and splitting the batch: 32 requests for"
        " 32 items instead of one), on its event loop.\n\n"
        "Liveness (`GET /v2/health/live`, a new connection every 20 ms) while the server is saturated or attacked:\n\n"
        "| while | probes | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n"
        f"{probe_rows}\n\n"
        f"- **{'met' if worst < PROBE_TARGET_MS else 'missed'}**. Liveness under {PROBE_TARGET_MS:g} ms throughout:"
        f" the slowest probe took {worst:.1f} ms."
    )
    benchlib.write_result(
        "serving",
        TITLE,
        {"cases": cases, "ratio": ratio, "ratio_unbatched": before, "probes": probes, "seconds": args.seconds},
        body,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
