"""The Prometheus a policy's drift and canary checks may reach (core.control.endpoints)."""

from __future__ import annotations

import pytest

from metainfer.core.control.endpoints import prometheus_endpoint, query_url

PLATFORM = "http://prometheus.monitoring:9090"


def test_the_platforms_prometheus_is_the_default() -> None:
    assert prometheus_endpoint(None, PLATFORM, ()).query_url == f"{PLATFORM}/api/v1/query"
    assert prometheus_endpoint(None, PLATFORM + "/prom/", ()).query_url == f"{PLATFORM}/prom/api/v1/query"
    none = prometheus_endpoint(None, None, ())
    assert none.query_url is None and "prometheus.url" in (none.refusal or "")


def test_a_policys_own_prometheus_needs_the_platforms_allow_list() -> None:
    # The operator's network reach is not the policy author's: an arbitrary URL here was an SSRF.
    own = "http://team-prom.ml:9090"
    refused = prometheus_endpoint(own, PLATFORM, ())
    assert refused.query_url is None and "prometheus.allowedURLs" in (refused.refusal or "")
    assert prometheus_endpoint(own, PLATFORM, [own + "/"]).query_url == f"{own}/api/v1/query"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/secret#",  # the fragment used to drop the query path
        "http://127.0.0.1:8080/secret?x=1",
        "http://user:pw@prom:9090",
        "file:///etc/passwd",
        "http://",
        "http://prom:notaport",
    ],
)
def test_only_plain_http_base_urls_are_posted_to(url: str) -> None:
    with pytest.raises(ValueError):
        query_url(url)
    allowed = prometheus_endpoint(url, PLATFORM, [url])
    assert allowed.query_url is None and allowed.refusal is not None


def test_the_platforms_credentials_go_only_to_the_platforms_prometheus() -> None:
    platform, other = "https://prometheus.monitoring:9090", "http://team-prometheus.ml:9090"
    own = prometheus_endpoint(None, platform, [], "/etc/metainfer/prometheus-auth")
    assert own.credentials_dir == "/etc/metainfer/prometheus-auth"
    named_same = prometheus_endpoint(platform + "/", platform, [platform], "/etc/metainfer/prometheus-auth")
    assert named_same.credentials_dir == "/etc/metainfer/prometheus-auth"
    theirs = prometheus_endpoint(other, platform, [other], "/etc/metainfer/prometheus-auth")
    assert theirs.query_url == other + "/api/v1/query" and theirs.credentials_dir is None
