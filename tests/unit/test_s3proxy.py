"""The test object store's configuration and its jar's fetch (hack/controlplane/s3proxy.py), without Java:
the store itself runs in tests/integration/test_object_store.py."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from hack.controlplane import pki, s3proxy
from hack.controlplane.errors import AssetError

RUNTIME = s3proxy.S3Proxy(Path("/usr/bin/java"), Path("/cache/s3proxy.jar"))


def _properties(store: s3proxy.ObjectStore) -> dict[str, str]:
    path = store.properties()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the secret key is in it
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_the_store_takes_one_access_key_and_serves_plain_http_without_a_certificate(tmp_path: Path) -> None:
    store = s3proxy.ObjectStore(RUNTIME, tmp_path, port=18001)
    found = _properties(store)
    assert found["s3proxy.authorization"] == "aws-v2-or-v4"
    assert (found["s3proxy.identity"], found["s3proxy.credential"]) == (
        store.credentials.access_key,
        store.credentials.secret_key,
    )
    assert found["s3proxy.endpoint"] == "http://127.0.0.1:18001" == store.endpoint
    assert "s3proxy.secure-endpoint" not in found
    assert found["jclouds.filesystem.basedir"] == str(store.buckets)
    assert store.command()[-4:] == ["-jar", "/cache/s3proxy.jar", "--properties", str(tmp_path / "s3proxy.conf")]


def test_with_a_certificate_the_store_serves_https_only_from_a_keystore_holding_that_certificate(
    tmp_path: Path,
) -> None:
    keys = pki.generate(tmp_path / "pki")
    cert, key = pki.issue_serving(keys.ca_cert, keys.ca_key, tmp_path / "tls", "s3", ips=("10.244.0.1",))
    store = s3proxy.ObjectStore(RUNTIME, tmp_path / "store", tls=(cert, key), host="10.244.0.1", port=18002)
    found = _properties(store)
    assert found["s3proxy.secure-endpoint"] == "https://10.244.0.1:18002" == store.endpoint
    assert "s3proxy.endpoint" not in found
    keystore = Path(found["s3proxy.keystore-path"])
    assert stat.S_IMODE(keystore.stat().st_mode) == 0o600
    _, served, _ = pkcs12.load_key_and_certificates(keystore.read_bytes(), found["s3proxy.keystore-password"].encode())
    assert served is not None and served.public_bytes(serialization.Encoding.PEM) == cert.read_bytes()


def _fake_mvn(tmp_path: Path, payload: bytes) -> tuple[Path, Path]:
    """A stand-in for Maven that writes ``payload`` as the jar where it is told and counts its calls."""
    calls = tmp_path / "mvn-calls"
    (tmp_path / "payload").write_bytes(payload)
    script = tmp_path / "mvn"
    script.write_text(
        "#!/bin/sh\n"
        f"echo call >> {calls}\n"
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done\n'
        f'cp {tmp_path / "payload"} "$out/{s3proxy.S3PROXY_JAR}"\n'
    )
    script.chmod(0o755)
    return script, calls


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("METAINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("METAINFER_JAVA", "/usr/bin/java")
    monkeypatch.delenv("METAINFER_S3PROXY_JAR", raising=False)
    return tmp_path / "cache"


def test_a_jar_that_is_not_the_pinned_one_is_refused_and_not_cached(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mvn, _ = _fake_mvn(tmp_path, b"not s3proxy")
    monkeypatch.setenv("METAINFER_MVN", str(mvn))
    with pytest.raises(AssetError, match="not the pinned"):
        s3proxy.provide(lambda _: None)
    assert not list((cache / "s3proxy" / s3proxy.S3PROXY_VERSION).glob("*.jar"))


def test_the_pinned_jar_is_fetched_once_then_found_in_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = b"a jar"
    mvn, calls = _fake_mvn(tmp_path, payload)
    monkeypatch.setenv("METAINFER_MVN", str(mvn))
    monkeypatch.setattr(s3proxy, "S3PROXY_SHA256", hashlib.sha256(payload).hexdigest())
    first = s3proxy.provide(lambda _: None)
    second = s3proxy.provide(lambda _: None)
    assert first == second and first.jar.read_bytes() == payload
    assert first.jar.parent == cache / "s3proxy" / s3proxy.S3PROXY_VERSION
    assert calls.read_text().count("call") == 1
