"""A small async client for Prometheus' instant-query API, classifying every way a p95 can be missing.

The drift check must fail safe: whatever goes wrong (nothing listening, a 5xx
from a proxy, a PromQL error, no samples in the window) becomes a
``MetricsUnavailable`` value with a CamelCase reason the operator writes into
the policy status, never an exception that would end a daemon, and never a
number that could trigger a re-adaptation.
"""

from __future__ import annotations

import functools
import json
import math
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from metainfer.core.api.conditions import Reason
from metainfer.core.control.prometheus_auth import KEYS, MAX_FILE_BYTES, Credentials, credentials

DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Sample:
    """One value of an instant query (Prometheus' unit: seconds for the latency histogram)."""

    value: float


@dataclass(frozen=True)
class MetricsUnavailable:
    """Why there is no sample: ``reason`` is PrometheusUnreachable, PrometheusError or NoData."""

    reason: str
    message: str


def read_credentials(directory: str | Path) -> Credentials:
    """The credentials in a mounted Secret, read now (a rotated token or password needs no restart); ValueError
    naming the directory and the problem."""
    files: dict[str, bytes] = {}
    for key in KEYS:
        path = Path(directory) / key
        try:
            with path.open("rb") as handle:
                files[key] = handle.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ValueError(f"Prometheus credentials {str(directory)[:200]}: {key}: {exc.strerror}") from None
    try:
        return credentials(files)
    except ValueError as exc:
        raise ValueError(f"Prometheus credentials {str(directory)[:200]}: {exc}") from None


def _request_options(creds: Credentials) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if creds.authorization:
        options["headers"] = {"Authorization": creds.authorization}
    if creds.ca_pem:
        options["ssl"] = _tls_context(creds.ca_pem)
    return options


# Keyed by the bundle's text: each drift and canary check sends several queries per class, and parsing the same
# CA into a new context for each was repeated work; a rotated bundle is a new key.
@functools.lru_cache(maxsize=4)
def _tls_context(ca_pem: str) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem)


async def query(
    url: str,
    promql: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    session: aiohttp.ClientSession | None = None,
    credentials_dir: str | None = None,
) -> Sample | MetricsUnavailable:
    """Run ``promql`` by POSTing to ``url`` (core.control.endpoints.query_url); exactly one finite value, or why not.
    ``credentials_dir``: a mounted Secret whose credentials go with the request (core.control.prometheus_auth)."""
    try:
        options = _request_options(read_credentials(credentials_dir)) if credentials_dir else {}
    except (ValueError, ssl.SSLError) as exc:  # a CA bundle that parses as PEM but not as certificates: SSLError
        return MetricsUnavailable(Reason.PROMETHEUS_ERROR, str(exc)[:1024])
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 3.0))
    own = session is None
    session = session or aiohttp.ClientSession(timeout=timeout)
    try:
        async with session.post(url, data={"query": promql}, timeout=timeout, **options) as resp:
            text = await resp.text()
            status = resp.status
    except TimeoutError:
        return MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE, f"{url}: no answer within {timeout_s:g}s")
    except aiohttp.ClientError as exc:
        return MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE, f"{url}: {type(exc).__name__}: {exc}")
    except ValueError as exc:  # a malformed URL
        return MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE, f"{url}: {exc}")
    finally:
        if own:
            await session.close()
    return parse(status, text, url)


def parse(status: int, text: str, url: str = "") -> Sample | MetricsUnavailable:
    """Classify one HTTP answer of /api/v1/query (pure, so unit tests cover every branch).

    What a server wrote never reaches the status a policy author reads: only the HTTP status, the size of an
    answer that is not Prometheus', and Prometheus' own error type.
    """
    if status in (401, 403):
        return MetricsUnavailable(
            Reason.PROMETHEUS_ERROR,
            f"{url}: HTTP {status}: Prometheus refused the operator's query; give it credentials with the Helm "
            "value prometheus.auth.secretName (token, or username and password; ca.crt)",
        )
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return MetricsUnavailable(
            Reason.PROMETHEUS_ERROR, f"{url}: HTTP {status}, not a Prometheus answer ({len(text)} characters)"
        )
    if body.get("status") != "success":
        kind = body.get("errorType")
        kind = kind if isinstance(kind, str) and kind.replace("_", "").isalnum() and len(kind) <= 32 else "error"
        return MetricsUnavailable(
            Reason.PROMETHEUS_ERROR,
            f"{url}: HTTP {status}, Prometheus {kind}; run the query in Prometheus to see its message",
        )
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    values: list[Any]
    if kind == "scalar":
        values = [result]
    elif kind == "vector" and isinstance(result, list):
        values = [r.get("value") if isinstance(r, dict) else None for r in result]
    else:
        return MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"unexpected result type {kind!r}; expected a vector")
    if not values:
        return MetricsUnavailable(Reason.NO_DATA, "the query returned no series (nothing scraped in the window)")
    if len(values) > 1:
        return MetricsUnavailable(
            Reason.PROMETHEUS_ERROR, f"the query returned {len(values)} series; it must aggregate to one p95"
        )
    try:
        value = float(values[0][1])
    except (TypeError, ValueError, IndexError):
        return MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"unreadable sample {values[0]!r}")
    if math.isnan(value):
        return MetricsUnavailable(Reason.NO_DATA, "p95 is NaN: no requests were served in the window")
    if not math.isfinite(value) or value < 0:
        return MetricsUnavailable(Reason.NO_DATA, f"p95 is {value}: the histogram has no finite bucket above it")
    return Sample(value)
