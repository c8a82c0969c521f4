"""Object store URIs (agent/object_store.py): how s3://, gs://, az:// and hf:// are taken apart, where the request
goes, and what of the mounted Secret it uses. The store itself is exercised in tests/integration/test_object_store.py
(a real S3 server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metainfer.agent import object_store
from metainfer.agent.fetch import FetchError, fetch
from metainfer.agent.object_store import Credentials, ObjectAddress, StoreError
from metainfer.core.api.policy import ModelSource, StoreCredentials


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("s3://models/digits/model.onnx", ObjectAddress("s3", "models", "digits/model.onnx")),
        ("gs://b/m%20x.onnx", ObjectAddress("gs", "b", "m x.onnx")),
        ("az://container/dir/m.onnx", ObjectAddress("az", "container", "dir/m.onnx")),
        ("hf://org/repo/onnx/model.onnx", ObjectAddress("hf", "org/repo", "onnx/model.onnx")),
        ("hf://org/repo@v2/model.onnx", ObjectAddress("hf", "org/repo", "model.onnx", revision="v2")),
        ("hf://datasets/org/data/x.npz", ObjectAddress("hf", "org/data", "x.npz", repo_type="dataset")),
    ],
)
def test_object_uris_are_taken_apart(uri: str, address: ObjectAddress) -> None:
    assert object_store.parse(uri) == address


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket", "s3://BUCKET/KEY"),
        ("s3://bucket/dir/", "s3://BUCKET/KEY"),
        ("az://c", "az://CONTAINER/BLOB"),
        ("hf://org/repo", "hf://ORG/REPO"),
        ("hf://org/repo@../../x/m.onnx", "revision"),
        ("s3://bucket/key?versionId=1", "no ?query"),
    ],
)
def test_a_malformed_object_uri_says_what_its_scheme_expects(uri: str, expected: str) -> None:
    with pytest.raises(StoreError, match=expected.replace("?", r"\?").replace("[", r"\[")):
        object_store.parse(uri)


def test_the_endpoint_is_the_secrets_or_the_vendors_never_the_policys() -> None:
    s3 = object_store.parse("s3://models/m.onnx")
    assert object_store.endpoint(s3, Credentials()) == "https://s3.us-east-1.amazonaws.com"
    assert object_store.endpoint(s3, Credentials({"AWS_REGION": "eu-west-3"})).endswith("eu-west-3.amazonaws.com")
    assert object_store.endpoint(s3, Credentials({"AWS_ENDPOINT_URL": "https://s3.corp"})) == "https://s3.corp"
    hub = object_store.parse("hf://datasets/org/data@refs%2Fpr%2F1/x.npz")
    assert (
        object_store.hf_url(hub, Credentials())
        == "https://huggingface.co/datasets/org/data/resolve/refs%2Fpr%2F1/x.npz"
    )
    assert object_store.hf_url(hub, Credentials({"HF_ENDPOINT": "https://hub.corp/"})).startswith("https://hub.corp/d")
    with pytest.raises(StoreError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        object_store.endpoint(object_store.parse("az://c/m.onnx"), Credentials())


def test_without_keys_a_request_is_anonymous_unless_the_platform_enabled_workload_identity() -> None:
    s3 = object_store.parse("s3://models/m.onnx")
    assert object_store.store_config(s3, Credentials())["skip_signature"] is True
    assert "skip_signature" not in object_store.store_config(s3, Credentials(ambient=True))
    keys = Credentials({"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": "T"})
    config = object_store.store_config(s3, keys)
    assert (config["access_key_id"], config["secret_access_key"], config["session_token"]) == ("AK", "SK", "T")
    assert "skip_signature" not in config and "endpoint" not in config  # AWS's own endpoint, by region
    azure = object_store.store_config(
        object_store.parse("az://c/m"),
        Credentials({"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "?sv=1"}),
    )
    assert azure["sas_key"] == "sv=1" and azure["account_name"] == "acct"
    gcs = object_store.store_config(object_store.parse("gs://b/m"), Credentials({"GOOGLE_SERVICE_ACCOUNT_KEY": "{}"}))
    assert gcs == {"service_account_key": "{}"}


def test_the_mounted_secret_is_read_key_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("AK\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "UNRELATED").write_text("ignored")
    monkeypatch.setenv(object_store.AMBIENT_ENV, "true")
    credentials = object_store.load_credentials(tmp_path)
    assert credentials.values == {"AWS_ACCESS_KEY_ID": "AK"}
    assert credentials.ca_pem == "-----BEGIN CERTIFICATE-----\n" and credentials.ambient
    (tmp_path / "HF_TOKEN").write_bytes(b"\xff\xfe")
    with pytest.raises(StoreError, match="HF_TOKEN is not UTF-8"):
        object_store.load_credentials(tmp_path)
    with pytest.raises(StoreError, match="not mounted"):
        object_store.load_credentials(tmp_path / "absent")


def test_the_proxy_and_the_ca_reach_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", ".svc,10.0.0.0/8")
    options = object_store.client_options("https://s3.corp", Credentials(ca_pem="PEM"))
    assert options["proxy_url"] == "http://proxy.corp:3128" and options["proxy_excludes"] == ".svc,10.0.0.0/8"
    assert options["root_certificate"] == "PEM" and options["allow_http"] is False


def test_a_store_endpoint_on_the_metadata_address_is_refused_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "AWS_ENDPOINT_URL").write_text("http://169.254.169.254")
    monkeypatch.setenv(object_store.CREDENTIALS_ENV, str(tmp_path))
    with pytest.raises(FetchError, match="cloud metadata endpoint") as refused:
        fetch("s3://b/m.onnx", tmp_path / "out", expected_sha256=None, namespace="ns", configmaps=None)
    assert not refused.value.transient
    (tmp_path / "AWS_ENDPOINT_URL").unlink()
    (tmp_path / "HF_ENDPOINT").write_text("http://127.0.0.1:9")
    with pytest.raises(FetchError, match="loopback"):
        fetch("hf://org/repo/m.onnx", tmp_path / "out", expected_sha256=None, namespace="ns", configmaps=None)


def test_a_policy_names_its_credentials_secret_by_a_valid_name() -> None:
    source = ModelSource(uri="s3://b/m.onnx", sha256="a" * 64, credentials=StoreCredentials(secret_name="store-keys"))
    assert source.to_api()["credentials"] == {"secretName": "store-keys"}
    with pytest.raises(ValueError, match="secretName"):
        ModelSource.model_validate({"uri": "s3://b/m", "sha256": "a" * 64, "credentials": {"secretName": "Bad_Name"}})


def test_ambient_credentials_are_the_environments_under_the_same_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(object_store.CREDENTIALS_ENV, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert object_store.load_credentials(ambient=False).values == {}  # a pod's environment is not a Secret
    assert object_store.load_credentials(ambient=True).values["HF_TOKEN"] == "hf_x"


def test_adapt_takes_uris_and_refuses_other_schemes() -> None:
    from metainfer.agent.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["adapt", "s3://b/m.onnx", "--data", "hf://o/r/d.npz", "--out", "x",
                              "--model-sha256", "A" * 64])  # fmt: skip
    assert args.model == "s3://b/m.onnx" and args.data == "hf://o/r/d.npz" and args.model_sha256 == "a" * 64
    assert isinstance(parser.parse_args(["adapt", "m.onnx", "--data", "d.npz", "--out", "x"]).model, Path)
    for bad in (["adapt", "ftp://h/m.onnx", "--data", "d.npz", "--out", "x"],
                ["adapt", "configmap://c/k", "--data", "d.npz", "--out", "x"],
                ["adapt", "m.onnx", "--data", "d.npz", "--out", "x", "--model-sha256", "abc"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
