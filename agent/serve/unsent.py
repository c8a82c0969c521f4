"""A bound on the bytes of answers computed but not yet taken by their clients.

Admission holds a request's slot until its answer has left, but one answer can be large (a [2048, 512] FP32 output
is 4 MiB binary, about 20 MiB as JSON), so slots alone do not bound memory: fifty clients that never read cost
gigabytes. Before an answer is written it reserves its size here, per connection and in total; an answer that does
not fit is refused (503, Retry-After) instead of buffered, and its reservation ends when the socket has taken it or
the client was cut at the write timeout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

# The default total (--max-unsent-mib). It is memory a pod holds for readers that do not read, which its memory
# limit must leave room for: at 256, 50 clients that never read a 10 MB answer kept RSS 331 MiB above idle.
DEFAULT_MAX_UNSENT_MIB = 64


class UnsentBudget:
    """Reservations of answer bytes, at most ``total`` in all and ``per_connection`` per connection; one answer on
    an otherwise idle connection always fits the per-connection bound (a legal answer must be deliverable)."""

    def __init__(self, total: int, per_connection: int) -> None:
        self.total, self.per_connection = total, per_connection
        self.reserved = 0
        self._by_connection: Counter[Hashable] = Counter()

    def reserve(self, connection: Hashable, size: int) -> bool:
        held = self._by_connection[connection]
        if self.reserved + size > self.total and self.reserved > 0:
            return False
        if held and held + size > self.per_connection:
            return False
        self.reserved += size
        self._by_connection[connection] += size
        return True

    def release(self, connection: Hashable, size: int) -> None:
        self.reserved -= size
        self._by_connection[connection] -= size
        if self._by_connection[connection] <= 0:
            del self._by_connection[connection]
