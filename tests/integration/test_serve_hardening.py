"""`metainfer serve` against the inputs any public endpoint meets: each case was measured against the server
before it bounded them (a 199 KiB gzip body that inflated to 200 MiB stalled everything for 20 s, 500 half-open
connections were held forever, client disconnects wrote thousands of traceback lines, SIGTERM kept admitting
requests on open connections).

Probes run beside every attack: liveness must keep answering (the bound asserted here is loose, for a shared
2-core machine; the latencies measured are in the assertion messages).
"""

from __future__ import annotations

import gzip
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import SERVED_RECIPE, ServeProcess, slow_model, start_serving

from metainfer.agent.zoo import ExampleModel
from metainfer.core.engine.recipe import Recipe

# Alone (no neighbouring test): liveness probes beside each attack are judged against a latency bound.
pytestmark = pytest.mark.alone

RECIPE = SERVED_RECIPE
MODEL = "digits"
LIVENESS_BOUND_S = 1.0


def start(example: ExampleModel, log_dir: Path, *extra: str) -> ServeProcess:
    return start_serving(example, log_dir, *extra, model_name=MODEL)


@pytest.fixture(scope="module")
def server(example: ExampleModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    served = start(example, tmp_path_factory.mktemp("serve"), "--idle-timeout", "1", "--body-timeout", "1")
    try:
        yield served
    finally:
        served.stop()


def body(batch: int = 1) -> bytes:
    data = np.linspace(0, 1, batch * 64, dtype=np.float32).tolist()
    return json.dumps({"inputs": [{"name": "input", "shape": [batch, 64], "datatype": "FP32", "data": data}]}).encode()


def head(length: int, *extra: str) -> bytes:
    lines = [f"POST /v2/models/{MODEL}/infer HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {length}", *extra]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(conn: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    header, _, rest = data.partition(b"\r\n\r\n")
    lines = header.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


class Prober:
    """Times /v2/health/live every 50 ms on a thread while an attack runs."""

    def __init__(self, url: str) -> None:
        self.url, self.latencies, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url + "/v2/health/live", timeout=5) as response:
                    response.read()
            except (urllib.error.URLError, OSError):
                self.latencies.append(float("inf"))
            else:
                self.latencies.append(time.perf_counter() - started)
            time.sleep(0.05)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self.latencies, "no probe ran"
        worst = max(self.latencies)
        assert worst < LIVENESS_BOUND_S, f"liveness took up to {worst:.3f} s (median {np.median(self.latencies):.4f})"


def metrics(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("metainfer_"):
                extra = s.labels.get("code") or s.labels.get("reason") or ""
                out[(s.name, extra)] = out.get((s.name, extra), 0.0) + s.value
    return out


def test_a_declared_huge_body_is_refused_before_it_is_read(server: ServeProcess) -> None:
    with Prober(server.url), socket.create_connection(("127.0.0.1", server.port)) as conn:
        started = time.perf_counter()
        conn.sendall(head(300 << 20))  # 300 MiB announced, nothing sent
        status, headers, payload = read_response(conn)
        assert status == 413 and "larger than" in json.loads(payload)["error"], payload
        assert headers.get("connection") == "close"
        assert time.perf_counter() - started < 5


def test_a_compressed_body_is_refused_once_its_inflated_size_passes_the_limit(server: ServeProcess) -> None:
    bomb = gzip.compress(b" " * (100 << 20), compresslevel=9)  # about 100 KiB on the wire, under the body limit
    assert len(bomb) < 150 << 10
    with Prober(server.url), socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(head(len(bomb), "Content-Encoding: gzip") + bomb)
        status, _, payload = read_response(conn, timeout=30)
    assert status == 413 and "inflated" in json.loads(payload)["error"], payload


def test_half_open_connections_and_stalled_uploads_are_closed(server: ServeProcess) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    slow_headers = socket.create_connection(("127.0.0.1", server.port))
    slow_headers.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    stalled = socket.create_connection(("127.0.0.1", server.port))
    whole = body()
    stalled.sendall(head(len(whole)) + whole[:20])  # the body never finishes
    try:
        with Prober(server.url):
            status, _, payload = read_response(stalled)
            assert status == 408 and "not received within" in json.loads(payload)["error"]
            for conn in [*idle, slow_headers]:
                conn.settimeout(10)
                assert conn.recv(1) == b"", "the server should have closed an idle connection"
    finally:
        for conn in [*idle, slow_headers, stalled]:
            conn.close()


def test_uploads_still_arriving_hold_no_admission_slot(example: ExampleModel, tmp_path: Path) -> None:
    """--max-queue 2: two uploads in progress (headers and 10 bytes of body) used to hold both slots and refuse
    every other request for the body timeout; admission now counts complete requests only."""
    server = start(example, tmp_path, "--max-queue", "2")
    whole = body()
    holders = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        for conn in holders:
            conn.sendall(head(len(whole)) + whole[:10])
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(head(len(whole)) + whole)
            status, _, payload = read_response(conn)
        assert status == 200, payload
    finally:
        for conn in holders:
            conn.close()
        server.stop()


def test_admission_is_bounded_and_overload_is_a_503_with_retry_after(tmp_path: Path) -> None:
    """--max-queue 1: a request running on the slow model holds the one slot; the next is answered at once."""
    served = start_slow_model(tmp_path, "--max-queue", "1", "--request-timeout", "20")
    try:
        with socket.create_connection(("127.0.0.1", served.port)) as running:
            running.sendall(big_request())
            time.sleep(0.5)  # decoded and admitted: it runs for seconds
            small = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [1.0] * 512}]})
            with socket.create_connection(("127.0.0.1", served.port)) as conn:
                conn.sendall(head(len(small)) + small.encode())
                status, headers, payload = read_response(conn)
        assert status == 503 and headers.get("retry-after") == "1" and "busy" in json.loads(payload)["error"]
    finally:
        served.stop()


def test_disconnecting_clients_are_counted_and_log_one_line_each_at_most(server: ServeProcess) -> None:
    before = metrics(server.url)
    whole = body()
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(head(len(whole)) + whole[:30])
            time.sleep(0.05)  # the request is admitted and reading its body when the client goes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = metrics(server.url)
        if (
            after.get(("metainfer_inference_aborted_total", "client_disconnect"), 0)
            - before.get(("metainfer_inference_aborted_total", "client_disconnect"), 0)
            >= 30
        ):
            break
        time.sleep(0.2)
    gone = after.get(("metainfer_inference_aborted_total", "client_disconnect"), 0) - before.get(
        ("metainfer_inference_aborted_total", "client_disconnect"), 0
    )
    assert gone == 30
    assert "Traceback" not in server.log.read_text()


def test_answers_say_nothing_about_the_framework_and_latency_is_recorded_in_parts(server: ServeProcess) -> None:
    before = metrics(server.url)
    request = urllib.request.Request(f"{server.url}/v2/models/{MODEL}/infer", data=body(4), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Server"] == "metainfer"
        assert json.loads(response.read())["outputs"][0]["shape"] == [4, 10]
    after = metrics(server.url)
    for name in ("metainfer_inference_queue_seconds_count", "metainfer_inference_compute_seconds_count",
                 "metainfer_inference_latency_seconds_count"):  # fmt: skip
        assert after[(name, "")] - before.get((name, ""), 0) == 1, name
    status, _, payload = empty_axis(server)
    assert status == 400 and "empty" in payload


def empty_axis(server: ServeProcess) -> tuple[int, dict[str, str], str]:
    doc = {"inputs": [{"name": "input", "shape": [1, 0], "datatype": "FP32", "data": []}]}
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        raw = json.dumps(doc).encode()
        conn.sendall(head(len(raw)) + raw)
        status, headers, payload = read_response(conn)
    return status, headers, payload.decode()


def test_sigterm_admits_nothing_new_closes_keep_alive_and_reports_a_clean_drain(
    example: ExampleModel, tmp_path: Path
) -> None:
    served = start(example, tmp_path, "--drain-timeout", "5")
    whole = body()
    try:
        with socket.create_connection(("127.0.0.1", served.port)) as keep_alive:
            keep_alive.sendall(head(len(whole)) + whole)
            assert read_response(keep_alive)[0] == 200  # a kept-alive connection, as clients pool them
            in_flight = socket.create_connection(("127.0.0.1", served.port))
            in_flight.sendall(head(len(whole)) + whole[:10])
            time.sleep(0.3)
            assert served.proc is not None
            served.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            keep_alive.sendall(head(len(whole)) + whole)  # a new request on the open connection: not admitted
            status, headers, payload = read_response(keep_alive)
            assert status == 503 and headers.get("connection") == "close", payload
            in_flight.sendall(whole[10:])  # the request in flight is still answered
            status, headers, _ = read_response(in_flight)
            assert status == 200 and headers.get("connection") == "close"
            in_flight.close()
        assert served.proc.wait(timeout=15) == 0
    finally:
        served.stop()


def test_a_drain_that_times_out_is_counted_and_exits_3(example: ExampleModel, tmp_path: Path) -> None:
    served = start(example, tmp_path, "--drain-timeout", "1", "--body-timeout", "30")
    whole = body()
    try:
        stuck = socket.create_connection(("127.0.0.1", served.port))
        stuck.sendall(head(len(whole)) + whole[:10])  # never finishes its body
        time.sleep(0.3)
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=15) == 3
        assert "1 request(s) still in flight are cut" in served.log.read_text()
        stuck.close()
    finally:
        served.stop()


def test_compressed_bodies_are_answered_like_plain_ones_and_unknown_encodings_are_415(server: ServeProcess) -> None:
    plain = body(2)

    def post(data: bytes, *extra: str) -> tuple[int, dict[str, str], bytes]:
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(head(len(data), *extra) + data)
            return read_response(conn)

    status, _, expected = post(plain)
    assert status == 200
    for encoding, packed in (("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain))):
        status, _, payload = post(packed, f"Content-Encoding: {encoding}")
        assert (status, payload) == (200, expected), payload[:200]
    status, headers, payload = post(plain, "Content-Encoding: br")
    assert status == 415 and "gzip" in json.loads(payload)["error"] and headers.get("connection") == "close"
    status, _, payload = post(gzip.compress(plain)[:-10], "Content-Encoding: gzip")
    assert status == 400 and "truncated" in json.loads(payload)["error"]


def test_three_gzip_bombs_at_once_are_inflated_off_the_event_loop(server: ServeProcess) -> None:
    """Before, aiohttp inflated them on the loop: liveness stalled for 668 ms (20 s with no size limit)."""
    bomb = gzip.compress(b" " * (100 << 20), compresslevel=9)  # under the body limit on the wire, 100 MiB inflated
    conns = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        with Prober(server.url):
            for conn in conns:
                conn.sendall(head(len(bomb), "Content-Encoding: gzip") + bomb)
            for conn in conns:
                status, _, payload = read_response(conn, timeout=30)
                assert status == 413 and "inflated" in json.loads(payload)["error"], payload
    finally:
        for conn in conns:
            conn.close()


def slow_model_file(path: Path) -> str:
    """serve_harness.slow_model written to ``path``; returns its sha256."""
    import hashlib

    path.write_bytes(slow_model())
    return hashlib.sha256(path.read_bytes()).hexdigest()


def start_slow_model(tmp_path: Path, *extra: str) -> ServeProcess:
    """serve_harness.slow_model served with one worker and no batching: a [2048, 512] request runs for seconds."""
    model = tmp_path / "slow.onnx"
    sha256 = slow_model_file(model)
    served = ServeProcess(tmp_path)
    served.start([
        "serve", "--model-uri", model.as_uri(), "--model-sha256", sha256,
        "--recipe-json", Recipe(batch=1).model_dump_json(),
        "--model-name", MODEL, "--host", "127.0.0.1", "--port", str(served.port), "--max-batch", "4096",
        "--workers", "1", "--batch-size", "1", *extra,
    ], {})  # fmt: skip
    served.wait_ready()
    return served


def big_request() -> bytes:
    """A [2048, 512] binary request to the slow model: seconds of compute."""
    big = np.ones((2048, 512), dtype=np.float32)
    doc = {"inputs": [{"name": "x", "shape": list(big.shape), "datatype": "FP32", "parameters":
                       {"binary_data_size": big.nbytes}}], "outputs": [{"name": "y"}]}  # fmt: skip
    header = json.dumps(doc).encode()
    payload = header + big.tobytes()
    return head(len(payload), f"Inference-Header-Content-Length: {len(header)}") + payload


def test_a_request_still_running_at_its_deadline_is_stopped_and_frees_its_worker(tmp_path: Path) -> None:
    """Before, an expensive legal request held its worker to the end (two [64, 512] ones: about 10 s)."""
    served = start_slow_model(tmp_path, "--request-timeout", "0.5")
    try:
        with socket.create_connection(("127.0.0.1", served.port)) as conn:
            started = time.perf_counter()
            conn.sendall(big_request())
            status, _, answer = read_response(conn, timeout=60)
            took = time.perf_counter() - started
        assert status == 503 and "stopped at its deadline" in json.loads(answer)["error"], answer[:300]
        assert took < 3, f"answered after {took:.1f} s"
        small = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [1.0] * 512}]})
        request = urllib.request.Request(f"{served.url}/v2/models/{MODEL}/infer", data=small.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:  # the one worker is free again
            assert json.loads(response.read())["outputs"][0]["data"][:2] == [1.0, 1.0]
        assert metrics(served.url)[("metainfer_inference_aborted_total", "deadline")] == 1
    finally:
        served.stop()
