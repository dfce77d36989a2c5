"""HTTP bodies on the wire: JSON parsed and written as Triton does (its parse-error
texts, compact output), request bodies read within --http-max-input-size (before and
after decompression, with Triton's texts), and response compression (gzip, deflate)."""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from isal import isal_zlib

from gateway.http import nesting
from protos.status import TurnoutError, internal, invalid_arg, unsupported

# Python's json messages -> the rapidjson wording Triton reports (GetParseError_En).
_PARSE_MESSAGES = (
    ("Expecting property name enclosed in double quotes", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Expecting ',' delimiter", "Missing a comma or '}' after an object member."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Extra data", "The document root must not be followed by other values."),
)


def json_compact(value: Any) -> bytes:
    """The compact JSON bytes of a value, as every response writes them."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


_BOM = b"\xef\xbb\xbf"
# A UTF-16 high surrogate escaped without the low one that must follow it, looked for once
# escaped backslashes are blanked (so every backslash left starts an escape); led by a
# fixed byte, the search runs at C speed.
_LONE_HIGH_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")
# A string's content that rapidjson reads without fault: plain characters, the escapes it
# knows, a high surrogate's escape with its low one (possessive: no backtracking state
# kept per escape, five times faster on a string of escapes).
_STRING_CONTENT = re.compile(
    r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u(?![dD][89abAB])[0-9a-fA-F]{4}'
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*+"
)
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")
_HEX_BYTES = re.compile(rb"[0-9a-fA-F]{4}")


def parse_json(buffer: bytes | memoryview, raw_strings: bool = False) -> Any:
    """Parse a JSON document, failing with Triton's (rapidjson-worded) INTERNAL error; as
    rapidjson, the document ends at its first NUL byte (no valid JSON holds one), a UTF-8
    byte order mark before it is skipped, and an escaped high surrogate must have its low
    one. A document nested deeper than Python's parser recurses is parsed in bands
    (`nesting.pieces`): its value is the first band's, containers deeper than that written
    empty, as Triton parses any depth and reads only the fields it needs."""
    data, skipped = _as_read(buffer)
    try:
        try:
            value = _loads(data, raw_strings)
        except RecursionError:
            value = _loads_deep(data, raw_strings)
    except _JsonFault as fault:
        # Python's parser takes a lone high surrogate, and a number too big for a double;
        # rapidjson stops at the first of either.
        text, offset = _surrogate_fault(data, fault.offset) or (fault.text, fault.offset)
        big = _too_big_number(data, offset)
        if big is not None:
            text, offset = _TOO_BIG, big
        raise _parse_error(text, offset, skipped) from None
    lone = _surrogate_fault(data, len(data) + 1) if b"\\u" in data else None
    if lone is not None:
        big = _too_big_number(data, lone[1])
        text, offset = (_TOO_BIG, big) if big is not None else lone
        raise _parse_error(text, offset, skipped)
    return value


def as_utf8(value: Any) -> Any:
    """A document parsed with `raw_strings`, each byte of its strings that is not UTF-8
    (kept as a surrogate escape) written as U+FFFD: what a protobuf string, a log line or
    an answer can carry. Its depth is the parse's, which Python's parser recursed through."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, list):
        return [as_utf8(item) for item in value]
    if isinstance(value, dict):
        return {as_utf8(key): as_utf8(item) for key, item in value.items()}
    return value


def _as_read(buffer: bytes | memoryview) -> tuple[bytes, int]:
    """The bytes rapidjson reads of a buffer, and how many it skipped before them (its
    offsets count them): up to the first NUL, which it reads as the end of its input, and
    after a UTF-8 byte order mark."""
    data = bytes(buffer) if isinstance(buffer, memoryview) else buffer
    end = data.find(b"\0")
    if end >= 0:
        data = data[:end]
    skipped = len(_BOM) if data.startswith(_BOM) else 0
    return data[skipped:], skipped


def _parse_error(text: str, offset: int, skipped: int) -> TurnoutError:
    return internal(f"failed to parse the request JSON buffer: {text} at {offset + skipped}")


_TOO_BIG = "Number too big to be stored in double."
# A JSON number as rapidjson reads one: an integer part of one 0 or digits led by 1-9.
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
# Every byte a number may hold kept, every other byte a space: a number starts after the
# last space before any of its bytes.
_AS_NUMBER_BYTES = bytes(byte if byte in b"0123456789.eE+-" else 32 for byte in range(256))
# What only a number too big can hold, looked for in the document with its digits written
# as 9 and its E as e: a positive exponent of three digits or more, or 309 digits in a row
# (an integer part of 310 is too big; of 309, it may be). Both searches are led by a fixed
# byte, which is what makes them fast (a pattern led by a class of bytes takes ten times
# as long).
_AS_CANDIDATES = bytes.maketrans(b"0123456789E", b"9999999999e")
_BIG_EXPONENT = re.compile(rb"e\+?999")
_LONG_DIGITS = b"9" * 309
# Candidates read in one document: each costs a microsecond or two of Python, so one
# crafted to hold millions of them is read for a few milliseconds, and what follows stands
# as Python's parser read it. A document written by a client holds hardly any.
_CANDIDATES_READ = 4096
_UINT64_TENTH, _INT64_TENTH = 0x1999999999999999, 0x0CCCCCCCCCCCCCCC  # past them, a digit overflows
_EXACT = 2**53 - 1  # rapidjson's fast path keeps a fraction's digits exact up to here
_DOUBLE_TENTH = 1.7976931348623157e307  # DBL_MAX / 10


def refuse_too_big_number(buffer: bytes | memoryview) -> None:
    """Raise Triton's parse error if the JSON document holds a number rapidjson refuses as
    too big for a double. Python's parser reads such a number as infinity, or as an integer
    of any size, so a caller asks where the document fails for another reason: rapidjson
    would have stopped at the number first."""
    data, skipped = _as_read(buffer)
    big = _too_big_number(data, len(data))
    if big is not None:
        raise _parse_error(_TOO_BIG, big, skipped)


def _too_big_number(data: bytes, before: int) -> int | None:
    """The offset of the first number before `before` that rapidjson refuses as too big,
    outside strings. The document is searched at C speed; Python reads only the numbers
    found where such a number may be (at most _CANDIDATES_READ places), each in a time
    bounded whatever its length."""
    window = data[:before] if before < len(data) else data
    marked = window.translate(_AS_CANDIDATES)
    exponent = _BIG_EXPONENT.search(marked)
    digits = marked.find(_LONG_DIGITS)
    if exponent is None and digits < 0:
        return None
    # Escaped backslashes, then escaped quotes, blanked (offsets unchanged): every quote
    # left opens or closes a string.
    plain = window.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    numbers = plain.translate(_AS_NUMBER_BYTES)
    inside, counted, position = 0, 0, 0  # whether `counted` is inside a string
    for _ in range(_CANDIDATES_READ):
        if exponent is not None and exponent.start() < position:
            exponent = _BIG_EXPONENT.search(marked, position)
        if 0 <= digits < position:
            digits = marked.find(_LONG_DIGITS, position)
        places = [digits] if digits >= 0 else []
        if exponent is not None:
            places.append(exponent.start())
        if not places:
            return None
        at = min(places)
        inside ^= plain.count(b'"', counted, at) & 1
        counted = at
        if inside:  # on from the string's end
            position = plain.find(b'"', at)
            if position < 0:
                return None
            continue
        start = numbers.rfind(b" ", 0, at) + 1
        number = _NUMBER.match(plain, start)
        if number is None or number.end() <= at:  # no number rapidjson would read
            position = at + 1
            continue
        if _too_big(number.group()):
            return start  # rapidjson reports where the number starts
        position = counted = number.end()
    return None


def _too_big(number: bytes) -> bool:
    """Whether rapidjson (ParseNumber, as Triton builds it) refuses a JSON number as too big
    for a double: an integer part past 64 bits goes on as a double, which may take no digit
    once it reaches DBL_MAX / 10; a positive exponent may not pass 308 plus the fraction
    digits it counted. A value that overflows otherwise is taken (as infinity)."""
    minus = number[:1] == b"-"
    mantissa, _, exponent = number[minus:].lower().partition(b"e")
    whole, _, fraction = mantissa.partition(b".")
    tenth, last = (_INT64_TENTH, 8) if minus else (_UINT64_TENTH, 5)
    exact, significant, double = 0, -1, None  # rapidjson does not count the first digit
    for digit in whole:
        digit -= 48
        if double is None and exact >= tenth and (exact != tenth or digit > last):
            double = float(exact)
        if double is None:
            exact = exact * 10 + digit
            significant += 1
        elif double >= _DOUBLE_TENTH:
            return True
        else:
            double = double * 10 + digit
    counted = 0  # fraction digits rapidjson counts (it drops those past 17 significant ones)
    if fraction and double is None:
        if exact == 0:  # leading zeros leave it 0, each one counted: taken at once
            counted = len(fraction) - len(fraction.lstrip(b"0"))
        for digit in fraction[counted:]:
            if exact > _EXACT:
                break
            exact = exact * 10 + digit - 48
            counted += 1
            significant += exact != 0
        value = float(exact)
        for digit in fraction[counted:]:
            if significant >= 17:
                break  # the digits left are dropped
            value = value * 10 + digit - 48
            counted += 1
            significant += value > 0
    if not exponent or exponent[:1] == b"-":
        return False
    # Leading zeros leave the exponent as it was; past them, a few digits pass any bound.
    digits = exponent.lstrip(b"+").lstrip(b"0")
    if not digits:
        return False
    power = digits[0] - 48
    for digit in digits[1:]:
        power = power * 10 + digit - 48
        if power > 308 + counted:
            return True
    return False


class _JsonFault(Exception):
    def __init__(self, text: str, offset: int) -> None:
        self.text = text
        self.offset = offset  # in bytes, as rapidjson counts


def _loads(data: bytes, raw_strings: bool) -> Any:
    try:
        # `raw_strings`: bytes that are not UTF-8 stay in strings, surrogate-escaped, as
        # rapidjson keeps them (it does not check encodings).
        return json.loads(data.decode("utf-8", "surrogateescape") if raw_strings else data)
    except json.JSONDecodeError as exc:
        text, position = _rapidjson_error(exc)
        # Python counts characters; rapidjson counts bytes.
        raise _JsonFault(text, len(exc.doc[:position].encode("utf-8", "surrogateescape"))) from None
    except UnicodeDecodeError as exc:
        raise _JsonFault("Invalid encoding in string.", exc.start) from None
    except ValueError:
        # An integer of more digits than Python converts (4 300): one that rapidjson
        # refuses as too big, which the caller finds; everything before it parsed.
        raise _JsonFault("Invalid value.", len(data)) from None


def _loads_deep(data: bytes, raw_strings: bool) -> Any:
    """The first band of a document too deep for Python's parser; every band is parsed,
    and the fault first in the document, if any, raised where rapidjson meets it."""
    value, first = None, None
    for index, piece in enumerate(nesting.pieces(data)):
        try:
            parsed = _loads(piece.text, raw_strings)
        except _JsonFault as fault:
            if piece.open_at is not None and fault.offset >= piece.open_at:
                continue  # past a container left open: that container's piece has the fault
            offset = piece.origin(fault.offset)
            if first is None or offset < first.offset:
                first = _JsonFault(fault.text, offset)
            continue
        if index == 0:
            value = parsed
    if first is not None:
        raise first
    return value


def _surrogate_fault(data: bytes, before: int) -> tuple[str, int] | None:
    """rapidjson's fault at the first escaped high surrogate before byte `before` that
    lacks its low one: at the escape's backslash, about the hex digits when a `\\u`
    follows with fewer than four."""
    lone = _LONE_HIGH_SURROGATE.search(data[: before + 12].replace(b"\\\\", b"__"))
    if lone is None or lone.start() >= before:
        return None
    after = data[lone.end() : lone.end() + 6]
    if after[:2] == b"\\u" and not (len(after) == 6 and _HEX_BYTES.fullmatch(after[2:])):
        return "Incorrect hex digit after \\u escape in string.", lone.start()
    return "The surrogate pair in string is invalid.", lone.start()


def _rapidjson_error(exc: json.JSONDecodeError) -> tuple[str, int]:
    """What rapidjson (as Triton builds it) reports for the fault Python's parser found:
    its message and the character where it stops, which is often not where Python does."""
    doc, pos = exc.doc, exc.pos
    if exc.msg.startswith("Unterminated string"):
        return _string_fault(doc, pos + 1)
    if exc.msg.startswith("Invalid \\uXXXX escape"):  # Python points past the backslash
        return _string_fault(doc, pos - 1)
    if exc.msg.startswith("Invalid control character"):
        return "Invalid escape character in string.", pos
    if exc.msg == "Expecting value" and pos < len(doc):
        literal = next((word for word in ("true", "false", "null") if doc[pos] == word[0]), None)
        if literal is not None:  # rapidjson stops at the first letter that does not match
            matched = 1
            while matched < len(literal) and doc[pos + matched : pos + matched + 1] == literal[matched]:
                matched += 1
            return "Invalid value.", pos + matched
        if doc[pos] == "-":  # a minus and no digit after it
            return "Invalid value.", pos + 1
    if exc.msg.startswith("Expecting ',' delimiter") and pos < len(doc) and pos > 0 and doc[pos - 1].isdigit():
        # Python ends a number before a '.' or an exponent it cannot read; rapidjson
        # reads on and misses the digits.
        if doc[pos] == ".":
            return "Miss fraction part in number.", pos + 1
        if doc[pos] in "eE":
            return "Miss exponent in number.", pos + 2 if doc[pos + 1 : pos + 2] in ("+", "-") else pos + 1
    return _rapidjson_message(exc), pos


def _string_fault(doc: str, at: int) -> tuple[str, int]:
    """rapidjson's reading of a string Python found unterminated, from just after its quote."""
    content = _STRING_CONTENT.match(doc, at)  # what it reads without fault, at C speed
    at = at if content is None else content.end()
    while at < len(doc):
        char = doc[at]
        if char == "\\":
            escape = doc[at + 1 : at + 2]
            if escape == "u":
                digits = doc[at + 2 : at + 6]
                if len(digits) < 4 or not _HEX.issuperset(digits):
                    return "Incorrect hex digit after \\u escape in string.", at
                if 0xD800 <= int(digits, 16) <= 0xDBFF:  # its low surrogate must follow
                    if doc[at + 6 : at + 8] != "\\u":
                        return "The surrogate pair in string is invalid.", at
                    low = doc[at + 8 : at + 12]
                    if len(low) < 4 or not _HEX.issuperset(low):
                        return "Incorrect hex digit after \\u escape in string.", at
                    if not 0xDC00 <= int(low, 16) <= 0xDFFF:
                        return "The surrogate pair in string is invalid.", at
                    at += 6
                at += 6
                continue
            if escape not in _ESCAPES or not escape:
                return "Invalid escape character in string.", at
            at += 2
            continue
        if char < " ":
            return "Invalid escape character in string.", at
        at += 1
    return "Missing a closing quotation mark in string.", len(doc)


def _rapidjson_message(exc: json.JSONDecodeError) -> str:
    if exc.msg == "Expecting value":
        return "The document is empty." if not exc.doc.strip() else "Invalid value."
    for python_text, rapidjson_text in _PARSE_MESSAGES:
        if exc.msg.startswith(python_text):
            if python_text == "Expecting ',' delimiter" and _inside_array(exc.doc, exc.pos):
                return "Missing a comma or ']' after an array element."
            return rapidjson_text
    return "Invalid value."


def _inside_array(doc: str, pos: int) -> bool:
    return nesting.innermost_open(doc[:pos].encode("utf-8", "surrogateescape")) == ord("[")


_LIMIT_HINT = "Use --http-max-input-size to increase the limit."
COMPRESSIONS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # wbits to write each
# Triton inflates either encoding with zlib told to detect a gzip or a zlib header, so a
# gzip body labelled deflate (or the reverse) inflates all the same.
_EITHER_HEADER = 32 + zlib.MAX_WBITS
INFLATE_STEP = 1 << 20
# Input handed to zlib at a time: a fault is looked for within at most this much.
_INFLATE_SLICE = 1 << 16


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
    gathers a step's output twice over before it returns it.

    As Triton's DataCompressor, a fault in the data (a bad header, a corrupt block, a
    checksum that does not match) is no error: the body is what zlib inflated before the
    fault, and whatever follows it is ignored. Python's zlib drops a call's output when
    the call fails, so each call's starting state is kept (a copy of the stream) to find
    that output again."""

    def __init__(self, limit: int) -> None:
        self._decoder = zlib.decompressobj(_EITHER_HEADER)
        self._limit = limit
        self._faulted = False
        self.size = 0

    def feed(self, data: bytes, out: list[bytes]) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _INFLATE_SLICE):
            if self._faulted:
                return
            self._inflate(view[start : start + _INFLATE_SLICE], out)

    def finish(self, out: list[bytes]) -> None:
        if not self._faulted:
            self._inflate(b"", out)

    def _inflate(self, data: bytes | memoryview, out: list[bytes]) -> None:
        while True:
            before = self._decoder.copy()
            try:
                piece = self._decoder.decompress(data, self._room())
            except zlib.error:
                self._faulted = True
                self._salvage(before, data, out)
                return
            self._take(piece, out)
            # Output left inside zlib or input it has not taken yet: ask again.
            data = self._decoder.unconsumed_tail
            if not data and not piece:
                return

    def _salvage(self, decoder: Any, data: bytes | memoryview, out: list[bytes]) -> None:
        """The output of the longest start of `data` that inflates without a fault, from
        `decoder` (the stream as it was before `data`): found by halving, each try on a
        copy of the stream and holding no output beyond the limit."""
        clean, faulty = 0, len(data)
        while faulty - clean > 1:
            middle = (clean + faulty) // 2
            try:
                self._drain(decoder.copy(), data[:middle], None)
            except zlib.error:
                faulty = middle
            else:
                clean = middle
        self._drain(decoder, data[:clean], out)

    def _drain(self, decoder: Any, data: bytes | memoryview, out: list[bytes] | None) -> None:
        """Inflate `data` whole with `decoder`; its output goes to `out` (counted against
        the limit) or, for a try, is only counted."""
        size = self.size
        while True:
            piece = decoder.decompress(data, min(self._limit - size + 1, INFLATE_STEP))
            size += len(piece)
            if size > self._limit:
                raise decompressed_too_large(self._limit)  # as Triton: the limit came first
            if out is not None:
                self._take(piece, out)
            data = decoder.unconsumed_tail
            if not data and not piece:
                return

    def _room(self) -> int:
        return min(self._limit - self.size + 1, INFLATE_STEP)

    def _take(self, piece: bytes, out: list[bytes]) -> None:
        self.size += len(piece)
        if self.size > self._limit:
            raise decompressed_too_large(self._limit)
        if piece:
            out.append(piece)


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
    inflater = _Inflater(limit) if encoding is not None else None
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
    inflater = _Inflater(max_size)
    inflater.feed(body, parts)
    inflater.finish(parts)
    return b"".join(parts)


# Accept-Encoding values up to this long are weighed once and remembered (a client sends
# the same one on every request); the cache holds at most 32 of them.
_REMEMBERED_ACCEPT_LENGTH = 128


def response_encoding(accept_encoding: str | None) -> str | None:
    """The Content-Encoding to answer with ("gzip", "deflate") per Accept-Encoding q-values."""
    if not accept_encoding:
        return None
    if len(accept_encoding) <= _REMEMBERED_ACCEPT_LENGTH:
        return _remembered_encoding(accept_encoding)
    return _weighed_encoding(accept_encoding)


def _weighed_encoding(accept_encoding: str) -> str | None:
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


_remembered_encoding = functools.lru_cache(maxsize=32)(_weighed_encoding)


# An answer shorter than this is compressed at ISA-L's level 0 (no match tables to set
# up; its stream opens with a code table of about 110 bytes); a longer one at level 1.
_SMALL_ANSWER = 1024


def compress(body: bytes, encoding: str) -> bytes:
    """`body` compressed as `encoding` with ISA-L's deflate (python-isal): gzip or zlib
    streams any decoder reads, as zlib's would be. At level 1 it compresses about as well
    as zlib's default level at 10 to 25 times its speed (an 8 KB JSON answer: 16 against
    177 µs; 1 MiB of floats: 1.4 against 36 ms). Level 0 serves an answer of a few hundred
    bytes in under a microsecond, where level 1 sets up its tables (5 µs) and zlib builds
    its Huffman trees (7 µs); such an answer shrinks less, by bytes no one waits for."""
    level = 0 if len(body) < _SMALL_ANSWER else 1
    return isal_zlib.compress(body, level, COMPRESSIONS[encoding])
