"""Request bodies read within --http-max-input-size (gateway.http.encoding.read_body),
through its seam: an async iterator of chunks, as the HTTP front hands it the stream."""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import AsyncIterator, Sequence

import pytest

from gateway.http.encoding import (
    INFLATE_STEP,
    check_encoding,
    compress,
    decompressed_too_large,
    json_too_large,
    raw_input_too_large,
    read_body,
)
from protos.status import Status, TurnoutError

LIMIT = 1000
HINT = "Use --http-max-input-size to increase the limit."


class Chunks:
    """The body's chunks, counting how many the reader pulled."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self._chunks = list(chunks)
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            self.pulled += 1
            yield chunk


def json_limit(size: int) -> TurnoutError:
    return json_too_large(size, LIMIT)


async def refusal(chunks: Chunks, declared: int | None, encoding: str | None = None, limit: int = LIMIT) -> str:
    with pytest.raises(TurnoutError) as caught:
        await read_body(chunks.__aiter__(), declared, encoding, limit, json_limit)
    assert caught.value.status is Status.INVALID_ARG
    return caught.value.message


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    chunks = Chunks([b"x" * 600, b"x" * 600])
    text = await refusal(chunks, declared=1200)
    assert text == f"request JSON size of 1200 bytes exceeds the maximum allowed input size of {LIMIT} bytes. {HINT}"
    assert chunks.pulled == 0


async def test_a_chunked_body_is_refused_at_the_chunk_that_crosses_the_limit() -> None:
    chunks = Chunks([b"x" * 400] * 10)
    assert await refusal(chunks, declared=None) == json_too_large(1200, LIMIT).message
    assert chunks.pulled == 3  # nothing after the crossing chunk was asked for


async def test_a_body_of_exactly_the_limit_is_read_whole() -> None:
    body = bytes(range(250)) * 4
    assert await read_body(Chunks([body[:300], body[300:]]).__aiter__(), LIMIT, None, LIMIT, json_limit) == body
    assert await read_body(Chunks([body]).__aiter__(), None, None, LIMIT, json_limit) == body
    assert await read_body(Chunks([]).__aiter__(), 0, None, LIMIT, json_limit) == b""


async def test_the_caller_words_an_uncompressed_refusal() -> None:
    with pytest.raises(TurnoutError) as caught:
        await read_body(Chunks([]).__aiter__(), 5000, None, LIMIT, lambda size: raw_input_too_large(size, LIMIT))
    assert caught.value.message == (
        f"Raw input has a byte_size (5000 bytes) that exceeds the maximum allowed value of {LIMIT} bytes. {HINT}"
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_body_inflates_within_the_limit(encoding: str) -> None:
    inflated = bytes(range(200)) * 5  # exactly the limit
    body = gzip.compress(inflated) if encoding == "gzip" else zlib.compress(inflated)
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    assert await read_body(Chunks(pieces).__aiter__(), len(body), encoding, LIMIT, json_limit) == inflated
    text = await refusal(
        Chunks([gzip.compress(inflated + b"!") if encoding == "gzip" else zlib.compress(inflated + b"!")]),
        None,
        encoding,
    )
    assert text == decompressed_too_large(LIMIT).message
    assert text == f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {HINT}"


async def test_a_compression_bomb_stops_at_the_limit_after_one_chunk() -> None:
    limit = 4 * INFLATE_STEP
    bomb = zlib.compress(bytes(64 * limit), 9)  # inflates to 64 times the limit
    chunks = Chunks([bomb[i : i + 1024] for i in range(0, len(bomb), 1024)])
    assert len(bomb) < limit // 10
    assert await refusal(chunks, None, "deflate", limit) == decompressed_too_large(limit).message
    assert chunks.pulled < 10  # it stopped reading where the output passed the limit


async def test_a_compressed_body_over_the_limit_is_refused_before_reading() -> None:
    chunks = Chunks([b"\x1f\x8b" + bytes(2000)])
    assert await refusal(chunks, declared=2002, encoding="gzip") == decompressed_too_large(LIMIT).message
    assert chunks.pulled == 0
    # Chunked: counted as it arrives, before it inflates.
    body = zlib.compress(random.Random(3).randbytes(1500))  # incompressible: over the limit
    chunks = Chunks([body[:600], body[600:]])
    assert await refusal(chunks, declared=None, encoding="deflate") == decompressed_too_large(LIMIT).message
    assert len(body) > LIMIT


async def test_compressed_bodies_that_are_empty_or_corrupt() -> None:
    assert await refusal(Chunks([]), 0, "gzip") == "nothing to be decompressed"
    with pytest.raises(TurnoutError) as caught:
        await read_body(Chunks([b"not deflate"]).__aiter__(), 11, "deflate", LIMIT, json_limit)
    assert caught.value.status is Status.INTERNAL
    assert caught.value.message.startswith("failed to decompress the request body (deflate): ")


def test_encodings() -> None:
    assert [check_encoding(e) for e in (None, "", "identity", "gzip", "deflate")] == [
        None,
        None,
        None,
        "gzip",
        "deflate",
    ]
    with pytest.raises(TurnoutError) as caught:
        check_encoding("br")
    assert (caught.value.status, caught.value.message) == (Status.UNSUPPORTED, "Unsupported compression type")


@pytest.mark.parametrize("size", [0, 1, 255, 511, 512, 513, 4096, 40_000, 300_000])
def test_answers_compress_to_what_any_decoder_reads(size: int) -> None:
    # The window is sized to the body; the stream must stay standard gzip and zlib, and as
    # small as zlib's own defaults make it.
    noise = random.Random(size).randbytes(size // 2)
    body = noise + b"tensor " * ((size - len(noise)) // 7) + b"x" * ((size - len(noise)) % 7)
    assert gzip.decompress(compress(body, "gzip")) == body
    assert zlib.decompress(compress(body, "deflate")) == body
    assert len(compress(body, "deflate")) <= len(zlib.compress(body)) + 16
