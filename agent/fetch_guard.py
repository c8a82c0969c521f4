"""Which addresses an http(s) model or data URI may reach.

A policy author names the URI and the agent or serving pod fetches it, so an unchecked fetch would let her read
what only the pod can reach: the node's loopback services, the cloud metadata endpoint (169.254.169.254, which
hands out node credentials), link-local and other non-routable addresses. Those are refused unless the platform
allows a CIDR explicitly (``METAINFER_FETCH_ALLOW_CIDRS``, comma-separated; the chart's
``serving.fetchAllowCIDRs`` / ``agent.fetchAllowCIDRs`` set it). Private ranges (10/8, 172.16/12, 192.168/16,
fc00::/7) stay allowed: in-cluster model stores live there.

The check runs on every address the host resolves to before connecting (a refused address is never probed), and
again on the address the socket actually connected to, for every connection a fetch makes (redirects included), so
a name that resolves to one address when checked and another when used (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import ssl
import urllib.request
from typing import Any, Final

from metainfer.core.api.pod_contract import ENV_FETCH_ALLOW_CIDRS

ALLOW_ENV: Final = ENV_FETCH_ALLOW_CIDRS
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# fd00:ec2::254 is AWS's IPv6 metadata endpoint; it sits in fc00::/7 (private), so it is named on its own.
METADATA = (ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128"))


class RefusedAddress(OSError):
    """The URI's host is an address no model fetch may reach."""

    def __init__(self, host: str, address: Address, why: str) -> None:
        super().__init__(
            f"{host} is {address}, {why}: model and data URIs may not reach it (a platform admin can allow it with"
            f" {ALLOW_ENV})"
        )


def allowed_networks(value: str | None = None) -> tuple[Network, ...]:
    """The CIDRs the platform allows despite the rules (``METAINFER_FETCH_ALLOW_CIDRS``); ValueError names a bad
    one."""
    text = os.environ.get(ALLOW_ENV, "") if value is None else value
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"{ALLOW_ENV}: {item[:80]!r} is not a CIDR ({exc})") from None
    return tuple(networks)


def refusal(address: Address, allowed: tuple[Network, ...]) -> str | None:
    """Why ``address`` may not be fetched from (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in allowed):
        return None
    if any(address in network for network in METADATA):
        return "a cloud metadata endpoint"
    for name, flagged in (
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("the unspecified address", address.is_unspecified),
        ("a multicast address", address.is_multicast),
        ("a reserved address", address.is_reserved),
    ):
        if flagged:
            return name
    return None


def check_peer(sock: socket.socket, host: str) -> None:
    """Raise RefusedAddress when the connected peer of ``sock`` is one no fetch may reach."""
    peer = ipaddress.ip_address(sock.getpeername()[0].split("%", 1)[0])
    why = refusal(peer, allowed_networks())
    if why is not None:
        sock.close()
        raise RefusedAddress(host, peer, why)


def check_host(host: str, port: int) -> None:
    """Raise RefusedAddress when ``host`` resolves to any address no fetch may reach: checked before connecting,
    so that a refused address is never probed (whether a port answers would tell a policy author something)."""
    allowed = allowed_networks()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return  # the connection attempt reports the name error
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        why = refusal(address, allowed)
        if why is not None:
            raise RefusedAddress(host, address, why)


def _guarded_create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
    check_host(*address)
    sock = socket.create_connection(address, *args, **kwargs)
    check_peer(sock, address[0])  # before TLS: nothing is sent to a refused peer, not even a ClientHello
    return sock


class _GuardedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # http.client opens every connection (proxy tunnels too) through this attribute.
        self._create_connection = _guarded_create_connection


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _guarded_create_connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_GuardedHTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        return self.do_open(_GuardedHTTPSConnection, req, context=getattr(self, "_context", None))


def opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener whose every connection (redirects too) refuses the addresses above; ``context`` verifies
    https (a store behind a private CA)."""
    return urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context=context))
