"""A client's seat while the cluster changes: one KServe v2 request every 50 ms through the policy's Service.

``ClientLoop`` runs in a thread for the length of a scenario (a relabel, a model update through the canary, the
operator scaled to zero) and reports what a client would have seen: requests sent, requests that failed (no
answer within the timeout, a refused or reset connection, any status but 200) and the longest gap between two
answers. By default each request opens its own connection, as a client behind a connection-per-request proxy does,
so every request goes through kube-proxy's current rules. With ``keep_alive`` the loop is a pooling client instead
(requests, tritonclient): one connection reused until the server closes it (``Connection: close``, as a terminating
pod answers) or it fails, then a new one; a request that fails on a reused connection counts as failed, as it
would for such a client (POST is not retried).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_ERRORS_KEPT = 10


@dataclass
class LoopReport:
    sent: int = 0
    failed: int = 0
    longest_gap_s: float = 0.0  # the longest time without an answer, from the loop's start to its stop
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few, for the failure message

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.sent} requests over {self.seconds:.0f} s, {self.failed} failed, longest gap without an answer "
            f"{self.longest_gap_s:.2f} s" + (f"; first errors: {self.errors}" if self.errors else "")
        )


class ClientLoop:
    """``with ClientLoop(host, port, model, inputs) as loop: ...`` then ``loop.report``."""

    def __init__(
        self,
        host: str,
        port: int,
        model: str,
        inputs: list[dict[str, Any]],
        interval_s: float = 0.05,
        timeout_s: float = 5.0,
        keep_alive: bool = False,
    ) -> None:
        self.host, self.port, self.interval_s, self.timeout_s = host, port, interval_s, timeout_s
        self.keep_alive = keep_alive
        self._connection: http.client.HTTPConnection | None = None
        self.path = f"/v2/models/{model}/infer"
        self.body = json.dumps({"inputs": inputs}).encode()
        self.report = LoopReport()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="client-loop", daemon=True)

    def __enter__(self) -> ClientLoop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 5)

    def _one(self) -> str | None:
        """None when answered with 200; else what went wrong."""
        connection = self._connection or http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        keep = False
        try:
            connection.request("POST", self.path, self.body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            body = response.read()
            keep = self.keep_alive and not response.will_close
            if response.status != 200:
                return f"HTTP {response.status}: {body[:120]!r}"
            return None
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        finally:
            if keep:
                self._connection = connection
            else:
                self._connection = None
                connection.close()

    def _run(self) -> None:
        started = last_answer = time.monotonic()
        next_send = started
        while not self._stop.is_set():
            error = self._one()
            now = time.monotonic()
            self.report.sent += 1
            if error is None:
                self.report.longest_gap_s = max(self.report.longest_gap_s, now - last_answer)
                last_answer = now
            else:
                self.report.failed += 1
                if len(self.report.errors) < MAX_ERRORS_KEPT:
                    self.report.errors.append(f"{now - started:.1f}s {error}")
            next_send = max(next_send + self.interval_s, time.monotonic())  # after a slow one: resume, no burst
            self._stop.wait(max(0.0, next_send - time.monotonic()))
        if self._connection is not None:
            self._connection.close()
        end = time.monotonic()
        self.report.longest_gap_s = round(max(self.report.longest_gap_s, end - last_answer), 3)
        self.report.seconds = end - started
