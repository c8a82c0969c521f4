"""The tests' S3-compatible object store (hack/controlplane/s3proxy.py): a real S3Proxy whose buckets are
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

from hack.controlplane import pki, s3proxy
from hack.controlplane.errors import AssetError

obstore = pytest.importorskip("obstore")  # the dev extra's
from obstore.store import S3Store  # noqa: E402  (after the importorskip that guards it)

BUCKET = "models"


def _log(message: str) -> None:
    print(f"[object-store] {message}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def runtime() -> s3proxy.S3Proxy:
    try:
        return s3proxy.provide(_log)
    except AssetError as exc:
        pytest.fail(f"cannot provide S3Proxy {s3proxy.S3PROXY_VERSION}: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def store(runtime: s3proxy.S3Proxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3proxy.ObjectStore]:
    started = s3proxy.ObjectStore(runtime, tmp_path_factory.mktemp("s3proxy")).start()
    started.create_bucket(BUCKET)
    try:
        yield started
    finally:
        started.stop()


def _client(store: s3proxy.ObjectStore, secret_key: str | None = None) -> S3Store:
    return S3Store(
        BUCKET,
        endpoint=store.endpoint,
        access_key_id=store.credentials.access_key,
        secret_access_key=secret_key or store.credentials.secret_key,
        region="us-east-1",
        client_options={"allow_http": True},
    )


def test_an_object_is_read_back_with_the_key_and_refused_without_it(store: s3proxy.ObjectStore) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    obstore.put(_client(store), "digits/model.onnx", payload)
    assert obstore.get(_client(store), "digits/model.onnx").bytes().to_bytes() == payload

    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{store.endpoint}/{BUCKET}/digits/model.onnx", timeout=5)
    assert anonymous.value.code == 403
    with pytest.raises(Exception, match=r"(?i)signature|denied|403"):
        obstore.get(_client(store, secret_key="not-the-secret"), "digits/model.onnx").bytes()


def test_the_store_serves_https_with_a_certificate_from_a_private_ca(runtime: s3proxy.S3Proxy, tmp_path: Path) -> None:
    """A store behind a CA only the platform trusts: the default trust store refuses it, the CA accepts it."""
    keys = pki.generate(tmp_path / "pki")
    cert, key = pki.issue_serving(keys.ca_cert, keys.ca_key, tmp_path / "tls" / "s3", "s3", ips=("127.0.0.1",))
    secured = s3proxy.ObjectStore(runtime, tmp_path / "store", tls=(cert, key))
    secured.start(ca=keys.ca_cert)
    try:
        assert secured.endpoint.startswith("https://")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(secured.endpoint + "/", timeout=5, context=ssl.create_default_context())
        assert secured.answers(keys.ca_cert)  # 403 to the anonymous client, over TLS verified by the CA
    finally:
        secured.stop()


# The agent's fetch (agent/fetch.py, agent/object_store.py) against the same store: what a Job and a serving pod do
# with a policy whose model lives in a private bucket and whose credentials come from a mounted Secret.


def _secret_dir(path: Path, store: s3proxy.ObjectStore, **extra: str) -> Path:
    """A directory laid out as the kubelet mounts a Secret: one file per key."""
    path.mkdir(parents=True, exist_ok=True)
    keys = {
        "AWS_ACCESS_KEY_ID": store.credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": store.credentials.secret_key,
        "AWS_ENDPOINT_URL": store.endpoint,
        **extra,
    }
    for key, value in keys.items():
        (path / key).write_text(value + "\n")  # kubectl create secret --from-file keeps a trailing newline
    return path


@pytest.fixture
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store listens on loopback, which the fetch guard refuses unless the platform allows it."""
    monkeypatch.setenv("METAINFER_FETCH_ALLOW_CIDRS", "127.0.0.0/8")


def test_the_agent_fetches_a_private_object_with_the_secrets_keys(
    store: s3proxy.ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loopback_allowed: None
) -> None:
    import hashlib

    from metainfer.agent.fetch import FetchError, fetch

    payload = b"onnx bytes " * 50_000
    obstore.put(_client(store), "agent/model.onnx", payload)
    digest = hashlib.sha256(payload).hexdigest()
    uri = f"s3://{BUCKET}/agent/model.onnx"
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(_secret_dir(tmp_path / "secret", store)))

    got = fetch(uri, tmp_path / "out" / "model.onnx", expected_sha256=digest, namespace="ns", configmaps=None)
    assert got.read_bytes() == payload

    with pytest.raises(FetchError, match="no such object") as missing:
        fetch(f"s3://{BUCKET}/agent/absent.onnx", tmp_path / "absent", expected_sha256=None, namespace="ns",
              configmaps=None)  # fmt: skip
    assert not missing.value.transient

    wrong = _secret_dir(tmp_path / "wrong", store, AWS_SECRET_ACCESS_KEY="not-the-secret")
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(wrong))
    with pytest.raises(FetchError, match=r"refused the credentials|403|Forbidden") as refused:
        fetch(uri, tmp_path / "wrong.onnx", expected_sha256=None, namespace="ns", configmaps=None)
    assert not refused.value.transient
    assert "not-the-secret" not in str(refused.value)
    assert not (tmp_path / "wrong.onnx").exists()

    anonymous = tmp_path / "anonymous"
    anonymous.mkdir()
    (anonymous / "AWS_ENDPOINT_URL").write_text(store.endpoint)
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(anonymous))
    with pytest.raises(FetchError, match="anonymous request"):
        fetch(uri, tmp_path / "anon.onnx", expected_sha256=None, namespace="ns", configmaps=None)


def test_a_store_on_loopback_is_refused_unless_the_platform_allows_it(
    store: s3proxy.ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metainfer.agent.fetch import FetchError, fetch

    monkeypatch.delenv("METAINFER_FETCH_ALLOW_CIDRS", raising=False)
    monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(_secret_dir(tmp_path / "secret", store)))
    with pytest.raises(FetchError, match="loopback") as refused:
        fetch(f"s3://{BUCKET}/digits/model.onnx", tmp_path / "m", expected_sha256=None, namespace="ns",
              configmaps=None)  # fmt: skip
    assert not refused.value.transient


def test_the_secrets_ca_bundle_verifies_a_private_store(
    runtime: s3proxy.S3Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loopback_allowed: None
) -> None:
    from metainfer.agent.fetch import FetchError, fetch

    keys = pki.generate(tmp_path / "pki")
    cert, key = pki.issue_serving(keys.ca_cert, keys.ca_key, tmp_path / "tls" / "s3", "s3", ips=("127.0.0.1",))
    secured = s3proxy.ObjectStore(runtime, tmp_path / "store", tls=(cert, key)).start(ca=keys.ca_cert)
    secured.create_bucket(BUCKET)
    try:
        client = S3Store(
            BUCKET, endpoint=secured.endpoint, access_key_id=secured.credentials.access_key,
            secret_access_key=secured.credentials.secret_key, region="us-east-1",
            client_options={"root_certificate": keys.ca_cert.read_text()},
        )  # fmt: skip
        obstore.put(client, "tls/model.onnx", b"over tls")
        uri = f"s3://{BUCKET}/tls/model.onnx"
        without_ca = _secret_dir(tmp_path / "no-ca", secured)
        monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(without_ca))
        with pytest.raises(FetchError, match=r"(?i)certificate|tls|ssl|connect"):
            fetch(uri, tmp_path / "a", expected_sha256=None, namespace="ns", configmaps=None)
        with_ca = _secret_dir(tmp_path / "ca", secured, **{"ca.crt": keys.ca_cert.read_text()})
        monkeypatch.setenv("METAINFER_STORE_CREDENTIALS", str(with_ca))
        assert fetch(uri, tmp_path / "b", expected_sha256=None, namespace="ns", configmaps=None).read_bytes() == (
            b"over tls"
        )
    finally:
        secured.stop()


def test_metainfer_adapt_reads_model_and_data_from_a_bucket_with_the_environments_keys(
    store: s3proxy.ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loopback_allowed: None
) -> None:
    """`metainfer adapt s3://...` on one's own machine: the keys from the usual environment variables, the sha256
    pins checked, a wrong pin an input error (exit 2) before any search."""
    from metainfer.agent.cli import EXIT_INPUT, main
    from metainfer.agent.zoo import build_examples

    digits = build_examples(tmp_path / "examples", ["digits"])["digits"]
    obstore.put(_client(store), "cli/model.onnx", digits.model_path.read_bytes())
    obstore.put(_client(store), "cli/data.npz", digits.data_path.read_bytes())
    monkeypatch.delenv("METAINFER_STORE_CREDENTIALS", raising=False)
    monkeypatch.delenv("METAINFER_STORE_AMBIENT_CREDENTIALS", raising=False)
    for key, value in (
        ("AWS_ACCESS_KEY_ID", store.credentials.access_key),
        ("AWS_SECRET_ACCESS_KEY", store.credentials.secret_key),
        ("AWS_ENDPOINT_URL", store.endpoint),
    ):
        monkeypatch.setenv(key, value)  # fmt: skip
    common = ["--data", f"s3://{BUCKET}/cli/data.npz", "--data-sha256", digits.data_sha256, "--batch", "8"]

    wrong = main(["adapt", f"s3://{BUCKET}/cli/model.onnx", "--model-sha256", "0" * 64, *common,
                  "--out", str(tmp_path / "wrong")])  # fmt: skip
    assert wrong == EXIT_INPUT

    out = tmp_path / "out"
    assert main(["adapt", f"s3://{BUCKET}/cli/model.onnx", "--model-sha256", digits.sha256, *common,
                 "--budget-trials", "2", "--out", str(out)]) == 0  # fmt: skip
    assert (out / "report.json").is_file() and (out / "recipe.json").is_file()
