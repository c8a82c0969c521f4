"""Clients that used to take ``metainfer serve`` out, as drivers that measure what they do to it.

Each attack runs against a server already listening (REST ``port``, gRPC ``grpc_port``, process ``pid``) while a
``Watch`` samples the process's RSS and times /v2/health/live every 50 ms. The integration tests
(tests/integration/test_serve_never_wedges.py) assert on these figures; bench/serving.py's ``attacks`` part puts
them in BENCHMARKS.md.

* ``mixed_batches``: concurrent requests of 40, 40 and 10 rows against a batch of 64 (the batch skips a queued
  request; removing the taken ones compared tensors, the dispatcher died and every later request got 503 while
  the probes stayed green).
* ``slow_senders_rest`` / ``slow_senders_grpc``: connections (REST) or streams on one HTTP/2 connection (gRPC) that
  send their headers and nothing else, while complete requests are sent over both protocols.
* ``unread_answers_rest`` / ``zero_window_grpc``: clients that never read their answers (REST), or one HTTP/2
  connection that grants the server no window to send in (gRPC).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import numpy as np

from metainfer.agent.serve import grpc_messages as pb

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` (VmRSS), MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Watch:
    """RSS and liveness of the server while an attack runs (sampled every ``interval_s``)."""

    url: str
    pid: int
    interval_s: float = 0.05
    baseline_mib: float = 0.0
    peak_mib: float = 0.0
    liveness_max_s: float = 0.0
    liveness_failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_mib = max(self.peak_mib, rss_mib(self.pid))
            except (OSError, RuntimeError):  # the process is gone (the attack ended it): nothing more to watch
                return
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url + "/v2/health/live", timeout=5) as response:
                    ok = response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                ok = False
            self.liveness_max_s = max(self.liveness_max_s, time.perf_counter() - started)
            self.liveness_failures += not ok
            self._stop.wait(self.interval_s)

    @contextmanager
    def running(self) -> Iterator[Watch]:
        self.baseline_mib = self.peak_mib = rss_mib(self.pid)
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def settled_mib(self, within_s: float, tolerance_mib: float) -> float:
        """RSS once it is back within ``tolerance_mib`` of the baseline, or after ``within_s`` (the last reading)."""
        deadline = time.monotonic() + within_s
        while True:
            now = rss_mib(self.pid)
            if now - self.baseline_mib <= tolerance_mib or time.monotonic() > deadline:
                return now
            time.sleep(0.25)


# -- requests ----------------------------------------------------------------------------------------------------


def rest_request(model: str, name: str, array: np.ndarray) -> tuple[str, bytes, int]:
    """(path, body, JSON header length) of a v2 REST request with one binary FP32 input; the answer is JSON."""
    doc = {
        "inputs": [
            {"name": name, "shape": list(array.shape), "datatype": "FP32",
             "parameters": {"binary_data_size": array.size * 4}}
        ]
    }  # fmt: skip
    header = json.dumps(doc).encode()
    return f"/v2/models/{model}/infer", header + array.astype(np.float32).tobytes(), len(header)


def http_head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(port: int, model: str, name: str, array: np.ndarray, timeout: float = 30) -> int:
    """One complete REST request; its HTTP status (0: no answer)."""
    path, body, header_length = rest_request(model, name, array)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, method="POST",
        headers={"Inference-Header-Content-Length": str(header_length)},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def grpc_message(model: str, name: str, array: np.ndarray) -> bytes:
    """A ModelInferRequest with one raw FP32 input, framed as on the wire (flag, length, message)."""
    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[array.astype(np.float32).tobytes()])
    request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    data = request.SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def grpc_call(grpc_port: int, model: str, name: str, array: np.ndarray, timeout: float = 30) -> str:
    """One complete gRPC ModelInfer over its own connection; its status code's name ("OK" when answered)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        infer = channel.unary_unary(INFER_PATH, request_serializer=None, response_deserializer=None)
        try:
            infer(grpc_message(model, name, array)[5:], timeout=timeout)
            return "OK"
        except grpc.RpcError as exc:
            return str(exc.code().name)  # type: ignore[attr-defined]


class H2Client:
    """A raw HTTP/2 connection to the gRPC port, for what no gRPC library lets a client do."""

    def __init__(self, grpc_port: int, *, window: int | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", grpc_port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        if window is not None:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.flush()
        self.events: list[h2.events.Event] = []

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def open_call(self, *, end: bool = False) -> int:
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", INFER_PATH), (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        self.conn.send_headers(stream, headers, end_stream=end)
        self.flush()
        return stream

    def send_message(self, stream: int, framed: bytes) -> None:
        """Send ``framed`` on ``stream`` as far as the server's window allows, then end the stream."""
        view = memoryview(framed)
        while view:
            window = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size)
            if window <= 0:
                self.pump(0.05)
                continue
            self.conn.send_data(stream, bytes(view[:window]))
            view = view[window:]
            self.flush()
        self.conn.end_stream(stream)
        self.flush()

    def pump(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return
        if not data:
            raise ConnectionError("the server closed the connection")
        self.events.extend(self.conn.receive_data(data))
        self.flush()

    def seconds_until_closed(self, within_s: float) -> float | None:
        """Keep the connection (answering pings, taking nothing) until the server closes it: the seconds that took,
        None if it did not within ``within_s``."""
        started = time.monotonic()
        parsing = True
        while time.monotonic() - started < within_s:
            try:
                if parsing:
                    self.pump(0.2)
                    continue
                self.sock.settimeout(0.2)
                if not self.sock.recv(1 << 16):
                    return time.monotonic() - started
            except ConnectionError:
                return time.monotonic() - started
            except TimeoutError:
                continue
            except h2.exceptions.ProtocolError:
                parsing = False  # h2 refuses frames after a GOAWAY (a PING): read raw bytes until the end
        return None

    def close(self) -> None:
        self.sock.close()


# -- the model attacked ------------------------------------------------------------------------------------------

# The identity model the attacks are sized for ([n, 512] in and out: cheap to run, large to answer; the JSON of a
# [1024, 512] output is about 5 MB) and the flags both the tests and the benchmark serve it with.
MODEL, INPUT, WIDTH = "identity", "x", 512
SERVE_FLAGS = ("--max-batch", "1024", "--max-queue-delay-ms", "20", "--write-timeout", "3", "--body-timeout", "20")


def matmul_chain(layers: int = 1, width: int = WIDTH) -> bytes:
    """A chain of identity MatMuls, [n, width] in and out: one layer is the attacks' model; many make a [2048, 512]
    request take seconds, in many kernels, so ONNX Runtime can stop a run between them (the deadline tests)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(width, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}"]) for i in range(layers)]
    nodes.append(helper.make_node("Identity", [f"h{layers}"], ["y"]))
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


# -- attacks -----------------------------------------------------------------------------------------------------


@dataclass
class AttackResult:
    """What one attack did to the server: the complete requests sent beside it and how they were answered, the
    attack's own requests refused or cut, liveness and memory."""

    name: str
    answered: int = 0
    failed: int = 0
    refused: int = 0
    cut: int = 0
    liveness_max_ms: float = 0.0
    liveness_failures: int = 0
    rss_baseline_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_after_mib: float = 0.0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _finish(result: AttackResult, watch: Watch, started: float) -> AttackResult:
    result.liveness_max_ms = round(watch.liveness_max_s * 1000, 1)
    result.liveness_failures = watch.liveness_failures
    result.rss_baseline_mib = round(watch.baseline_mib, 1)
    result.rss_peak_mib = round(watch.peak_mib, 1)
    result.seconds = round(time.perf_counter() - started, 1)
    return result


def mixed_batches(port: int, pid: int, model: str, name: str, width: int, rounds: int = 10) -> AttackResult:
    """Rounds of three concurrent requests of 40, 40 and 10 rows; then one more request must still be answered."""
    watch, result, started = (
        Watch(f"http://127.0.0.1:{port}", pid),
        AttackResult("mixed batch sizes"),
        time.perf_counter(),
    )
    with watch.running(), ThreadPoolExecutor(3) as pool:
        for _ in range(rounds):
            statuses = list(pool.map(lambda n: post(port, model, name, np.ones((n, width)), 15), (40, 40, 10)))
            result.answered += sum(s == 200 for s in statuses)
            result.failed += sum(s != 200 for s in statuses)
        final = post(port, model, name, np.ones((1, width)), 15)
        result.answered += final == 200
        result.failed += final != 200
    result.rss_after_mib = round(rss_mib(pid), 1)
    return _finish(result, watch, started)


def slow_senders_rest(
    port: int, grpc_port: int, pid: int, model: str, name: str, width: int, count: int = 64
) -> AttackResult:
    """``count`` REST connections send headers and no body; complete REST and gRPC requests are sent meanwhile."""
    watch, result, started = (
        Watch(f"http://127.0.0.1:{port}", pid),
        AttackResult("REST headers, no body"),
        time.perf_counter(),
    )
    path, body, _ = rest_request(model, name, np.ones((1, width)))
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    try:
        with watch.running():
            for conn in held:
                conn.sendall(http_head(path, len(body)))
            time.sleep(0.5)
            _complete_requests(result, port, grpc_port, model, name, width)
    finally:
        for conn in held:
            conn.close()
    result.rss_after_mib = round(rss_mib(pid), 1)
    return _finish(result, watch, started)


def slow_senders_grpc(
    port: int, grpc_port: int, pid: int, model: str, name: str, width: int, count: int = 64
) -> AttackResult:
    """``count`` gRPC streams on ONE connection send headers and no message; complete requests are sent meanwhile."""
    watch = Watch(f"http://127.0.0.1:{port}", pid)
    result = AttackResult(f"{count} gRPC streams, headers only, one connection")
    started = time.perf_counter()
    client = H2Client(grpc_port)
    try:
        with watch.running():
            for _ in range(count):
                client.open_call()
            client.pump(0.5)
            refused = sum(isinstance(e, h2.events.StreamReset) for e in client.events)
            result.refused = refused
            _complete_requests(result, port, grpc_port, model, name, width)
    finally:
        client.close()
    result.rss_after_mib = round(rss_mib(pid), 1)
    return _finish(result, watch, started)


def _complete_requests(result: AttackResult, port: int, grpc_port: int, model: str, name: str, width: int) -> None:
    for _ in range(3):
        rest = post(port, model, name, np.ones((1, width)), 10)
        over_grpc = grpc_call(grpc_port, model, name, np.ones((1, width)), 10)
        result.answered += (rest == 200) + (over_grpc == "OK")
        result.failed += (rest != 200) + (over_grpc != "OK")
        if rest != 200 or over_grpc != "OK":
            result.notes.append(f"REST {rest}, gRPC {over_grpc}")


def unread_answers_rest(
    port: int, pid: int, model: str, name: str, rows: int, width: int, count: int, within_s: float, settle_s: float
) -> AttackResult:
    """``count`` clients send a request whose answer is large and read nothing until the server has dealt with
    every one (cut at its write timeout, refused, or answered into the socket buffers) or ``within_s`` passed;
    memory is read once it is back near the baseline, or after ``settle_s``."""
    watch, result = Watch(f"http://127.0.0.1:{port}", pid), AttackResult(f"{count} REST clients never read")
    started = time.perf_counter()
    # Random values: their JSON (about 12 bytes each) outgrows the kernel's socket buffers, as real outputs do.
    values = np.random.default_rng(0).standard_normal((rows, width))
    path, body, header_length = rest_request(model, name, values)
    request = http_head(path, len(body), f"Inference-Header-Content-Length: {header_length}") + body
    conns = []
    url = f"http://127.0.0.1:{port}"
    before = counters(url)
    with watch.running():
        for _ in range(count):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.sendall(request)
            conns.append(conn)
        delta = _outcomes(url, before, count, within_s)
        result.cut, result.refused = int(delta.get("aborted:slow_reader", 0)), int(delta.get("error:503", 0))
        result.answered = int(delta.get("answered", 0))  # the socket buffers took the whole answer
        for conn in conns:
            conn.close()
        result.rss_after_mib = round(watch.settled_mib(settle_s, 64), 1)
    return _finish(result, watch, started)


def unread_answers_held(
    port: int, pid: int, path: str, body: bytes, count: int, hold_s: float, after_s: float
) -> AttackResult:
    """``count`` clients POST ``body`` to ``path`` (a request whose answer is large) and read nothing for
    ``hold_s`` (the server's write timeout not yet reached), then close: the peak while they hold, and RSS
    ``after_s`` after they closed. The baseline is read after one such request has been answered, so the runtime's
    buffers for it exist, and past serve's trim interval."""
    url = f"http://127.0.0.1:{port}"
    request = urllib.request.Request(url + path, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    time.sleep(6)
    watch, result = Watch(url, pid), AttackResult(f"{count} REST clients hold unread answers {hold_s:g} s")
    started = time.perf_counter()
    raw = http_head(path, len(body), "Content-Type: application/json") + body
    before = counters(url)
    with watch.running():
        conns = []
        for _ in range(count):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.sendall(raw)
            conns.append(conn)
        time.sleep(hold_s)
        for conn in conns:
            conn.close()
        time.sleep(after_s)
        result.rss_after_mib = round(rss_mib(pid), 1)
    delta = {key: value - before.get(key, 0) for key, value in counters(url).items()}
    result.refused, result.answered = int(delta.get("error:503", 0)), int(delta.get("answered", 0))
    result.cut = int(delta.get("aborted:client_disconnect", 0) + delta.get("aborted:slow_reader", 0))
    return _finish(result, watch, started)


def counters(url: str) -> dict[str, float]:
    """The server's request outcomes so far: answered, and aborted or refused by reason / code."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "metainfer_inference_latency_seconds_count":
                out["answered"] = out.get("answered", 0) + sample.value
            elif sample.name == "metainfer_inference_aborted_total":
                key = "aborted:" + sample.labels["reason"]
                out[key] = out.get(key, 0) + sample.value
            elif sample.name == "metainfer_inference_errors_total":
                key = "error:" + sample.labels["code"]
                out[key] = out.get(key, 0) + sample.value
    return out


def _outcomes(url: str, before: dict[str, float], count: int, within_s: float) -> dict[str, float]:
    """The outcome deltas since ``before``, once ``count`` requests have one (answered, cut, refused) or after
    ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        now = counters(url)
        delta = {key: now.get(key, 0) - before.get(key, 0) for key in now}
        done = delta.get("answered", 0) + delta.get("aborted:slow_reader", 0) + delta.get("error:503", 0)
        if done >= count or time.monotonic() > deadline:
            return delta
        time.sleep(0.25)


def zero_window_grpc(
    port: int, grpc_port: int, pid: int, model: str, name: str, rows: int, width: int, count: int, settle_s: float
) -> AttackResult:
    """One HTTP/2 connection with a zero window sends ``count`` calls whose answers are large."""
    watch, result = Watch(f"http://127.0.0.1:{port}", pid), AttackResult(f"gRPC zero window, {count} calls")
    started = time.perf_counter()
    client = H2Client(grpc_port, window=0)
    message = grpc_message(model, name, np.ones((rows, width)))
    try:
        with watch.running():
            for _ in range(count):
                client.send_message(client.open_call(), message)
            deadline = time.monotonic() + settle_s
            while time.monotonic() < deadline:
                try:
                    client.pump(0.2)
                except ConnectionError:
                    break
                if sum(isinstance(e, h2.events.StreamReset | h2.events.StreamEnded) for e in client.events) >= count:
                    break
            result.cut = sum(isinstance(e, h2.events.StreamReset) for e in client.events)
            result.refused = sum(  # a refusal is trailers-only: a status in the response headers, or trailers
                isinstance(e, h2.events.TrailersReceived | h2.events.ResponseReceived)
                and _grpc_status(e.headers) not in (b"0", None)
                for e in client.events
            )
            client.close()
            result.rss_after_mib = round(watch.settled_mib(settle_s, 64), 1)
    finally:
        client.close()
    return _finish(result, watch, started)


def _grpc_status(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    return next((value for key, value in headers if key == b"grpc-status"), None)


Attack = Callable[..., AttackResult]


def grpc_idle_close_s(grpc_port: int, model: str, name: str, width: int, within_s: float) -> float | None:
    """Seconds from the end of one ModelInfer call to the server's GOAWAY on its idle connection (None: none came
    within ``within_s``)."""
    client = H2Client(grpc_port)
    try:
        client.send_message(client.open_call(), grpc_message(model, name, np.ones((1, width))))
        while not any(isinstance(e, h2.events.StreamEnded) for e in client.events):
            client.pump(0.2)
        ended = time.monotonic()
        while time.monotonic() - ended < within_s:
            try:
                client.pump(0.1)
            except ConnectionError:
                return time.monotonic() - ended
            if any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events):
                return time.monotonic() - ended
        return None
    finally:
        client.close()


def every_attack(port: int, grpc_port: int, pid: int) -> list[AttackResult]:
    """The attacks, one after another, against ``matmul_chain()`` served with ``SERVE_FLAGS`` (bench/serving.py)."""
    return [
        mixed_batches(port, pid, MODEL, INPUT, WIDTH, rounds=10),
        slow_senders_rest(port, grpc_port, pid, MODEL, INPUT, WIDTH, count=64),
        slow_senders_grpc(port, grpc_port, pid, MODEL, INPUT, WIDTH, count=64),
        unread_answers_rest(port, pid, MODEL, INPUT, rows=1024, width=WIDTH, count=50, within_s=60, settle_s=15),
        zero_window_grpc(port, grpc_port, pid, MODEL, INPUT, rows=1024, width=WIDTH, count=50, settle_s=15),
    ]
