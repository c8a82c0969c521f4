"""`metainfer serve` as a real process, driven by a real KServe v2 client (tritonclient's HTTP client).

No cluster: the server is started on a free loopback port, serving the digits
example (file:// URI, sha256 verified) with a dynamic-int8 recipe. Results are
compared with the same variant run directly in ONNX Runtime.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serve_harness import SERVED_RECIPE, ServeProcess, slow_model, start_serving  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from metainfer.agent.zoo import ExampleModel  # noqa: E402
from metainfer.core.engine.recipe import Recipe  # noqa: E402
from metainfer.core.engine.runtime import create_session  # noqa: E402
from metainfer.core.engine.transforms import build_variant  # noqa: E402

RECIPE = SERVED_RECIPE
LABELS = {"policy": "digits-policy", "hardware_class": "cls-test", "variant": "rk-test"}
MODEL = LABELS["policy"]


ENV = {"METAINFER_POLICY": LABELS["policy"], "METAINFER_CLASS": LABELS["hardware_class"],
       "METAINFER_RECIPE_KEY": LABELS["variant"]}  # fmt: skip


def _start(
    example: ExampleModel, log_dir: Path, *extra: str, ready: bool = True, shutdown_delay: float = 0.0
) -> ServeProcess:
    return start_serving(
        example, log_dir, "--drain-timeout", "10", *extra, env=ENV, ready=ready, shutdown_delay=shutdown_delay
    )


@pytest.fixture(scope="module")
def server(example: ExampleModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    served = _start(example, tmp_path_factory.mktemp("serve"))
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> Iterator[tritonhttp.InferenceServerClient]:
    c = tritonhttp.InferenceServerClient(server.address)
    yield c
    c.close()


@pytest.fixture(scope="module")
def samples(example: ExampleModel) -> np.ndarray:
    with np.load(example.data_path) as npz:
        return np.ascontiguousarray(npz["input"][:8], dtype=np.float32)


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("metainfer_")
    }


def _key(name: str, **extra: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({**LABELS, **extra}.items()))


def test_health_and_metadata(client: tritonhttp.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["name"] == MODEL and meta["platform"] == "onnxruntime" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


def test_results_equal_the_variant_run_directly(
    example: ExampleModel, client: tritonhttp.InferenceServerClient, samples: np.ndarray
) -> None:
    base = example.model_path.read_bytes()
    expected = create_session(build_variant(base, RECIPE.transform), RECIPE).run(None, {"input": samples})[0]
    # The client's defaults: binary input, binary outputs (binary_data_output).
    binary = tritonhttp.InferInput("input", list(samples.shape), "FP32")
    binary.set_data_from_numpy(samples)
    result = client.infer(MODEL, [binary], request_id="req-1")
    assert result.get_response()["id"] == "req-1"
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
    # Pure JSON both ways.
    plain = tritonhttp.InferInput("input", list(samples.shape), "FP32")
    plain.set_data_from_numpy(samples, binary_data=False)
    wanted = [tritonhttp.InferRequestedOutput("logits", binary_data=False)]
    result = client.infer(MODEL, [plain], outputs=wanted)
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("datatype", "shape", "needle"),
    [
        ("FP64", [2, 64], "datatype 'FP64' does not match the model's FP32"),
        ("FP32", [2, 63], "axis 1 has size 63, the model expects 64"),
        ("FP32", [65, 64], "batch 65 is larger than the allowed 64"),
    ],
)
def test_client_bad_requests_are_400(
    client: tritonhttp.InferenceServerClient, datatype: str, shape: list[int], needle: str
) -> None:
    data = np.zeros(shape, dtype=np.float64 if datatype == "FP64" else np.float32)
    tensor = tritonhttp.InferInput("input", shape, datatype)
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, [tensor])
    assert info.value.status() == "400"
    assert needle in info.value.message()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"inputs": [', "not valid JSON"),
        (b'{"inputs": []}', "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0]}]}', "unknown input"),
        (b'{"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0, 1]}]}', "2 elements"),
    ],
)
def test_malformed_http_is_400_and_server_survives(
    server: ServeProcess, client: tritonhttp.InferenceServerClient, body: bytes, needle: str
) -> None:
    status, doc = _post(f"{server.url}/v2/models/{MODEL}/infer", body)
    assert status == 400 and needle in doc["error"], doc
    assert client.is_server_live() and client.is_model_ready(MODEL)


def test_unknown_model_is_404(server: ServeProcess) -> None:
    status, doc = _post(f"{server.url}/v2/models/other/infer", b"{}")
    assert status == 404 and "unknown model 'other'" in doc["error"]


def test_metrics_count_requests_errors_and_latency(
    server: ServeProcess, client: tritonhttp.InferenceServerClient, samples: np.ndarray
) -> None:
    before = _metrics(server.url)
    tensor = tritonhttp.InferInput("input", list(samples.shape), "FP32")
    tensor.set_data_from_numpy(samples)
    for _ in range(5):
        client.infer(MODEL, [tensor])
    _post(f"{server.url}/v2/models/{MODEL}/infer", b"not json")
    after = _metrics(server.url)

    def delta(key: tuple[str, tuple[tuple[str, str], ...]]) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(_key("metainfer_inference_latency_seconds_count")) == 5
    assert delta(_key("metainfer_inference_requests_total")) == 6
    assert delta(_key("metainfer_inference_errors_total", code="400")) == 1
    assert delta(_key("metainfer_inference_latency_seconds_bucket", le="10.0")) == 5
    assert _key("metainfer_inference_latency_seconds_bucket", le="0.0005") in after  # ms-scale buckets
    info = [k for k in after if k[0] == "metainfer_serving_info"]
    assert len(info) == 1 and dict(info[0][1])["policy"] == LABELS["policy"] and after[info[0]] == 1


def test_sigterm_drains_the_request_in_flight_and_exits_0(example: ExampleModel, tmp_path: Path) -> None:
    served = _start(example, tmp_path, shutdown_delay=0)  # no delay: the drain starts at once, as before it existed
    try:
        with np.load(example.data_path) as npz:
            sample = npz["input"][:1].astype(np.float32)
        body = json.dumps(
            {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": sample.ravel().tolist()}]}
        ).encode()
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
            head = (
                f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            conn.sendall(head + body[:10])  # the request is now in flight: its handler waits for the body
            time.sleep(0.3)
            assert served.proc is not None
            served.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert served.proc.poll() is None, "exited with a request in flight"
            with pytest.raises(ConnectionRefusedError):  # no longer listening
                socket.create_connection(("127.0.0.1", served.port), timeout=5).close()
            conn.sendall(body[10:])
            response = b""
            while chunk := conn.recv(65536):
                response += chunk
        status_line, _, rest = response.partition(b"\r\n")
        assert b" 200 " in status_line, response
        doc = json.loads(rest.partition(b"\r\n\r\n")[2])
        assert doc["outputs"][0]["shape"] == [1, 10]
        assert served.proc.wait(timeout=15) == 0
    finally:
        served.stop()


def _request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict, str | None]:
    """One request on a new connection: status, JSON body, and the Connection header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Connection")
    finally:
        conn.close()


def _wait_signalled(served: ServeProcess) -> None:
    """Until serve's log says the signal came (its readiness no longer does: it holds until the drain)."""
    deadline = time.monotonic() + 5
    while "shutting down:" not in served.log.read_text():
        assert time.monotonic() < deadline, "no shutdown after SIGTERM"
        time.sleep(0.05)


def _infer_body(samples: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": samples[:1].ravel().tolist()}]}
    ).encode()


def test_during_the_shutdown_delay_new_connections_are_answered_and_readiness_holds(
    example: ExampleModel, tmp_path: Path, samples: np.ndarray
) -> None:
    """What a client routed by endpoints that still list a terminating pod gets: answers, each closing its
    connection so that the next request goes to a pod that stays; then the drain and exit 0. Readiness stays true
    until the drain: a terminating pod is out of the ready endpoints anyway, and its probe is what keeps it the
    *serving* fall-back kube-proxy uses when no other pod is ready."""
    served = _start(example, tmp_path, shutdown_delay=2)
    body = _infer_body(samples)
    infer = f"/v2/models/{MODEL}/infer"
    try:
        kept = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)  # a keep-alive client from before
        kept.request("POST", infer, body=body, headers={"Content-Type": "application/json"})
        before = kept.getresponse()
        assert before.status == 200 and before.getheader("Connection") != "close"
        expected = json.loads(before.read())["outputs"]
        assert served.proc is not None
        signalled = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        _wait_signalled(served)
        assert _request(served.port, "GET", "/v2/health/ready")[0] == 200
        assert _request(served.port, "GET", f"/v2/models/{MODEL}/ready")[0] == 200
        status, doc, connection = _request(served.port, "POST", infer, body)  # a new connection: still served
        assert (status, doc["outputs"], connection) == (200, expected, "close")
        kept.request("POST", infer, body=body, headers={"Content-Type": "application/json"})
        answer = kept.getresponse()  # the keep-alive connection gets its answer, and is closed after it
        assert answer.status == 200 and answer.getheader("Connection") == "close"
        assert json.loads(answer.read())["outputs"] == expected
        kept.close()
        assert served.proc.poll() is None, "exited during the delay"
        assert served.proc.wait(timeout=15) == 0
        assert time.monotonic() - signalled >= 2, "the drain started before the delay was over"
        log = served.log.read_text()
        assert "still answering new requests for 2 s" in log and "shutting down: draining" in log
    finally:
        served.stop()


def _answers_every(served: ServeProcess, body: bytes, seconds: float, interval: float = 0.2) -> list[int | str]:
    """A client that opens a connection for each request, every ``interval`` for ``seconds``: what it got."""
    got: list[int | str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            got.append(_request(served.port, "POST", f"/v2/models/{MODEL}/infer", body)[0])
        except OSError as exc:
            got.append(type(exc).__name__)
        time.sleep(interval)
    return got


def test_a_pod_still_routed_after_the_delay_answers_until_its_requests_stop(
    example: ExampleModel, tmp_path: Path, samples: np.ndarray
) -> None:
    """The only replica deleted: kube-proxy routes to it, terminating, until its replacement is Ready. Requests
    that still come after the delay keep it answering, and it drains once none has come for the delay."""
    served = _start(example, tmp_path, "--shutdown-delay-max", "30", shutdown_delay=1)
    try:
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        _wait_signalled(served)
        got = _answers_every(served, _infer_body(samples), 4.0)  # 4 s of requests against a delay of 1 s
        stopped = time.monotonic()
        assert set(got) == {200}, got
        assert _request(served.port, "GET", "/v2/health/ready")[0] == 200, "still routed: still serving"
        assert served.proc.wait(timeout=15) == 0
        quiet = time.monotonic() - stopped
        assert 0.5 <= quiet <= 4, f"drained {quiet:.1f} s after the last request, the delay being 1 s"
        assert "requests still come, so this pod is still routed" in served.log.read_text()
    finally:
        served.stop()


def test_requests_only_while_the_endpoints_converge_do_not_lengthen_the_delay(
    example: ExampleModel, tmp_path: Path, samples: np.ndarray
) -> None:
    """Another replica is Ready: kube-proxy stops routing here within a second of the signal, and the requests of
    that second must not keep the pod answering longer than the delay."""
    served = _start(example, tmp_path, "--shutdown-delay-max", "30", shutdown_delay=2)
    try:
        assert served.proc is not None
        signalled = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        _wait_signalled(served)
        assert set(_answers_every(served, _infer_body(samples), 0.5, interval=0.1)) == {200}
        assert served.proc.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 3.5, "lengthened by the requests of the endpoints' convergence"
        assert "still routed" not in served.log.read_text()
    finally:
        served.stop()


def test_a_pod_still_routed_drains_at_the_longest_delay(
    example: ExampleModel, tmp_path: Path, samples: np.ndarray
) -> None:
    served = _start(example, tmp_path, "--shutdown-delay-max", "2.5", shutdown_delay=1)
    try:
        assert served.proc is not None
        signalled = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        _wait_signalled(served)
        got = _answers_every(served, _infer_body(samples), 5.0)
        assert got[0] == 200 and "ConnectionRefusedError" in got, got  # answered, then no longer listening
        answered = got.index("ConnectionRefusedError")
        assert set(got[:answered]) == {200} and answered >= 8, got  # for about 2.5 s, every 0.2 s
        assert served.proc.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 10
        assert "requests still came" in served.log.read_text() and "draining now" in served.log.read_text()
    finally:
        served.stop()


def test_a_second_signal_cuts_the_shutdown_delay_short(example: ExampleModel, tmp_path: Path) -> None:
    served = _start(example, tmp_path, shutdown_delay=60)
    try:
        assert served.proc is not None
        served.proc.send_signal(signal.SIGTERM)
        _wait_signalled(served)
        served.proc.send_signal(signal.SIGINT)
        assert served.proc.wait(timeout=15) == 0
        assert "second signal: shutdown delay cut short" in served.log.read_text()
    finally:
        served.stop()


def test_a_sigterm_while_the_variant_builds_exits_0_at_once_without_finalising_under_the_load(
    tmp_path: Path,
) -> None:
    """A pod deleted while it still builds its variant (its rollout was replaced): serve leaves at once with 0,
    and leaves no temporary file behind (a stop during the load left a copy of the model each time).
    Finalising the interpreter while the load thread sat in ONNX Runtime's native code aborted 6 exits of 20."""
    model = tmp_path / "chain.onnx"
    model.write_bytes(slow_model(layers=3000, width=256))  # its int8 build takes about 9 s on 2 cores
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    served = ServeProcess(tmp_path)
    served.start(
        ["serve", "--model-uri", model.as_uri(), "--recipe-json", SERVED_RECIPE.model_dump_json(),
         "--host", "127.0.0.1", "--port", str(served.port)],
        {"TMPDIR": str(temporary)},
    )  # fmt: skip
    try:
        assert served.proc is not None
        deadline = time.monotonic() + 30
        while "building variant" not in served.log.read_text():
            assert served.proc.poll() is None and time.monotonic() < deadline, served.log.read_text()[-2000:]
            time.sleep(0.02)
        signalled = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=15) == 0, served.log.read_text()[-2000:]
        assert time.monotonic() - signalled < 4, "waited for the build it no longer needs"
        log = served.log.read_text()
        assert "exiting without waiting for the load" in log and "ready:" not in log, log[-2000:]
        assert not list(temporary.rglob("*")), "temporary files left behind"
    finally:
        served.stop()


def test_prebuilt_variant_must_match_the_recipe(example: ExampleModel, tmp_path: Path) -> None:
    other = Recipe.model_validate({"transform": {"quantization": {"mode": "fp16"}}})
    variant = tmp_path / "variant.onnx"
    variant.write_bytes(build_variant(example.model_path.read_bytes(), other.transform))
    served = _start(example, tmp_path, "--variant", str(variant), ready=False)
    try:
        assert served.proc is not None and served.proc.wait(timeout=30) == 2
        assert "was built with transform" in served.log.read_text()
    finally:
        served.stop()


def test_a_static_int8_rebuild_has_exactly_the_bytes_the_adaptation_built(
    example: ExampleModel, tmp_path: Path
) -> None:
    """The fallback when no variant store holds the file: serve rebuilds from the same calibration head as the
    Job (AdaptSettings.calibration_samples of the same NPZ) and must get the same sha256, else it refuses."""
    import hashlib

    from metainfer.core.engine.data import load_npz
    from metainfer.core.engine.modelinfo import inspect_model

    static = Recipe.model_validate({"transform": {"quantization": {"mode": "int8_static"}}, "batch": 4})
    info = inspect_model(example.model_path)
    calibration = load_npz(example.data_path, info).head(100)  # what the Job calibrates on (pipeline.Adaptation)
    built = build_variant(example.model_path.read_bytes(), static.transform, calibration)
    expected = hashlib.sha256(built).hexdigest()
    served = ServeProcess(tmp_path)
    served.start([
        "serve", "--model-uri", example.model_path.as_uri(), "--model-sha256", example.sha256,
        "--recipe-json", static.model_dump_json(), "--data-uri", example.data_path.as_uri(),
        "--calibration-samples", "100", "--variant-sha256", expected, "--host", "127.0.0.1",
        "--port", str(served.port),
    ], {})  # fmt: skip
    try:
        served.wait_ready()
        assert f"ready: variant sha256 {expected}" in served.log.read_text()
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("uri", "env", "says"),
    [
        (None, {"METAINFER_MAX_FETCH_BYTES": "1000"}, "exceed the 1000 byte cap (METAINFER_MAX_FETCH_BYTES)"),
        ("http://169.254.169.254/latest/model.onnx", {}, "169.254.169.254, a cloud metadata endpoint"),
        ("http://127.0.0.1:9/model.onnx", {}, "127.0.0.1, a loopback address"),
    ],
)
def test_a_model_over_the_cap_or_at_a_refused_address_exits_2_naming_why(
    example: ExampleModel, tmp_path: Path, uri: str | None, env: dict[str, str], says: str
) -> None:
    """Before, a model over the cap was copied (4 GiB) and then exited 1; any http(s) address was fetched."""
    served = ServeProcess(tmp_path)
    served.start([
        "serve", "--model-uri", uri or example.model_path.as_uri(), "--recipe-json", SERVED_RECIPE.model_dump_json(),
        "--host", "127.0.0.1", "--port", str(served.port),
    ], {**env, "METAINFER_FETCH_ALLOW_CIDRS": ""})  # fmt: skip
    assert served.proc is not None
    assert served.proc.wait(timeout=60) == 2
    assert says in served.log.read_text()
