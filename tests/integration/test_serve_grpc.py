"""`metainfer serve`'s KServe v2 gRPC API as a real process, driven by a real client (tritonclient's gRPC client).

The same server answers REST and gRPC in one process: results must be the same bytes, errors the same messages,
and every gRPC request must land in the same Prometheus series as a REST one. No cluster: the digits example on
free loopback ports, as in test_serve.py.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
import tritonclient.http as tritonhttp
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import SERVED_RECIPE, ServeProcess, start_serving
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from metainfer.agent.zoo import ExampleModel

RECIPE = SERVED_RECIPE
MODEL = "digits"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def _start(example: ExampleModel, log_dir: Path, *extra: str, shutdown_delay: float = 0.0) -> ServeProcess:
    return start_serving(example, log_dir, *extra, model_name=MODEL, grpc=True, shutdown_delay=shutdown_delay)


@pytest.fixture(scope="module")
def server(example: ExampleModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    served = _start(example, tmp_path_factory.mktemp("serve"))
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> Iterator[tritongrpc.InferenceServerClient]:
    c = tritongrpc.InferenceServerClient(server.grpc_address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def samples(example: ExampleModel) -> np.ndarray:
    with np.load(example.data_path) as npz:
        return np.ascontiguousarray(npz["input"][:8], dtype=np.float32)


def _tensor(array: np.ndarray, datatype: str = "FP32") -> tritongrpc.InferInput:
    tensor = tritongrpc.InferInput("input", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _metrics(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("metainfer_"):
                key = (s.name, s.labels.get("code") or s.labels.get("reason") or s.labels.get("le") or "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def _delta(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], name: str, label: str = ""
) -> float:
    return after.get((name, label), 0.0) - before.get((name, label), 0.0)


def test_health_and_metadata(client: tritongrpc.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert client.is_model_ready(MODEL, model_version="1")
    assert client.get_server_metadata().name == "metainfer"
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert meta["name"] == MODEL and meta["platform"] == "onnxruntime" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]  # int64 as JSON strings
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]}]
    for call in (lambda: client.is_model_ready("other"), lambda: client.get_model_metadata(MODEL, "2")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as info:  # the model repository extension: one variant, fixed
        client.load_model(MODEL)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"


def test_results_are_bit_identical_to_rest(
    server: ServeProcess, client: tritongrpc.InferenceServerClient, samples: np.ndarray
) -> None:
    rest = tritonhttp.InferenceServerClient(server.address)
    try:
        binary = tritonhttp.InferInput("input", list(samples.shape), "FP32")
        binary.set_data_from_numpy(samples)
        expected = rest.infer(MODEL, [binary]).as_numpy("logits")
    finally:
        rest.close()
    result = client.infer(MODEL, [_tensor(samples)], request_id="req-7")  # raw_input_contents, the client's way
    assert result.get_response().id == "req-7" and result.get_response().model_version == "1"
    logits = result.as_numpy("logits")
    assert logits.dtype == expected.dtype and logits.tobytes() == expected.tobytes()

    # Typed contents instead of raw bytes, and an explicitly requested output: the same bytes back.
    request = service_pb2.ModelInferRequest(model_name=MODEL, outputs=[{"name": "logits"}])
    tensor = request.inputs.add(name="input", datatype="FP32", shape=samples.shape)
    tensor.contents.fp32_contents.extend(samples.ravel().tolist())
    with grpc.insecure_channel(server.grpc_address) as channel:
        infer = channel.unary_unary(
            INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        response = infer(request, timeout=10)
    assert [o.name for o in response.outputs] == ["logits"] and list(response.outputs[0].shape) == [8, 10]
    assert response.raw_output_contents[0] == expected.tobytes()


@pytest.mark.parametrize(
    ("model", "datatype", "shape", "code", "needle"),
    [
        ("other", "FP32", [2, 64], "NOT_FOUND", "unknown model 'other'"),
        (MODEL, "FP32", [2, 63], "INVALID_ARGUMENT", "input 'input': axis 1 has size 63, the model expects 64"),
        (MODEL, "FP64", [2, 64], "INVALID_ARGUMENT", "input 'input': datatype 'FP64' does not match the model's FP32"),
        (MODEL, "FP32", [65, 64], "INVALID_ARGUMENT", "input 'input': batch 65 is larger than the allowed 64"),
    ],
)
def test_errors_have_the_protocols_codes_and_rests_messages(
    client: tritongrpc.InferenceServerClient, model: str, datatype: str, shape: list[int], code: str, needle: str
) -> None:
    data = np.zeros(shape, dtype=np.float64 if datatype == "FP64" else np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [_tensor(data, datatype)])
    assert info.value.status() == f"StatusCode.{code}"
    assert needle in info.value.message()
    assert client.is_server_live() and client.is_model_ready(MODEL)


def _rest_limit(server: ServeProcess) -> int:
    """The model's request size limit, as REST's 413 names it."""
    head = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 30}\r\n\r\n"
    status, text = _raw_rest(server, head.encode())
    assert status == 413, text
    return int(re.search(r"request larger than (\d+) bytes", text).group(1))  # type: ignore[union-attr]


def _raw_rest(server: ServeProcess, data: bytes, leave: bool = False) -> tuple[int, str]:
    """Send ``data`` on a new connection; the status and body of the answer (0 and "" when ``leave``: the
    connection is closed without waiting for one)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        if leave:
            time.sleep(0.2)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST: gone, not done
            return 0, ""
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _content_length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def _content_length(answer: bytes) -> int:
    match = re.search(rb"(?i)content-length: (\d+)", answer)
    return int(match.group(1)) if match else 0


def _rest_infer(body: bytes, model: str = MODEL, declared: int | None = None) -> bytes:
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
    )
    return head.encode() + body


def _json_body(shape: list[int], datatype: str = "FP32", request_id: str = "") -> bytes:
    count = int(np.prod(shape))
    doc = {"id": request_id, "inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": [0] * count}]}
    return json.dumps(doc).encode()


def _grpc_message(shape: list[int], datatype: str = "FP32", model: str = MODEL, request_id: str = "") -> bytes:
    data = np.zeros(shape, np.float64 if datatype == "FP64" else np.float32)
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id, raw_input_contents=[data.tobytes()])
    request.inputs.add(name="input", datatype=datatype, shape=shape)
    return bytes(request.SerializeToString())


def _grpc_bytes(server: ServeProcess, message: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(server.grpc_address, options=[("grpc.max_send_message_length", -1)]) as channel:
        infer = channel.unary_unary(INFER)  # bytes in and out: a malformed message is sent as it is
        try:
            infer(message, timeout=10)
        except grpc.RpcError as error:
            return error.code()  # type: ignore[attr-defined, no-any-return]
    return grpc.StatusCode.OK


def _counted(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, float]:
    """The error codes and abort reasons that moved between two scrapes, and by how much."""
    moved: dict[str, float] = {}
    for (name, label), value in after.items():
        if name in (
            "metainfer_inference_errors_total",
            "metainfer_inference_aborted_total",
            "metainfer_inference_requests_total",
        ):
            delta = value - before.get((name, label), 0.0)
            if delta:
                moved[f"{name.removeprefix('metainfer_inference_')}{{{label}}}"] = delta
    return moved


def _settled(server: ServeProcess, before: dict[tuple[str, str], float], events: int) -> dict[str, float]:
    """The deltas once every event has been counted (the server learns of a client that left a moment later)."""
    deadline = time.monotonic() + 10
    while True:
        moved = _counted(before, _metrics(server.url))
        answered = sum(value for key, value in moved.items() if key.startswith("errors_total"))
        if answered >= events or time.monotonic() > deadline:
            return moved
        time.sleep(0.1)


def test_the_same_bad_requests_are_counted_alike_over_rest_and_grpc(example: ExampleModel, tmp_path: Path) -> None:
    """One mix of bad requests over each protocol moves the same error codes and abort reasons by the same counts.

    Before, a gRPC message over the model's limit was counted as a client that left (499, client_disconnect)
    where REST counts 413."""
    served = _start(example, tmp_path, "--body-timeout", "1")
    try:
        limit = _rest_limit(served)
        over = "x" * (limit + 4096)  # past the model's limit, within gRPC's own
        rest_events = [
            _rest_infer(_json_body([1, 64]), model="other"),
            _rest_infer(_json_body([2, 63])),
            _rest_infer(_json_body([2, 64], "FP64")),
            _rest_infer(_json_body([65, 64])),
            _rest_infer(b"\x08\xff\xff not a request"),
            _rest_infer(_json_body([1, 64], request_id=over)),
            _rest_infer(b"{", declared=100),  # the rest of the body never comes: 408
        ]
        grpc_events = [
            _grpc_message([1, 64], model="other"),
            _grpc_message([2, 63]),
            _grpc_message([2, 64], "FP64"),
            _grpc_message([65, 64]),
            b"\x08\xff\xff not a request",
            _grpc_message([1, 64], request_id=over),
        ]
        before = _metrics(served.url)
        rest_status = [_raw_rest(served, data)[0] for data in rest_events]
        _raw_rest(served, _rest_infer(b"{", declared=100), leave=True)  # leaves before its body is done
        rest = _settled(served, before, len(rest_events) + 1)
        assert rest_status == [404, 400, 400, 400, 400, 413, 408]

        before = _metrics(served.url)
        grpc_status = [_grpc_bytes(served, data) for data in grpc_events]
        slow = SlowCall(served.grpc_address, _one_request(example), timeout=30)  # its message never comes: 408
        with pytest.raises(grpc.RpcError) as error:
            slow.future.result(timeout=10)
        slow.close()
        grpc_status.append(error.value.code())  # type: ignore[attr-defined]
        gone = SlowCall(served.grpc_address, _one_request(example), timeout=0.3)  # leaves before its message
        with pytest.raises(grpc.RpcError):
            gone.future.result(timeout=10)
        gone.close()
        over_grpc = _settled(served, before, len(grpc_events) + 2)
        code = grpc.StatusCode
        assert grpc_status == [
            code.NOT_FOUND,
            *[code.INVALID_ARGUMENT] * 4,
            code.RESOURCE_EXHAUSTED,
            code.DEADLINE_EXCEEDED,
        ]
        assert over_grpc == rest, f"REST counted {rest}, gRPC {over_grpc}"
        assert rest["errors_total{413}"] == 1 and rest["aborted_total{client_disconnect}"] == 1
        assert "Traceback" not in served.log.read_text()
    finally:
        served.stop()


def test_a_message_of_more_than_twice_the_limit_is_refused_by_grpc_before_it_is_read(
    server: ServeProcess, client: tritongrpc.InferenceServerClient
) -> None:
    """gRPC refuses it from its length prefix and tells the handler only that no message came: it is counted as a
    client that left (see grpc_server._NoMessage), and the server goes on."""
    limit = _rest_limit(server)
    before = _metrics(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [_tensor(np.zeros((1, 64), np.float32))], request_id="x" * (2 * limit + 1))
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "larger than max" in info.value.message()
    assert client.infer(MODEL, [_tensor(np.zeros((64, 64), np.float32))]).as_numpy("logits").shape == (64, 10)
    after = _settled(server, before, 1)
    assert after["requests_total{}"] == 2 and after["errors_total{499}"] == 1


def test_grpc_requests_are_counted_with_rests(
    server: ServeProcess, client: tritongrpc.InferenceServerClient, samples: np.ndarray
) -> None:
    before = _metrics(server.url)
    for _ in range(5):
        client.infer(MODEL, [_tensor(samples)])
    for model, shape in (("other", [1, 64]), (MODEL, [1, 63])):
        with pytest.raises(InferenceServerException):
            client.infer(model, [_tensor(np.zeros(shape, np.float32))])
    after = _metrics(server.url)
    assert _delta(before, after, "metainfer_inference_requests_total") == 7
    assert _delta(before, after, "metainfer_inference_errors_total", "404") == 1
    assert _delta(before, after, "metainfer_inference_errors_total", "400") == 1
    for histogram in ("latency", "queue", "compute"):
        assert _delta(before, after, f"metainfer_inference_{histogram}_seconds_count") == 5, histogram
    assert _delta(before, after, "metainfer_inference_latency_seconds_bucket", "10.0") == 5


class SlowCall:
    """A ModelInfer call whose message is held back: the call is open on the server (its headers arrived), the
    request arrives only when ``send`` is called. Client streaming on the unary method: the bytes on the wire are
    the same."""

    def __init__(self, address: str, request: service_pb2.ModelInferRequest, timeout: float = 30) -> None:
        self.channel = grpc.insecure_channel(address)
        self._messages: queue.Queue[service_pb2.ModelInferRequest | None] = queue.Queue()
        self._request = request
        infer = self.channel.stream_unary(
            INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        self.future = infer.future(iter(self._messages.get, None), timeout=timeout)

    def send(self) -> None:
        self._messages.put(self._request)
        self._messages.put(None)

    def close(self) -> None:
        self._messages.put(None)
        self.channel.close()


def _one_request(example: ExampleModel) -> service_pb2.ModelInferRequest:
    with np.load(example.data_path) as npz:
        sample = np.ascontiguousarray(npz["input"][:1], dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name=MODEL, raw_input_contents=[sample.tobytes()])
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    return request


def test_during_the_shutdown_delay_new_calls_are_answered_and_readiness_holds(
    example: ExampleModel, tmp_path: Path, samples: np.ndarray
) -> None:
    served = _start(example, tmp_path, "--drain-timeout", "10", shutdown_delay=2)
    before = tritongrpc.InferenceServerClient(served.grpc_address)
    try:
        expected = before.infer(MODEL, [_tensor(samples)]).as_numpy("logits")
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while "shutting down:" not in served.log.read_text():
            assert time.monotonic() < deadline, "no shutdown after SIGTERM"
            time.sleep(0.05)
        assert before.is_server_ready() and before.is_model_ready(MODEL)  # as REST's: until the drain
        late = tritongrpc.InferenceServerClient(served.grpc_address)  # a new channel: a new connection
        try:
            assert late.infer(MODEL, [_tensor(samples)]).as_numpy("logits").tobytes() == expected.tobytes()
        finally:
            late.close()
        assert before.infer(MODEL, [_tensor(samples)]).as_numpy("logits").tobytes() == expected.tobytes()
        assert served.proc.poll() is None, "exited during the delay"
        assert served.proc.wait(timeout=15) == 0
        log = served.log.read_text()
        assert log.index("still answering new requests for 2 s") < log.index("gRPC: draining")
    finally:
        before.close()
        served.stop()


def test_sigterm_refuses_new_calls_and_drains_the_one_in_flight(example: ExampleModel, tmp_path: Path) -> None:
    served = _start(example, tmp_path, "--drain-timeout", "10")  # no shutdown delay: new calls refused at once
    slow = SlowCall(served.grpc_address, _one_request(example))
    try:
        time.sleep(0.5)  # the call is open on the server, its message not sent
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert served.proc.poll() is None, "exited with a call in flight"
        late = tritongrpc.InferenceServerClient(served.grpc_address)
        with pytest.raises(InferenceServerException) as info:
            late.is_server_live()
        assert info.value.status() == "StatusCode.UNAVAILABLE"  # clients retry on another replica
        late.close()
        slow.send()  # the call in flight is still answered
        response = slow.future.result(timeout=10)
        assert list(response.outputs[0].shape) == [1, 10] and len(response.raw_output_contents[0]) == 40
        assert served.proc.wait(timeout=15) == 0
        assert "gRPC: draining" in served.log.read_text()
    finally:
        slow.close()
        served.stop()


def test_a_grpc_call_cut_by_the_drain_timeout_is_counted_and_exits_3(example: ExampleModel, tmp_path: Path) -> None:
    served = _start(example, tmp_path, "--drain-timeout", "1")
    slow = SlowCall(served.grpc_address, _one_request(example))
    try:
        time.sleep(0.5)
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=15) == 3
        assert "gRPC drain timeout after 1 s: 1 call(s) still in flight are cut" in served.log.read_text()
        with pytest.raises(grpc.RpcError) as info:
            slow.future.result(timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    finally:
        slow.close()
        served.stop()


def test_admission_and_the_body_timeout_are_rests(example: ExampleModel, tmp_path: Path) -> None:
    """--max-queue 1: a REST upload still arriving holds no slot (admission counts complete requests), so a gRPC
    request is answered meanwhile; a gRPC call whose message does not come within --body-timeout is answered as
    REST's 408 would be. (Before, the upload held the one slot and the gRPC request was refused.)"""
    served = _start(example, tmp_path, "--max-queue", "1", "--body-timeout", "3")
    slow: SlowCall | None = None
    try:
        body = b'{"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [' + b"0," * 63 + b"0]}]}"
        head = (
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", served.port)) as holder:
            holder.sendall(head + body[:10])  # waiting for the rest of its body
            time.sleep(0.3)
            with grpc.insecure_channel(served.grpc_address) as channel:
                infer = channel.unary_unary(
                    INFER,
                    request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                    response_deserializer=service_pb2.ModelInferResponse.FromString,
                )
                answered = infer(_one_request(example), timeout=10)
            assert list(answered.outputs[0].shape) == [1, 10]
        before = _metrics(served.url)
        slow = SlowCall(served.grpc_address, _one_request(example))
        with pytest.raises(grpc.RpcError) as error:
            slow.future.result(timeout=10)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert "request message not received within 3 s" in error.value.details()  # type: ignore[attr-defined]
        assert _delta(before, _metrics(served.url), "metainfer_inference_errors_total", "408") == 1
        # A client that gives up frees the one slot when it goes, not when the body timeout would have.
        gone = SlowCall(served.grpc_address, _one_request(example), timeout=0.3)
        with pytest.raises(grpc.RpcError):
            gone.future.result(timeout=10)
        gone.close()
        client = tritongrpc.InferenceServerClient(served.grpc_address)
        deadline = time.monotonic() + 1.5  # the server hears of the cancellation a moment after the client
        while True:
            try:
                assert client.infer(MODEL, [_tensor(np.zeros((1, 64), np.float32))]).as_numpy("logits").shape == (1, 10)
                break
            except InferenceServerException as exc:
                assert "busy" in exc.message() and time.monotonic() < deadline, exc
                time.sleep(0.05)
        client.close()
    finally:
        if slow is not None:
            slow.close()
        served.stop()


def test_a_client_that_gives_up_is_counted_as_gone(server: ServeProcess, example: ExampleModel) -> None:
    before = _metrics(server.url)
    slow = SlowCall(server.grpc_address, _one_request(example), timeout=0.5)
    try:
        with pytest.raises(grpc.RpcError) as error:
            slow.future.result(timeout=10)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    finally:
        slow.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the server learns of the cancellation a moment after the client
        after = _metrics(server.url)
        if _delta(before, after, "metainfer_inference_aborted_total", "client_disconnect"):
            break
        time.sleep(0.1)
    assert _delta(before, after, "metainfer_inference_aborted_total", "client_disconnect") == 1
    assert _delta(before, after, "metainfer_inference_errors_total", "499") == 1
    assert "Traceback" not in server.log.read_text()


def test_grpc_off_opens_no_port(example: ExampleModel, tmp_path: Path) -> None:
    served = ServeProcess(tmp_path)  # grpc=False: --grpc-port 0
    served.start([
        "serve", "--model-uri", example.model_path.as_uri(), "--model-sha256", example.sha256,
        "--recipe-json", RECIPE.model_dump_json(), "--host", "127.0.0.1", "--port", str(served.port),
    ], {})  # fmt: skip
    try:
        served.wait_ready()
        assert "gRPC" not in served.log.read_text()
    finally:
        served.stop()


def test_a_taken_grpc_port_fails_the_start_with_a_message(
    server: ServeProcess, example: ExampleModel, tmp_path: Path
) -> None:
    second = ServeProcess(tmp_path)
    second.grpc_port = server.grpc_port  # already listening there
    second.start([
        "serve", "--model-uri", example.model_path.as_uri(), "--model-sha256", example.sha256,
        "--recipe-json", RECIPE.model_dump_json(), "--host", "127.0.0.1", "--port", str(second.port),
    ], {})  # fmt: skip
    try:
        assert second.proc is not None and second.proc.wait(timeout=60) == 1
        assert f"cannot listen for gRPC on 127.0.0.1:{server.grpc_port}" in second.log.read_text()
    finally:
        second.stop()
