"""Content-Encoding of request bodies, inflated by the server itself on a codec thread.

aiohttp inflates compressed bodies on the event loop while it reads them: three 200 KiB gzip bodies that inflate
to 200 MiB each held liveness for 668 ms even with the size limit in place. The server therefore reads the body as
sent (bounded like any body) and inflates it here, off the loop, never producing more than the limit: zlib stops
at ``limit + 1`` bytes, so a bomb costs at most one limit of memory and is refused with 413.
"""

from __future__ import annotations

import zlib

from metainfer.agent.serve.protocol import ProtocolError

# wbits per encoding (RFC 9110 8.4.1): gzip framing; "deflate" is the zlib format, but some clients send raw
# deflate, so both are tried as HTTP libraries do.
_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
ACCEPTED = ("identity", *_WBITS)


def content_encoding(header: str | None) -> str:
    """The one encoding of a request body (identity when absent); 415 for anything else, naming what is accepted."""
    encoding = (header or "identity").strip().lower()
    if encoding in ACCEPTED:
        return encoding
    shown = encoding[:64]
    raise ProtocolError(
        f"Content-Encoding {shown!r} is not supported; send one of {', '.join(ACCEPTED)}",
        415, headers={"Accept-Encoding": ", ".join(ACCEPTED), "Connection": "close"},
    )  # fmt: skip


def inflate(raw: bytes, encoding: str, limit: int, too_large: str) -> bytes:
    """``raw`` decoded; 413 (``too_large``) once the inflated size would pass ``limit``, 400 if it is corrupt."""
    if encoding == "identity":
        return raw
    attempts = [_WBITS[encoding]] + ([-15] if encoding == "deflate" else [])
    for wbits in attempts:
        try:
            return _inflate(raw, wbits, limit, too_large, encoding)
        except zlib.error as exc:
            if wbits == attempts[-1]:
                raise ProtocolError(f"request body is not valid {encoding} data ({exc})") from None
    raise AssertionError("unreachable: the last attempt raises or returns")


def _inflate(raw: bytes, wbits: int, limit: int, too_large: str, encoding: str) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:  # a gzip body may hold several members (RFC 1952 2.2), read as one stream
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(raw, limit + 1 - size)
        size += len(out)
        parts.append(out)
        if size > limit or inflater.unconsumed_tail:
            raise ProtocolError(too_large + " (once inflated)", 413, headers={"Connection": "close"})
        if not inflater.eof:
            raise ProtocolError(f"request body is truncated {encoding} data")
        raw = inflater.unused_data
        if not raw:
            return b"".join(parts)
        if wbits != 31:
            raise ProtocolError(f"request body has {len(raw)} bytes after its {encoding} data")
