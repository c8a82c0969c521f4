"""hf:// and https:// fetches against a real HTTPS server behind a private CA (a stand-in for the Hub and for a
company's artifact server): the Secret's ca.crt verifies it, its HF_TOKEN reaches the Hub's endpoint and never the
host a redirect names (the Hub redirects downloads to a CDN)."""

from __future__ import annotations

import hashlib
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hack.controlplane import pki
from metainfer.agent.fetch import FetchError, fetch

PAYLOAD = b"model bytes " * 10_000
TOKEN = "hf_secret_token_value"


class _Hub(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/org/repo/resolve/v1.0/onnx/model.onnx":
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.end_headers()
                return
            self.send_response(302)
            self.send_header("Location", "/cdn/signed/model.onnx")
            self.end_headers()
        elif self.path == "/cdn/signed/model.onnx":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on loopback with a certificate from a private CA; (base URL, CA file)."""
    keys = pki.generate(tmp_path / "pki")
    cert, key = pki.issue_serving(keys.ca_cert, keys.ca_key, tmp_path / "tls" / "hub", "hub", ips=("127.0.0.1",))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("METAINFER_FETCH_ALLOW_CIDRS", "127.0.0.0/8")
    _Hub.seen = []
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", keys.ca_cert
    finally:
        server.shutdown()
        server.server_close()


def _secret(path: Path, **keys: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for key, value in keys.items():
        (path / key).write_text(value)
    return path


def test_the_hub_token_goes_to_the_hub_and_not_to_the_host_a_redirect_names(
    hub: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, ca = hub
    secret = _secret(tmp_path / "secret", HF_TOKEN=TOKEN, HF_ENDPOINT=base, **{"ca.crt": ca.read_text()})
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(secret))
    got = fetch("hf://org/repo@v1.0/onnx/model.onnx", tmp_path / "model.onnx",
                expected_sha256=hashlib.sha256(PAYLOAD).hexdigest(), namespace="ns", configmaps=None)  # fmt: skip
    assert got.read_bytes() == PAYLOAD
    assert _Hub.seen == [("/org/repo/resolve/v1.0/onnx/model.onnx", f"Bearer {TOKEN}"),
                         ("/cdn/signed/model.onnx", None)]  # fmt: skip

    no_token = _secret(tmp_path / "no-token", HF_ENDPOINT=base, **{"ca.crt": ca.read_text()})
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(no_token))
    with pytest.raises(FetchError, match="HTTP 401") as refused:
        fetch("hf://org/repo@v1.0/onnx/model.onnx", tmp_path / "again.onnx", expected_sha256=None, namespace="ns",
              configmaps=None)  # fmt: skip
    assert "hf://org/repo@v1.0/onnx/model.onnx" in str(refused.value) and TOKEN not in str(refused.value)


def test_an_https_uri_behind_a_private_ca_is_verified_by_the_secrets_ca_only(
    hub: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, ca = hub
    uri = f"{base}/cdn/signed/model.onnx"
    monkeypatch.delenv("METAINFER_STORE_CREDENTIALS", raising=False)
    with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(uri, tmp_path / "a", expected_sha256=None, namespace="ns", configmaps=None)
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(_secret(tmp_path / "ca", **{"ca.crt": ca.read_text()})))
    assert fetch(uri, tmp_path / "b", expected_sha256=None, namespace="ns", configmaps=None).read_bytes() == PAYLOAD
