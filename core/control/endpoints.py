"""Which Prometheus the operator may ask for a policy, and the exact URL it posts to.

The operator runs with the platform's network reach; a URL a policy author
writes must not turn that reach into hers (a request to any in-cluster address,
with the answer read back through the policy's status). So the platform's
Prometheus (``METAINFER_PROMETHEUS_URL``, Helm ``prometheus.url``) is the
default, and a policy's ``spec.readaptation.prometheusURL`` is honoured only
when the platform lists it (``METAINFER_PROMETHEUS_ALLOWED_URLS``, Helm
``prometheus.allowedURLs``). Every URL is a plain http(s) base: no
credentials, query or fragment that could move or hide the query path.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from metainfer.core.api.vocabulary import Reason

QUERY_PATH = "/api/v1/query"


@dataclass(frozen=True)
class PrometheusEndpoint:
    """The query URL to post to, or why there is none (``reason`` and ``refusal``, for the status)."""

    query_url: str | None = None
    refusal: str | None = None
    reason: Reason | None = None
    # Where the platform's credentials for its Prometheus are mounted; set only when the query goes to the
    # platform's own URL, never to one a policy names (core.control.prometheus_auth).
    credentials_dir: str | None = None


def query_url(base: str) -> str:
    """``base`` + /api/v1/query; ValueError naming the problem for anything but a plain http(s) base URL."""
    parts = urlsplit(base.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected http(s)://host[:port][/path]")
    if "@" in parts.netloc:
        raise ValueError("credentials in the URL are not allowed")
    if parts.query or parts.fragment or "#" in base or "?" in base:
        raise ValueError("a query string or fragment is not allowed (it would move the query path)")
    parts.port  # noqa: B018 -- raises ValueError on a malformed port
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + QUERY_PATH, "", ""))


def _normal(url: str) -> str:
    return url.strip().rstrip("/")


def prometheus_endpoint(
    policy_url: str | None, platform_url: str | None, allowed: Collection[str], credentials_dir: str | None = None
) -> PrometheusEndpoint:
    """Where to query for one policy: its own Prometheus if the platform allows it, else the platform's (the only
    one that gets ``credentials_dir``)."""
    if policy_url:
        if _normal(policy_url) not in {_normal(a) for a in allowed}:
            return PrometheusEndpoint(
                reason=Reason.PROMETHEUS_NOT_ALLOWED,
                refusal="spec.readaptation.prometheusURL is not one of the platform's allowed Prometheus URLs "
                "(Helm value prometheus.allowedURLs); remove it to use the platform's Prometheus",
            )
        base = policy_url
        platform = platform_url is not None and _normal(policy_url) == _normal(platform_url)
    elif platform_url:
        base, platform = platform_url, True
    else:
        return PrometheusEndpoint(
            reason=Reason.PROMETHEUS_UNREACHABLE,
            refusal="no Prometheus configured: set the Helm value prometheus.url (METAINFER_PROMETHEUS_URL)",
        )
    try:
        return PrometheusEndpoint(query_url=query_url(base), credentials_dir=credentials_dir if platform else None)
    except ValueError as exc:
        where = "spec.readaptation.prometheusURL" if policy_url else "the platform's Prometheus URL"
        return PrometheusEndpoint(reason=Reason.PROMETHEUS_NOT_ALLOWED, refusal=f"{where}: {exc}")
