"""JSON nested deeper than Python's parser recurses. Triton parses any depth (rapidjson,
iteratively) and answers from the fields it reads, so a deep body must not end in a
RecursionError here: `prune` empties every container opening below a depth that no
Triton handler reads, and the rest parses and gets Triton's answer.

Only bodies that already failed to parse come here; the scan works on bounded chunks so a
64 MB body costs tens of megabytes, not a copy per byte. The same scan tells a parse error
which container it is in (`innermost_open`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

# Deeper than anything a handler reads (an infer `data` array is refused 100 levels below
# itself, 4 levels into the document) and far inside Python's recursion limit.
PRUNE_DEPTH = 200

_CHUNK = 1 << 22
# An escape is a backslash and the byte after it; blanking both (same length) leaves the
# quotes that open and close strings as the only quotes.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_QUOTE, _LEFT_BRACKET, _RIGHT_BRACKET, _LEFT_BRACE, _RIGHT_BRACE = (ord(c) for c in '"[]{}')


def _levels(document: bytes) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per chunk of `document`: its offset, where containers open and close outside
    strings, and the nesting level after each byte."""
    plain = np.frombuffer(_ESCAPE.sub(b"__", document), dtype=np.uint8)
    level = 0
    in_string = 0
    for start in range(0, len(plain), _CHUNK):
        chunk = plain[start : start + _CHUNK]
        quotes = (chunk == _QUOTE).astype(np.uint8)
        # 1 where a string is open after this byte (its opening quote included).
        strings = np.bitwise_xor.accumulate(quotes) ^ in_string
        outside = strings == 0
        opening = ((chunk == _LEFT_BRACKET) | (chunk == _LEFT_BRACE)) & outside
        closing = ((chunk == _RIGHT_BRACKET) | (chunk == _RIGHT_BRACE)) & outside
        levels = np.cumsum(opening.astype(np.int8) - closing.astype(np.int8), dtype=np.int32) + level
        yield start, opening, closing, levels
        level = int(levels[-1])
        in_string = int(strings[-1])


def innermost_open(document: bytes) -> int | None:
    """The byte that opened the innermost array or object still open at the end of
    `document` (brackets inside strings not counted), or None outside any."""
    final = 0
    for _, _, _, levels in _levels(document):
        final = int(levels[-1])
    if final <= 0:
        return None
    # The last container to open at the final level is the one still open.
    last = None
    for start, opening, _, levels in _levels(document):
        at = np.flatnonzero(opening & (levels == final))
        if len(at):
            last = start + int(at[-1])
    return None if last is None else document[last]


def prune(document: bytes, depth: int = PRUNE_DEPTH) -> bytes:
    """`document` with each array or object that opens at nesting level `depth + 1` replaced
    by an empty one of its kind, brackets inside strings left alone. A container left
    open runs to the end, so malformed input stays malformed."""
    opens: list[np.ndarray] = []
    closes: list[np.ndarray] = []
    for start, opening, closing, levels in _levels(document):
        opens.append(np.flatnonzero(opening & (levels == depth + 1)) + start)
        closes.append(np.flatnonzero(closing & (levels == depth)) + start)
    starts = np.concatenate(opens) if opens else np.empty(0, dtype=np.intp)
    ends = np.concatenate(closes) if closes else np.empty(0, dtype=np.intp)
    if not len(starts):
        return document
    pieces: list[bytes] = []
    kept = 0
    # Cut subtrees are disjoint and in order: each ends at the first closing back to `depth`
    # after it opened, if any.
    for begin in starts.tolist():
        if begin < kept:
            continue
        pieces.append(document[kept:begin])
        pieces.append(b"[]" if document[begin] == _LEFT_BRACKET else b"{}")
        after = int(np.searchsorted(ends, begin, side="right"))
        if after >= len(ends):
            return b"".join(pieces)
        kept = int(ends[after]) + 1
    pieces.append(document[kept:])
    return b"".join(pieces)
