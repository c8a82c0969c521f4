"""Fetch a model or data file named by a ModelSource/DataReference URI, and verify its sha256.

The schemes the CRD allows: ``http(s)://`` (urllib, with a timeout and a size
cap), ``s3://``, ``gs://``, ``az://`` and ``hf://`` (agent/object_store.py, with
the credentials the policy's Secret holds), ``file:///path`` (a volume mounted
into the Job) and ``configmap://NAME/KEY`` (same namespace; ``binaryData`` or
``data``). A CA bundle in the credentials Secret (``ca.crt``) also verifies
https:// URIs. Every
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
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from metainfer.agent import object_store
from metainfer.agent.fetch_guard import RefusedAddress, opener
from metainfer.core.api.conditions import Reason
from metainfer.core.api.pod_contract import ENV_MAX_FETCH_BYTES

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
    """What fetching a configmap:// URI needs from the API (agent.job_api.Kube implements it)."""

    def read_config_map(self, namespace: str, name: str) -> Any: ...


def max_bytes() -> int:
    """Size cap; ``METAINFER_MAX_FETCH_BYTES`` overrides it (operators with larger models)."""
    return int(os.environ.get(ENV_MAX_FETCH_BYTES, DEFAULT_MAX_BYTES))


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
        actual = _fetch_http(uri, dest, what, _credentials(uri, what))
    elif scheme == "hf":
        actual = _fetch_hub(uri, dest, what)
    elif scheme in object_store.SCHEMES:
        actual = _fetch_object(uri, dest, what)
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
    return _write_chunks(iter(lambda: source.read(_CHUNK), b""), dest, uri, what)


def _write_chunks(chunks: Iterable[bytes], dest: Path, uri: str, what: str) -> str:
    digest, limit, total = hashlib.sha256(), max_bytes(), 0
    with dest.open("wb") as out:
        for chunk in chunks:
            total += len(chunk)
            if total > limit:
                out.close()
                dest.unlink(missing_ok=True)
                raise FetchError(
                    Reason.MODEL_FETCH_FAILED,
                    f"{what} {uri}: larger than the {limit} byte cap ({ENV_MAX_FETCH_BYTES})",
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _credentials(uri: str, what: str) -> object_store.Credentials:
    try:
        return object_store.load_credentials()
    except object_store.StoreError as exc:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {exc}") from exc


def _fetch_object(uri: str, dest: Path, what: str) -> str:
    try:
        return object_store.read_object(
            uri, lambda chunks: _write_chunks(chunks, dest, uri, what), _credentials(uri, what)
        )
    except object_store.StoreError as exc:
        dest.unlink(missing_ok=True)
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {exc}", transient=exc.transient) from exc


def _fetch_hub(uri: str, dest: Path, what: str) -> str:
    """hf:// is the Hub's resolve URL; the token (HF_TOKEN in the Secret) goes to the Hub's endpoint only, never to
    the host a redirect names (the Hub redirects large files to a CDN with a signed URL)."""
    credentials = _credentials(uri, what)
    try:
        url = object_store.hf_url(object_store.parse(uri), credentials)
        object_store.guard_endpoint(url)
    except object_store.StoreError as exc:
        raise FetchError(Reason.MODEL_FETCH_FAILED, f"{what} {uri}: {exc}") from exc
    token = credentials.get("HF_TOKEN")
    return _fetch_http(url, dest, what, credentials, bearer=token, shown=uri)


def _fetch_http(
    uri: str,
    dest: Path,
    what: str,
    credentials: object_store.Credentials,
    *,
    bearer: str | None = None,
    shown: str | None = None,
) -> str:
    """GET ``uri``; ``shown`` is what messages call it (the hf:// URI the policy wrote)."""
    request = urllib.request.Request(uri, headers={"User-Agent": "metainfer-agent"})
    if bearer:
        request.add_unredirected_header("Authorization", f"Bearer {bearer}")  # dropped on any redirect
    context = ssl.create_default_context() if credentials.ca_pem else None
    if context is not None:
        context.load_verify_locations(cadata=credentials.ca_pem)  # added to the system roots, as for the stores
    uri = shown or uri
    try:
        with opener(context).open(request, timeout=HTTP_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes():
                raise FetchError(
                    Reason.MODEL_FETCH_FAILED,
                    f"{what} {uri}: {length} bytes exceed the {max_bytes()} byte cap ({ENV_MAX_FETCH_BYTES})",
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
            f"{what} {uri}: {size} bytes exceed the {limit} byte cap ({ENV_MAX_FETCH_BYTES})",
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
    from metainfer.agent.job_api import KubeError

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
