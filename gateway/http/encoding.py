"""HTTP bodies on the wire: JSON parsed and written as Triton does (its parse-error
texts, compact output), and request and response compression (gzip, deflate)."""

from __future__ import annotations

import json
import zlib
from typing import Any

from protos.status import internal, invalid_arg, unsupported

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


def parse_json(buffer: bytes | memoryview) -> Any:
    """Parse a JSON document, failing with Triton's (rapidjson-worded) INTERNAL error."""
    data = bytes(buffer) if isinstance(buffer, memoryview) else buffer
    try:
        return json.loads(data)
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


def decompress(body: bytes, encoding: str | None, max_size: int) -> bytes:
    """The request body after Content-Encoding, limited to `max_size` decompressed bytes."""
    if encoding is None or encoding in ("", "identity"):
        data = body
    elif encoding in ("gzip", "deflate"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        try:
            data = decoder.decompress(body, max_size + 1)
        except zlib.error as exc:
            raise internal(f"failed to decompress the request body ({encoding}): {exc}") from exc
    else:
        raise unsupported("Unsupported compression type")
    if len(data) > max_size:
        size = len(data) if encoding in (None, "", "identity") else f"at least {len(data)}"
        raise invalid_arg(
            f"request JSON size of {size} bytes exceeds the maximum allowed input size of {max_size} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
    return data


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
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(wbits=wbits)
    return compressor.compress(body) + compressor.flush()
