"""Model and data URIs: what a policy may name, and what the agent refuses to fetch."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from metainfer.agent.fetch import FetchError, fetch
from metainfer.core.api.policy import DataReference, ModelSource

SHA = "a" * 64


@pytest.mark.parametrize(
    "uri",
    [
        "https://m/x.onnx", "http://m:8080/x?v=2", "file:///models/x.onnx", "configmap://c/k", "s3://bucket/a/b.onnx",
        "gs://bucket/m.onnx", "az://container/m.onnx", "hf://org/repo@v1.0/onnx/model.onnx",
    ],
)  # fmt: skip
def test_the_documented_schemes_are_accepted(uri: str) -> None:
    assert ModelSource(uri=uri, sha256=SHA).uri == uri
    assert DataReference(uri=uri).uri == uri


@pytest.mark.parametrize(
    "uri", ["https://user:secret@m/x.onnx", "https://token@m/x", "https://", "file:///", "ftp://m/x"]
)
def test_credentials_and_empty_or_unknown_uris_are_refused_naming_the_field(uri: str) -> None:
    with pytest.raises(ValidationError, match="uri"):
        ModelSource(uri=uri, sha256=SHA)


def test_the_agent_refuses_credentials_without_repeating_them(tmp_path: Path) -> None:
    with pytest.raises(FetchError) as err:
        fetch(
            "https://user:secret@127.0.0.1:9/x.onnx",
            tmp_path / "m",
            expected_sha256=None,
            namespace="ns",
            configmaps=None,
        )
    assert "secret" not in str(err.value) and "user:" not in str(err.value) and not err.value.transient
    assert "credentials" in str(err.value)
