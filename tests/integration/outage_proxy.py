"""A TCP proxy in front of the API server that can be taken down: an API server outage for one client.

Stopping the shared test control plane would break every other test; a proxy
that refuses connections (and cuts the open ones) looks the same to the client
under test as an API server that is down: connection refused, streams reset.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from urllib.parse import urlsplit

import yaml


class OutageProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 443)
        self.scheme = parts.scheme
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def server(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def kubeconfig(self, source: str) -> str:
        """``source`` (a kubeconfig's text) pointed at the proxy."""
        config = yaml.safe_load(source)
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.server
        return yaml.safe_dump(config)

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        peers = {a: b, b: a}
        try:
            for sock in peers:
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select(timeout=1.0):
                    src = key.fileobj
                    assert isinstance(src, socket.socket)
                    data = src.recv(65536)
                    if not data:
                        return
                    peers[src].setblocking(True)
                    peers[src].sendall(data)
                    peers[src].setblocking(False)
                with self._lock:
                    if a not in self._conns:
                        return
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._conns -= set(peers)
