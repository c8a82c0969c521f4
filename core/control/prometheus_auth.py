"""What the operator presents to the platform's Prometheus, from the files of a mounted Secret.

A Prometheus behind kube-rbac-proxy, an ingress with basic auth, or its own web config (``basic_auth_users``,
``tls_server_config``) refuses an anonymous query; kube-prometheus-stack installs it that way more often than not.
The platform puts the credentials in a Secret the chart mounts (``prometheus.auth.secretName``), with the key names
Prometheus Operator uses: ``token`` (a bearer token), or ``username`` and ``password`` (basic auth), and ``ca.crt``
(the CA that signed Prometheus' serving certificate). They go only to the platform's own Prometheus URL, never to one
a policy names (core.control.endpoints): a policy author must not be able to send the operator's token elsewhere.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass

TOKEN, USERNAME, PASSWORD, CA = "token", "username", "password", "ca.crt"
KEYS = (TOKEN, USERNAME, PASSWORD, CA)
MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Credentials:
    """The Authorization header value (None: anonymous) and the CA bundle to verify TLS with (None: the system's)."""

    authorization: str | None = None
    ca_pem: str | None = None


def credentials(files: Mapping[str, bytes]) -> Credentials:
    """The credentials the Secret's files (by key) hold; ValueError naming the key and what was expected."""
    text = {key: _text(key, value) for key, value in files.items() if key in KEYS}
    token, username, password = text.get(TOKEN), text.get(USERNAME), text.get(PASSWORD)
    if token is not None and (username is not None or password is not None):
        raise ValueError(f"the Secret has both {TOKEN!r} and {USERNAME!r}/{PASSWORD!r}: keep one way to authenticate")
    if (username is None) != (password is None):
        raise ValueError(f"basic auth needs both {USERNAME!r} and {PASSWORD!r} in the Secret")
    authorization = None
    if token is not None:
        _header_safe(TOKEN, token)
        authorization = f"Bearer {token}"
    elif username is not None and password is not None:
        if ":" in username:
            raise ValueError(f"{USERNAME!r} must not contain ':' (basic auth separates it from the password with one)")
        _header_safe(USERNAME, username)
        authorization = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    ca = text.get(CA)
    if ca is not None and "-----BEGIN CERTIFICATE-----" not in ca:
        raise ValueError(f"{CA!r} is not a PEM certificate bundle")
    return Credentials(authorization, ca)


def _text(key: str, value: bytes) -> str:
    if len(value) > MAX_FILE_BYTES:
        raise ValueError(f"{key!r} is {len(value)} bytes; at most {MAX_FILE_BYTES} expected")
    try:
        decoded = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{key!r} is not UTF-8 text") from exc
    # Secrets written with `echo` or from a file carry a trailing newline that is no part of the credential; other
    # whitespace may be part of a password, and only a token is never anything but its characters.
    stripped = {CA: decoded, TOKEN: decoded.strip()}.get(key, decoded.rstrip("\r\n"))
    if not stripped:
        raise ValueError(f"{key!r} is empty")
    return stripped


def _header_safe(key: str, value: str) -> None:
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{key!r} contains a line break or NUL: it cannot go into an HTTP header")
