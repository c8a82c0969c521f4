"""The operator's queries reach a Prometheus that refuses anonymous ones: TLS from the platform's CA and basic auth
from a mounted Secret, against a real Prometheus with its own web config (as kube-prometheus-stack installs can
be). Every way it goes wrong becomes a MetricsUnavailable reason, never an exception."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.controlplane import pki
from hack.prometheus import PrometheusServer, WebSecurity
from metainfer.operator.config import OperatorConfig
from metainfer.operator.prometheus import MetricsUnavailable, Sample, query


@pytest.fixture(scope="module")
def secured(prometheus_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    work = tmp_path_factory.mktemp("secured-prometheus")
    keys = pki.generate(work / "pki")
    web = WebSecurity(keys.serving_cert, keys.serving_key, keys.ca_cert, "metainfer", "s3cret pass")
    server = PrometheusServer(prometheus_binary, work / "prometheus", [], 1.0, web=web)
    server.start()
    yield server
    server.stop()


def secret(tmp_path: Path, server: PrometheusServer, **keys: str) -> str:
    """A directory shaped like a mounted Secret: one file per key (ca.crt from the server's CA unless given)."""
    assert server.web is not None
    files = {"ca.crt": server.web.ca.read_text(), **keys}
    for key, value in files.items():
        (tmp_path / key).write_text(value)
    return str(tmp_path)


def ask(server: PrometheusServer, credentials_dir: str | None) -> Sample | MetricsUnavailable:
    return asyncio.run(query(f"{server.url}/api/v1/query", "vector(0.042)", credentials_dir=credentials_dir))


def test_the_platforms_credentials_get_an_answer(secured: PrometheusServer, tmp_path: Path) -> None:
    creds = secret(tmp_path, secured, username="metainfer\n", password="s3cret pass\n")
    assert ask(secured, creds) == Sample(0.042)


def test_without_the_platforms_ca_the_certificate_is_not_trusted(secured: PrometheusServer) -> None:
    result = ask(secured, None)
    assert isinstance(result, MetricsUnavailable) and result.reason == "PrometheusUnreachable"
    assert "Certificate" in result.message, result.message


@pytest.mark.parametrize("keys", [{}, {"username": "metainfer", "password": "wrong"}, {"token": "a-token"}])
def test_refused_credentials_say_how_to_give_them(
    secured: PrometheusServer, tmp_path: Path, keys: dict[str, str]
) -> None:
    result = ask(secured, secret(tmp_path, secured, **keys))
    assert isinstance(result, MetricsUnavailable) and result.reason == "PrometheusError"
    assert "HTTP 401" in result.message and "prometheus.auth.secretName" in result.message


def test_the_operator_sends_them_to_its_own_prometheus_only(secured: PrometheusServer, tmp_path: Path) -> None:
    creds = secret(tmp_path, secured, username="metainfer", password="s3cret pass")
    other = "http://team-prometheus.ml.svc:9090"
    config = OperatorConfig(
        prometheus_url=secured.url, prometheus_allowed_urls=[other], prometheus_auth_dir=Path(creds)
    )
    own = config.prometheus_endpoint(None)
    assert own.query_url is not None and own.credentials_dir == creds
    assert asyncio.run(query(own.query_url, "vector(1)", credentials_dir=own.credentials_dir)) == Sample(1.0)
    assert config.prometheus_endpoint(other).credentials_dir is None
