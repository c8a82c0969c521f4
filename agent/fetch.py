"""Fetch a model or data file named by a ModelSource/DataReference URI, and verify its sha256.

Three schemes, as the CRD allows: ``http(s)://`` (urllib, with a timeout and a
size cap), ``file:///path`` (a volume mounted into the Job) and
``configmap://NAME/KEY`` (same namespace; ``binaryData`` or ``data``). Every
source is copied into the run's temp dir while being hashed, so the bytes
that were verified are exactly the bytes the engine loads, and a mismatch is
reported before anything parses the file.

Failures carry ``transient``: a timeout, a 5xx or a connection error may pass
on the next attempt (the Job retries), a 404 or a missing key will not.
"""

from __future__ import annotations

import base64
import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from metainfer.agent.fetch_guard import RefusedAddress, opener
from metainfer.core.api.conditions import Reason

DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB: larger than any model the engine can load in memory on a node
HTTP_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


class FetchError(Exception):
    """A source could not be fetched (or did not match its sha256)."""

    def __init__(self, reason: str, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.transient = transient


class ConfigMapReader(Protocol):
    """What fetching a configmap:// URI needs from the API (agent.kube.Kube implements it)."""

    def read_config_map(self, namespace: str, name: str) -> Any: ...


def max_bytes() -> int:
    """Size cap; ``METAINFER_MAX_FETCH_BYTES`` overrides it (operators with larger models)."""
    return int(os.environ.get("METAINFER_MAX_FETCH_BYTES", DEFAULT_MAX_BYTES))


def fetch(
    uri: str,
    dest: Path,
    *,
    expected_sha256: str | None,
    namespace: str,
    configmaps: ConfigMapReader | None,
    what: str = "model",
) -> Path:
    """Copy ``uri`` to ``dest`` and verify it; returns ``dest``. Raises FetchError."""
    parts = urlsplit(uri)
    scheme = parts.scheme
    if "@" in parts.netloc:
        # Credentials in a URI would be echoed into run status and logs; the CRD refuses them too.
        shown = f"{scheme}://***@{parts.netloc.rsplit('@', 1)[1]}{parts.path}"
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {shown}: a URI must not carry credentials before its host")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if scheme in ("http", "https"):
        actual = _fetch_http(uri, dest, what)
    elif scheme == "file":
        actual = _fetch_file(uri, dest, what)
    elif scheme == "configmap":
        actual = _fetch_configmap(uri, dest, namespace, configmaps, what)
    else:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: unsupported URI scheme {scheme!r}")
    if expected_sha256 is not None and actual != expected_sha256.lower():
        dest.unlink(missing_ok=True)
        raise FetchError(
            Reason.CHECKSUM_MISMATCH,
            f"{what} {uri}: sha256 mismatch: expected {expected_sha256.lower()}, got {actual}",
        )
    return dest


def _copy(source: BinaryIO, dest: Path, uri: str, what: str) -> str:
    """Stream ``source`` into ``dest`` under the size cap; the hex sha256 of what was written."""
    digest, limit, total = hashlib.sha256(), max_bytes(), 0
    with dest.open("wb") as out:
        while chunk := source.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                out.close()
                dest.unlink(missing_ok=True)
                raise FetchError(
                    Reason.MODEL_FETCH_FAILED,
                    f"{what} {uri}: larger than the {limit} byte cap (METAINFER_MAX_FETCH_BYTES)",
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _fetch_http(uri: str, dest: Path, what: str) -> str:
    request = urllib.request.Request(uri, headers={"User-Agent": "metainfer-agent"})
    try:
        with opener().open(request, timeout=HTTP_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes():
                raise FetchError(
                    Reason.MODEL_FETCH_FAILED,
                    f"{what} {uri}: {length} bytes exceed the {max_bytes()} byte cap (METAINFER_MAX_FETCH_BYTES)",
                )
            return _copy(response, dest, uri, what)
    except urllib.error.HTTPError as exc:
        transient = exc.code >= 500 or exc.code in (408, 429)
        raise FetchError(
            Reason.MODEL_FETCH_FAILED, f"{what} {uri}: HTTP {exc.code} {exc.reason}", transient=transient
        ) from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, RefusedAddress):
            raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {reason}") from exc
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {reason}", transient=True) from exc
    except ValueError as exc:  # a bad METAINFER_FETCH_ALLOW_CIDRS
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {exc}") from exc


def _fetch_file(uri: str, dest: Path, what: str) -> str:
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: file:// URIs must be absolute paths (file:///...)")
    path = Path(unquote(parts.path))
    if not path.is_file():
        problem = "no such file" if not path.exists() else "not a regular file"
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {problem} (is the model volume mounted?)")
    size, limit = path.stat().st_size, max_bytes()
    if size > limit:  # refused before a byte is copied
        raise FetchError(
            Reason.MODEL_FETCH_FAILED,
            f"{what} {uri}: {size} bytes exceed the {limit} byte cap (METAINFER_MAX_FETCH_BYTES)",
        )
    try:
        with path.open("rb") as source:
            return _copy(source, dest, uri, what)
    except OSError as exc:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {exc.strerror or exc}") from exc


def _fetch_configmap(uri: str, dest: Path, namespace: str, configmaps: ConfigMapReader | None, what: str) -> str:
    parts = urlsplit(uri)
    name, key = parts.netloc, unquote(parts.path.lstrip("/"))
    if not name or not key or "/" in key:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: expected configmap://NAME/KEY")
    if configmaps is None:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: no API access to read ConfigMaps")
    from metainfer.agent.kube import KubeError

    try:
        cm = configmaps.read_config_map(namespace, name)
    except KubeError as exc:
        if exc.status == 404:
            raise FetchError(
                Reason.MODEL_FETCH_FAILED, f"{what} {uri}: ConfigMap {name} not found in namespace {namespace}"
            ) from exc
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {exc}", transient=exc.transient) from exc
    if cm.binary_data and key in cm.binary_data:
        payload = base64.b64decode(cm.binary_data[key])
    elif cm.data and key in cm.data:
        payload = cm.data[key].encode()
    else:
        keys = sorted({*(cm.binary_data or {}), *(cm.data or {})})
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: ConfigMap {name} has no key {key!r} (has {keys})")
    dest.write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()
