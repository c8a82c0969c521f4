"""``metainfer serve`` of a decoder, from a client's seat: OpenAI-compatible completions and chat, streamed and
whole, reproducible with a seed, batched across clients without changing anyone's tokens, bounded by its KV cache
(429 with Retry-After beyond the queue), and a client that leaves frees what it held."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from serve_harness import ServeProcess

from metainfer.agent.zoo.decoder import build_tiny_decoder
from metainfer.core.engine.decoder.engine import GenerationEngine, GenerationRequest
from metainfer.core.engine.decoder.sampling import SamplingParams
from metainfer.core.engine.decoder.signature import detect
from metainfer.core.engine.decoder.stepper import DecoderStepper
from metainfer.core.engine.decoder.tokenizer import carried_tokenizer
from metainfer.core.engine.recipe import Recipe


@pytest.fixture(scope="module")
def decoder_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("decoder") / "tiny.onnx"
    path.write_bytes(build_tiny_decoder())
    return path


def _serve(path: Path, log_dir: Path, *extra: str) -> ServeProcess:
    served = ServeProcess(log_dir)
    served.start(["serve", "--model-uri", path.as_uri(), "--recipe-json", Recipe().model_dump_json(),
                  "--host", "127.0.0.1", "--port", str(served.port), "--model-name", "tiny", *extra], {})  # fmt: skip
    served.wait_ready()
    return served


@pytest.fixture(scope="module")
def server(decoder_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    served = _serve(decoder_file, tmp_path_factory.mktemp("serve"))
    try:
        yield served
    finally:
        served.stop()


def _post(server: ServeProcess, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def _stream(server: ServeProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    events = [line[6:] for line in response.read().decode().split("\n") if line.startswith("data: ")]
    connection.close()
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def _in_process_greedy(path: Path, prompt: str, max_tokens: int) -> str:
    model = onnx.load(path)
    codec = carried_tokenizer({p.key: p.value for p in model.metadata_props})
    signature = detect(model)
    assert codec is not None and signature is not None
    stepper = DecoderStepper(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), signature)
    engine = GenerationEngine(stepper, cache_budget_tokens=4096, max_context=512)
    engine.admit(GenerationRequest("x", codec.encode(prompt), max_tokens, SamplingParams(temperature=0.0),
                                   stop_ids=codec.stop_ids))  # fmt: skip
    tokens: list[int] = []
    while engine.running:
        tokens += [e.token for e in engine.iterate() if e.token is not None and e.token not in codec.stop_ids]
    return codec.decode(tokens)


def test_models_and_a_greedy_completion_equal_to_the_model_run_in_process(
    server: ServeProcess, decoder_file: Path
) -> None:
    assert [m["id"] for m in _get(server, "/v1/models")["data"]] == ["tiny"]
    status, answer, _ = _post(server, "/v1/completions", {"model": "tiny", "prompt": "Hello, world",
                                                           "max_tokens": 12, "temperature": 0})  # fmt: skip
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert choice["text"] == _in_process_greedy(decoder_file, "Hello, world", 12)
    assert choice["finish_reason"] in ("length", "stop") and answer["object"] == "text_completion"
    assert answer["usage"]["prompt_tokens"] == len(b"Hello, world") and answer["usage"]["completion_tokens"] <= 12


def _get(server: ServeProcess, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(server.url + path, timeout=30) as response:
        return dict(json.loads(response.read()))


def test_a_streamed_chat_is_the_whole_answer_in_pieces_and_a_seed_repeats_it(server: ServeProcess) -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
            "max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": 11}  # fmt: skip
    status, whole, _ = _post(server, "/v1/chat/completions", body)
    assert status == 200, whole
    message = whole["choices"][0]["message"]
    assert message["role"] == "assistant" and whole["object"] == "chat.completion"
    chunks = _stream(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == message["content"]
    assert chunks[-1]["usage"] == whole["usage"] and chunks[-2]["choices"][0]["finish_reason"] is not None
    assert _post(server, "/v1/chat/completions", body)[1]["choices"] == whole["choices"]
    other = _post(server, "/v1/chat/completions", {**body, "seed": 12})[1]["choices"][0]["message"]["content"]
    assert other != message["content"]


def test_clients_decoding_together_each_get_what_they_get_alone(server: ServeProcess, decoder_file: Path) -> None:
    prompts = [f"prompt number {i} " * (1 + i % 3) for i in range(8)]
    answers: dict[int, str] = {}

    def ask(index: int) -> None:
        status, answer, _ = _post(server, "/v1/completions", {"prompt": prompts[index], "max_tokens": 10,
                                                               "temperature": 0})  # fmt: skip
        assert status == 200, answer
        answers[index] = answer["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {i: _in_process_greedy(decoder_file, p, 10) for i, p in enumerate(prompts)}


def test_a_stop_string_ends_the_text_before_it(server: ServeProcess) -> None:
    free = _post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 24, "temperature": 0})[1]
    text = free["choices"][0]["text"]
    stop = text[5:7]
    assert len(stop) == 2
    cut = _post(server, "/v1/completions", {"prompt": "abc", "max_tokens": 24, "temperature": 0, "stop": [stop]})[1]
    assert cut["choices"][0] == {**cut["choices"][0], "text": text[: text.index(stop)], "finish_reason": "stop"}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"prompt": "x", "n": 2}, 400, "n: not supported"),
        ({"prompt": "x", "logprobs": 3}, 400, "logprobs: not supported"),
        ({"prompt": "x", "temperature": 3}, 400, "temperature"),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"prompt": "x" * 600, "max_tokens": 4}, 400, "context of 512 tokens"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "not served here"),
        ({"messages": []}, 400, "messages"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_requests_this_server_cannot_serve_as_sent_are_refused_naming_the_field(
    server: ServeProcess, body: Any, status: int, words: str
) -> None:
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    got, answer, _ = _post(server, path, body)
    assert got == status and words in answer["error"]["message"], answer


def _metric(server: ServeProcess, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_beyond_the_cache_and_the_queue_clients_get_429_and_one_that_leaves_frees_its_cache(
    decoder_file: Path, tmp_path: Path
) -> None:
    # 1 MiB of cache at 512 bytes a token: 2048 tokens, four requests of 500; a queue of two.
    served = _serve(decoder_file, tmp_path, "--kv-cache-mib", "1", "--max-queue", "2", "--max-generating", "4")
    try:
        results: list[tuple[int, dict[str, str]]] = []

        def ask() -> None:
            status, _, headers = _post(served, "/v1/completions", {"prompt": "go", "max_tokens": 498,
                                                                    "temperature": 0})  # fmt: skip
            results.append((status, headers))

        threads = [threading.Thread(target=ask) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        statuses = sorted(status for status, _ in results)
        assert statuses.count(200) >= 6 and set(statuses) == {200, 429}, statuses
        assert all(h.get("Retry-After") == "1" for s, h in results if s == 429)

        connection = socket.create_connection(("127.0.0.1", served.port))
        body = json.dumps({"prompt": "go", "max_tokens": 498, "temperature": 0, "stream": True}).encode()
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        connection.settimeout(30)
        received = b""
        while b"data: " not in received:  # the headers may come first, alone
            chunk = connection.recv(4096)
            assert chunk, "the server closed the stream before its first event"
            received += chunk
        assert _metric(served, "metainfer_generation_kv_cache_reserved_tokens") == 500
        connection.close()
        deadline = time.monotonic() + 10
        while _metric(served, "metainfer_generation_kv_cache_reserved_tokens") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(served, "metainfer_generation_kv_cache_reserved_tokens") == 0
        assert _metric(served, "metainfer_generation_time_to_first_token_seconds_count") >= 6
        # The serving series canaries and drift read: per output token for a decoder; requests and 429s counted.
        assert _metric(served, "metainfer_inference_latency_seconds_count") >= 6 * 400
        assert _metric(served, "metainfer_inference_compute_seconds_count") >= 6 * 400
        assert _metric(served, "metainfer_inference_requests_total") == 13
        assert served.proc is not None and served.proc.poll() is None
    finally:
        served.stop()


def test_a_decoder_without_a_tokenizer_fails_its_load_saying_how_to_give_it_one(tmp_path: Path) -> None:
    path = tmp_path / "bare.onnx"
    path.write_bytes(build_tiny_decoder(with_tokenizer=False))
    served = ServeProcess(tmp_path)
    served.start(["serve", "--model-uri", path.as_uri(), "--recipe-json", Recipe().model_dump_json(),
                  "--host", "127.0.0.1", "--port", str(served.port)], {})  # fmt: skip
    assert served.proc is not None and served.proc.wait(60) == 2
    assert "carries no tokenizer" in served.log.read_text() and "llm-pack" in served.log.read_text()


def test_a_request_that_waits_its_deadline_for_cache_gets_503_with_retry_after(
    decoder_file: Path, tmp_path: Path
) -> None:
    served = _serve(decoder_file, tmp_path, "--kv-cache-mib", "1", "--max-generating", "4", "--request-timeout",
                    "0.2")  # fmt: skip
    try:
        results: list[tuple[int, dict[str, Any], dict[str, str]]] = []

        def ask(tokens: int) -> None:
            results.append(_post(served, "/v1/completions", {"prompt": "go", "max_tokens": tokens, "temperature": 0}))

        holders = [threading.Thread(target=ask, args=(498,)) for _ in range(4)]
        for thread in holders:
            thread.start()
        deadline = time.monotonic() + 10
        while _metric(served, "metainfer_generation_kv_cache_reserved_tokens") < 2000 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, answer, headers = _post(served, "/v1/completions", {"prompt": "late", "max_tokens": 8})
        for thread in holders:
            thread.join(60)
        assert status == 503 and headers.get("Retry-After") == "1", (status, answer)
        assert "for KV cache" in answer["error"]["message"] and answer["error"]["type"] == "timeout"
        assert sorted(s for s, _, _ in results) == [200] * 4
    finally:
        served.stop()
