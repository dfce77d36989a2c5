"""HTTP bodies on the wire: JSON parsed and written as Triton does (its parse-error
texts, compact output), request bodies read within --http-max-input-size (before and
after decompression, with Triton's texts), and response compression (gzip, deflate)."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.http import nesting
from protos.status import TurnoutError, internal, invalid_arg, unsupported

# Python's json messages -> the rapidjson wording Triton reports (GetParseError_En).
_PARSE_MESSAGES = (
    ("Expecting property name enclosed in double quotes", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Expecting ',' delimiter", "Missing a comma or '}' after an object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Extra data", "The document root must not be followed by other values."),
)


def json_compact(value: Any) -> bytes:
    """The compact JSON bytes of a value, as every response writes them."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def parse_json(buffer: bytes | memoryview, raw_strings: bool = False) -> Any:
    """Parse a JSON document, failing with Triton's (rapidjson-worded) INTERNAL error; as
    rapidjson, the document ends at its first NUL byte (no valid JSON holds one). A
    document nested deeper than Python's parser recurses is parsed as `nesting.prune`
    leaves it, as Triton parses any depth and reads only the fields it needs."""
    data = bytes(buffer) if isinstance(buffer, memoryview) else buffer
    end = data.find(b"\0")
    if end >= 0:  # rapidjson reads a NUL as the end of its input, whatever follows it
        data = data[:end]
    try:
        return _loads(data, raw_strings)
    except RecursionError:
        pass
    return _loads(nesting.prune(data), raw_strings)


def _loads(data: bytes, raw_strings: bool) -> Any:
    try:
        # `raw_strings`: bytes that are not UTF-8 stay in strings, surrogate-escaped, as
        # rapidjson keeps them (it does not check encodings).
        return json.loads(data.decode("utf-8", "surrogateescape") if raw_strings else data)
    except json.JSONDecodeError as exc:
        raise internal(f"failed to parse the request JSON buffer: {_rapidjson_message(exc)} at {exc.pos}") from exc
    except UnicodeDecodeError as exc:
        raise internal(f"failed to parse the request JSON buffer: Invalid encoding in string. at {exc.start}") from exc


def _rapidjson_message(exc: json.JSONDecodeError) -> str:
    if exc.msg == "Expecting value":
        return "The document is empty." if not exc.doc.strip() else "Invalid value."
    for python_text, rapidjson_text in _PARSE_MESSAGES:
        if exc.msg.startswith(python_text):
            if python_text == "Expecting ',' delimiter" and _inside_array(exc.doc, exc.pos):
                return "Missing a comma or ']' after an array element."
            return rapidjson_text
    return "Invalid value."


def _inside_array(doc: str | bytes, pos: int) -> bool:
    text = doc if isinstance(doc, str) else doc.decode("utf-8", errors="replace")
    depth_chars = [c for c in text[:pos] if c in "[]{}"]
    stack: list[str] = []
    for c in depth_chars:
        if c in "[{":
            stack.append(c)
        elif stack:
            stack.pop()
    return bool(stack) and stack[-1] == "["


_LIMIT_HINT = "Use --http-max-input-size to increase the limit."
COMPRESSIONS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
INFLATE_STEP = 1 << 20


def json_too_large(size: int, limit: int) -> TurnoutError:
    """Triton's answer to a JSON document over --http-max-input-size (EVBufferToJson)."""
    return invalid_arg(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {_LIMIT_HINT}"
    )


def raw_input_too_large(size: int, limit: int) -> TurnoutError:
    """Triton's answer to a raw binary infer body over the limit (EVBufferToRawInput)."""
    return invalid_arg(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {limit} bytes. "
        f"{_LIMIT_HINT}"
    )


def request_too_large(size: int, limit: int) -> TurnoutError:
    """A JSON header with binary tensors after it, over the limit together. Triton reads
    such bodies whole at any size; ours stop at the limit, worded as Triton's other texts."""
    return invalid_arg(
        f"request size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {_LIMIT_HINT}"
    )


def decompressed_too_large(limit: int) -> TurnoutError:
    """Triton's answer to a compressed body that inflates past the limit (DataCompressor)."""
    return invalid_arg(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {_LIMIT_HINT}")


def check_encoding(encoding: str | None) -> str | None:
    """The request's compression ("gzip", "deflate") or None; anything else is Triton's 501."""
    if encoding is None or encoding in ("", "identity"):
        return None
    if encoding not in COMPRESSIONS:
        raise unsupported("Unsupported compression type")
    return encoding


class _Inflater:
    """Decompresses a body piece by piece, never holding more than `limit` bytes of output:
    each step asks zlib for at most the room left plus one byte, so a compression bomb
    stops one byte past the limit whatever its ratio; and at most INFLATE_STEP, since zlib
    gathers a step's output twice over before it returns it."""

    def __init__(self, encoding: str, limit: int) -> None:
        self._encoding = encoding
        self._decoder = zlib.decompressobj(COMPRESSIONS[encoding])
        self._limit = limit
        self.size = 0

    def feed(self, data: bytes, out: list[bytes]) -> None:
        while True:
            try:
                piece = self._decoder.decompress(data, min(self._limit - self.size + 1, INFLATE_STEP))
            except zlib.error as exc:
                raise internal(f"failed to decompress the request body ({self._encoding}): {exc}") from exc
            self.size += len(piece)
            if self.size > self._limit:
                raise decompressed_too_large(self._limit)
            if piece:
                out.append(piece)
            # Output left inside zlib or input it has not taken yet: ask again.
            data = self._decoder.unconsumed_tail
            if not data and not piece:
                return

    def finish(self, out: list[bytes]) -> None:
        self.feed(b"", out)


async def read_body(
    chunks: AsyncIterator[bytes],
    declared: int | None,
    encoding: str | None,
    limit: int,
    too_large: Callable[[int], TurnoutError],
) -> bytes:
    """A request body read from `chunks`, with at most `limit` bytes held at any point.

    `declared` is the Content-Length (None for a chunked body): one over the limit is
    refused before a byte is read. A chunked body is counted as it arrives and refused
    once past the limit. A compressed body (`encoding` from check_encoding) is limited
    as it arrives and again as it inflates. `too_large(size)` words the refusal of an
    uncompressed body; `size` is the declared length, or what had arrived when reading
    stopped (a lower bound for a chunked body).
    """

    def refuse(size: int) -> TurnoutError:
        # A compressed body past the limit could only inflate further.
        return too_large(size) if encoding is None else decompressed_too_large(limit)

    if declared is not None and declared > limit:
        raise refuse(declared)
    inflater = _Inflater(encoding, limit) if encoding is not None else None
    parts: list[bytes] = []
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > limit:
            raise refuse(received)
        if inflater is None:
            parts.append(chunk)
        else:
            inflater.feed(chunk, parts)
    if inflater is not None:
        if received == 0:
            raise invalid_arg("nothing to be decompressed")
        inflater.finish(parts)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decompress(body: bytes, encoding: str | None, max_size: int) -> bytes:
    """A whole request body after Content-Encoding, limited to `max_size` bytes before
    and after decompression (read_body for a body already in memory)."""
    compression = check_encoding(encoding)
    if compression is None:
        if len(body) > max_size:
            raise json_too_large(len(body), max_size)
        return body
    if len(body) > max_size:
        raise decompressed_too_large(max_size)
    if not body:
        raise invalid_arg("nothing to be decompressed")
    parts: list[bytes] = []
    inflater = _Inflater(compression, max_size)
    inflater.feed(body, parts)
    inflater.finish(parts)
    return b"".join(parts)


def response_encoding(accept_encoding: str | None) -> str | None:
    """The Content-Encoding to answer with ("gzip", "deflate") per Accept-Encoding q-values."""
    if not accept_encoding:
        return None
    chosen = "identity"
    weight = 0.0
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        coding = coding.strip()
        q = 1.0
        params = params.strip()
        if params:
            if not params.startswith("q="):
                continue
            try:
                q = float(params[2:])
            except ValueError:
                continue
        if coding in ("identity", "gzip", "deflate") and q > weight:
            chosen, weight = coding, q
    return None if chosen == "identity" else chosen


def compress(body: bytes, encoding: str) -> bytes:
    """`body` compressed as `encoding`, at zlib's default level. The window and the hash
    table are sized to the body: zlib's defaults (a 32 KiB window, memLevel 8) allocate and
    clear about 256 KiB per stream, which for an infer answer of a few hundred bytes costs
    five times the compression itself. A window at least as long as the body finds every
    match the full one would, and any decoder reads the result."""
    window = min(max((len(body) - 1).bit_length(), 9), zlib.MAX_WBITS)
    wbits = COMPRESSIONS[encoding] - zlib.MAX_WBITS + window  # the same wrapper (gzip or zlib)
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, wbits, window - 7)
    return compressor.compress(body) + compressor.flush()
