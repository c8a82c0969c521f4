"""Model and data URIs may not reach loopback, link-local, metadata or other non-routable addresses unless the
platform allows a CIDR; the file cap is checked before a byte is copied."""

from __future__ import annotations

import http.server
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from metainfer.agent.fetch import FetchError, fetch
from metainfer.agent.fetch_guard import ALLOW_ENV, allowed_networks, refusal


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.10.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),  # an IPv4-mapped address is judged as its IPv4 address
    ],
)
def test_non_routable_addresses_are_refused_with_the_reason(address: str, why: str) -> None:
    reason = refusal(ipaddress.ip_address(address), ())
    assert reason is not None and why in reason


@pytest.mark.parametrize("address", ["10.0.0.7", "172.16.3.4", "192.168.1.1", "8.8.8.8", "fc00::5"])
def test_routable_and_private_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), ()) is None


def test_an_allowed_cidr_lifts_the_refusal_and_a_bad_one_is_named() -> None:
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed_networks("127.0.0.0/8, 10.0.0.0/8")) is None
    with pytest.raises(ValueError, match="'nope' is not a CIDR"):
        allowed_networks("10.0.0.0/8,nope")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.2:{self.server.server_address[1]}/model.onnx")
            self.end_headers()
            return
        body = b"model bytes"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def _fetch(uri: str, tmp_path: Path) -> Path:
    return fetch(uri, tmp_path / "model.onnx", expected_sha256=None, namespace="default", configmaps=None)


def test_a_loopback_uri_is_refused_naming_the_address_unless_allowed(
    port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(FetchError) as refused:
        _fetch(f"http://127.0.0.1:{port}/model.onnx", tmp_path)
    assert "127.0.0.1, a loopback address" in str(refused.value) and not refused.value.transient
    assert not (tmp_path / "model.onnx").exists()
    monkeypatch.setenv(ALLOW_ENV, "127.0.0.1/32")
    assert _fetch(f"http://127.0.0.1:{port}/model.onnx", tmp_path).read_bytes() == b"model bytes"


def test_a_redirect_to_a_refused_address_is_refused(port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "127.0.0.1/32")  # the first hop is allowed, the redirect's target is not
    with pytest.raises(FetchError, match=r"127\.0\.0\.2, a loopback address"):
        _fetch(f"http://127.0.0.1:{port}/redirect", tmp_path)


def test_a_file_over_the_cap_is_refused_before_it_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "big.onnx"
    source.write_bytes(b"x" * 2048)
    monkeypatch.setenv("METAINFER_MAX_FETCH_BYTES", "1024")
    dest = tmp_path / "out" / "model.onnx"
    with pytest.raises(FetchError, match="2048 bytes exceed the 1024 byte cap") as refused:
        fetch(source.as_uri(), dest, expected_sha256=None, namespace="default", configmaps=None)
    assert not refused.value.transient and not dest.exists()
