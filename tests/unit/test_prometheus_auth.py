"""Credentials for the platform's Prometheus, from a mounted Secret's files: each way to get them wrong named."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from metainfer.core.control.prometheus_auth import credentials
from metainfer.operator.prometheus import parse, read_credentials

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_bearer_token_loses_the_newline_a_secret_often_carries() -> None:
    assert credentials({"token": b"abc.def\n"}).authorization == "Bearer abc.def"


def test_basic_auth_keeps_a_passwords_own_spaces() -> None:
    creds = credentials({"username": b"metainfer\n", "password": b" s3cret \n", "ca.crt": PEM.encode()})
    assert creds.authorization == "Basic " + base64.b64encode(b"metainfer: s3cret ").decode()
    assert creds.ca_pem == PEM


def test_no_files_is_anonymous_and_unknown_keys_are_ignored() -> None:
    assert credentials({}).authorization is None
    assert credentials({"..data": b"x", "README": b"y"}).authorization is None


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({"token": b"t", "username": b"u", "password": b"p"}, "keep one way"),
        ({"username": b"u"}, "needs both"),
        ({"password": b"p"}, "needs both"),
        ({"username": b"a:b", "password": b"p"}, "must not contain ':'"),
        ({"token": b"abc\r\nX-Injected: 1"}, "line break"),
        ({"token": b"\n"}, "'token' is empty"),
        ({"token": b"\xff\xfe"}, "not UTF-8"),
        ({"ca.crt": b"not a certificate"}, "not a PEM"),
        ({"token": b"t" * (64 * 1024 + 1)}, "at most"),
    ],
)
def test_bad_secrets_are_refused_naming_the_key(files: dict[str, bytes], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        credentials(files)


def test_files_are_read_from_the_mounted_directory_each_time(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    assert read_credentials(tmp_path).authorization == "Bearer first"
    (tmp_path / "token").write_text("rotated\n")
    assert read_credentials(tmp_path).authorization == "Bearer rotated"
    (tmp_path / "username").write_text("u")
    with pytest.raises(ValueError, match=str(tmp_path)):
        read_credentials(tmp_path)


def test_a_refused_query_says_how_to_give_credentials() -> None:
    for status in (401, 403):
        result = parse(status, "Unauthorized\n", "https://prometheus:9090/api/v1/query")
        assert "prometheus.auth.secretName" in getattr(result, "message", ""), result


def test_unreadable_credentials_fail_the_query_safely_before_any_request(tmp_path: Path) -> None:
    import asyncio

    from metainfer.operator.prometheus import MetricsUnavailable, query

    (tmp_path / "password").write_text("p")
    result = asyncio.run(query("http://127.0.0.1:9/api/v1/query", "up", credentials_dir=str(tmp_path)))
    assert isinstance(result, MetricsUnavailable) and result.reason == "PrometheusError"
    assert "needs both" in result.message
