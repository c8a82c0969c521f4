"""The tests' S3-compatible object store (hack/controlplane/objectstore.py): a real SeaweedFS whose buckets are
private, read and written through obstore, the S3 client the agent will use (issue 28 item 3).

obstore (Rust's object_store behind a Python API) rather than s3fs: s3fs needs botocore, which pins
python-dateutil<3 while the kubernetes client 37 needs >=3, so s3fs cannot live in the image beside it.
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.controlplane import objectstore, pki
from hack.controlplane.errors import AssetError

obstore = pytest.importorskip("obstore")  # the dev extra's
from obstore.store import S3Store  # noqa: E402  (after the importorskip that guards it)

BUCKET = "models"


def _log(message: str) -> None:
    print(f"[object-store] {message}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def weed() -> Path:
    try:
        return objectstore.provide(_log)
    except AssetError as exc:
        pytest.fail(f"cannot provide SeaweedFS {objectstore.SEAWEEDFS_VERSION}: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def store(weed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.ObjectStore]:
    started = objectstore.ObjectStore(weed, tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield started
    finally:
        started.stop()


def _client(store: objectstore.ObjectStore, secret_key: str | None = None) -> S3Store:
    return S3Store(
        BUCKET,
        endpoint=store.endpoint,
        access_key_id=store.credentials.access_key,
        secret_access_key=secret_key or store.credentials.secret_key,
        region="us-east-1",
        client_options={"allow_http": True},
    )


def test_an_object_is_read_back_with_the_key_and_refused_without_it(store: objectstore.ObjectStore) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    obstore.put(_client(store), "digits/model.onnx", payload)
    assert obstore.get(_client(store), "digits/model.onnx").bytes().to_bytes() == payload

    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{store.endpoint}/{BUCKET}/digits/model.onnx", timeout=5)
    assert anonymous.value.code == 403
    with pytest.raises(Exception, match=r"(?i)signature|denied|403"):
        obstore.get(_client(store, secret_key="not-the-secret"), "digits/model.onnx").bytes()


def test_the_gateway_serves_https_with_a_certificate_from_a_private_ca(weed: Path, tmp_path: Path) -> None:
    """A store behind a CA only the platform trusts: the default trust store refuses it, the CA accepts it."""
    keys = pki.generate(tmp_path / "pki")
    cert, key = pki.issue_serving(keys.ca_cert, keys.ca_key, tmp_path / "tls" / "s3", "s3", ips=("127.0.0.1",))
    secured = objectstore.ObjectStore(weed, tmp_path / "store", tls=(cert, key))
    secured.start(ca=keys.ca_cert)
    try:
        assert secured.endpoint.startswith("https://")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(secured.endpoint + "/", timeout=5, context=ssl.create_default_context())
        assert secured.answers(keys.ca_cert)  # 403 to the anonymous client, over TLS verified by the CA
    finally:
        secured.stop()
