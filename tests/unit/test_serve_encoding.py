"""Compressed request bodies: inflated off the event loop, never past the body limit, every bad body a 4xx."""

from __future__ import annotations

import gzip
import zlib

import pytest

from metainfer.agent.serve.encoding import content_encoding, inflate
from metainfer.agent.serve.protocol import ProtocolError

TOO_LARGE = "request body larger than the limit"


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # the zlib format RFC 9110 names
        ("deflate", lambda data: zlib.compress(data, wbits=-15)),  # raw deflate, which some clients send
        ("identity", lambda data: data),
    ],
)
def test_each_accepted_encoding_inflates_to_the_body(encoding: str, pack) -> None:  # type: ignore[no-untyped-def]
    body = b'{"inputs": []}' * 100
    assert inflate(pack(body), encoding, 1 << 20, TOO_LARGE) == body


def test_a_gzip_body_of_several_members_is_read_whole() -> None:
    assert inflate(gzip.compress(b"abc") + gzip.compress(b"def"), "gzip", 100, TOO_LARGE) == b"abcdef"


def test_a_bomb_is_refused_with_413_at_the_limit_without_inflating_it_whole() -> None:
    bomb = gzip.compress(b" " * (50 << 20), compresslevel=9)
    with pytest.raises(ProtocolError) as caught:
        inflate(bomb, "gzip", 1 << 20, TOO_LARGE)
    assert caught.value.status == 413 and "once inflated" in str(caught.value)
    assert caught.value.headers.get("Connection") == "close"


def test_the_limit_counts_every_gzip_member() -> None:
    with pytest.raises(ProtocolError) as caught:
        inflate(gzip.compress(b"x" * 60) + gzip.compress(b"y" * 60), "gzip", 100, TOO_LARGE)
    assert caught.value.status == 413


def test_a_body_exactly_at_the_limit_is_accepted() -> None:
    assert len(inflate(gzip.compress(b"x" * 100), "gzip", 100, TOO_LARGE)) == 100


@pytest.mark.parametrize(
    ("raw", "encoding", "words"),
    [
        (b"not compressed at all", "gzip", "not valid gzip"),
        (gzip.compress(b"x" * 1000, mtime=0)[:-12], "gzip", "truncated gzip"),
        (zlib.compress(b"abc") + b"trailing", "deflate", "after its deflate"),
        (b"\x00\x01garbage", "deflate", "not valid deflate"),
    ],
)
def test_corrupt_bodies_are_400s_that_say_what_is_wrong(raw: bytes, encoding: str, words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        inflate(raw, encoding, 1 << 20, TOO_LARGE)
    assert caught.value.status == 400 and words in str(caught.value)


def test_encodings_are_read_case_blind_and_others_are_415_naming_the_accepted_ones() -> None:
    assert content_encoding(None) == "identity"
    assert content_encoding(" GZip ") == "gzip"
    with pytest.raises(ProtocolError) as caught:
        content_encoding("br")
    assert caught.value.status == 415 and "gzip" in str(caught.value) and "'br'" in str(caught.value)
    assert caught.value.headers["Accept-Encoding"].startswith("identity")
    with pytest.raises(ProtocolError) as caught:
        content_encoding("x" * 10_000)
    assert len(str(caught.value)) < 200  # an attacker's header is not echoed whole
