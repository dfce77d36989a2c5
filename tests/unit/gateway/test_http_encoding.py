"""Request bodies read within --http-max-input-size (gateway.http.encoding.read_body),
through its seam: an async iterator of chunks, as the HTTP front hands it the stream."""

from __future__ import annotations

import gzip
import json
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
    # As Triton's DataCompressor: a body zlib cannot read is no error, it inflates to
    # nothing (what follows then answers as for an empty body).
    for encoding in ("gzip", "deflate"):
        assert await inflated([b"not deflate"], encoding) == b""
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # deflate without zlib's header
    assert await inflated([raw.compress(BODY) + raw.flush()], "deflate") == b""


BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


async def inflated(pieces: Sequence[bytes], encoding: str, limit: int = LIMIT) -> bytes:
    return await read_body(Chunks(pieces).__aiter__(), None, encoding, limit, json_limit)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_either_header_inflates_whatever_the_label(encoding: str) -> None:
    # Triton lets zlib detect the header: a gzip body labelled deflate inflates, and the reverse.
    assert await inflated([gzip.compress(BODY)], encoding) == BODY
    assert await inflated([zlib.compress(BODY)], encoding) == BODY


async def test_what_follows_a_whole_stream_is_ignored_and_a_bad_checksum_too() -> None:
    body = gzip.compress(BODY)
    assert await inflated([body, b"trailing garbage"], "gzip") == BODY
    assert await inflated([body + body], "gzip") == BODY  # one member, as Triton reads it
    bad_crc = body[:-8] + bytes([body[-8] ^ 1]) + body[-7:]
    assert await inflated([bad_crc[:10], bad_crc[10:]], "gzip") == BODY
    bad_adler = zlib.compress(BODY)[:-1] + b"\0"
    assert await inflated([bad_adler], "deflate") == BODY


async def test_a_truncated_body_inflates_to_what_it_holds() -> None:
    body = gzip.compress(BODY)
    decoded = await inflated([body[: len(body) // 2]], "gzip")
    assert decoded and BODY.startswith(decoded) and len(decoded) < len(BODY)


@pytest.mark.parametrize("split", [None, 70_000, 100_000])
async def test_a_fault_midway_keeps_what_came_before_it(split: int | None) -> None:
    # Stored blocks (level 0): spoiling the second block's length check makes zlib stop
    # at that block's header, so exactly the first block comes out, however the body is
    # split into chunks (the fault lies past the first slice of input).
    data = random.Random(5).randbytes(200_000)
    compressor = zlib.compressobj(0)
    body = bytearray(compressor.compress(data) + compressor.flush())
    first = int.from_bytes(body[3:5], "little")  # after zlib's 2 bytes: the block type, LEN
    second = 2 + 5 + first
    assert first > 1 << 15 and second > 1 << 16
    body[second + 3] ^= 0xFF  # NLEN no longer the complement of LEN
    pieces = [bytes(body)] if split is None else [bytes(body[:split]), bytes(body[split:])]
    assert await inflated(pieces, "deflate", limit=len(body)) == data[:first]


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


@pytest.mark.parametrize("size", [0, 1, 255, 512, 1023, 1024, 4096, 40_000, 300_000])
def test_answers_compress_to_what_any_decoder_reads(size: int) -> None:
    # Standard gzip and zlib streams whatever the level; from 1 KiB on about as small as
    # zlib's default level makes them, below it never much past the body.
    noise = random.Random(size).randbytes(size // 2)
    body = noise + b"tensor " * ((size - len(noise)) // 7) + b"x" * ((size - len(noise)) % 7)
    assert gzip.decompress(compress(body, "gzip")) == body
    assert zlib.decompress(compress(body, "deflate")) == body
    size_of = len(compress(body, "deflate"))
    if size >= 1024:
        assert size_of <= len(zlib.compress(body)) * 1.05 + 16
    else:
        assert size_of <= size + 128  # level 0 opens with a code table of about 110 bytes
