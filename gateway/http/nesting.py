"""JSON nested deeper than Python's parser recurses. Triton parses any depth (rapidjson,
iteratively) and answers from the fields it reads, so a deep body must not end in a
RecursionError here: `pieces` cuts it into bands of PRUNE_DEPTH levels, each parsed
alone with the containers below it written empty. The first band, the document with
every container below a depth that no Triton handler reads written empty, is its value;
a fault anywhere is the first the bands meet, where rapidjson meets it.

Only bodies that already failed to parse come here; the scan works on bounded chunks so a
64 MB body costs tens of megabytes, not a copy per byte. The same scan tells a parse error
which container it is in (`innermost_open`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass

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


@dataclass
class Piece:
    """One band of a deep document: an array or object (or the document itself) with each
    container that opens `depth` levels below it written empty, so Python's parser takes
    it. `origin` maps a byte of `text` back to the document."""

    text: bytes
    runs: list[int]  # where each run of `text` starts, in `text`
    origins: list[int]  # ... and in the document
    open_at: int | None = None  # where a container left open to the end was written empty

    def origin(self, at: int) -> int:
        """Where byte `at` of `text` is in the document (its end: just past its last byte)."""
        run = bisect.bisect_right(self.runs, at) - 1
        return self.origins[run] + at - self.runs[run]


def pieces(document: bytes, depth: int = PRUNE_DEPTH) -> list[Piece]:
    """`document` cut into bands of `depth` levels (brackets inside strings left alone):
    first the document with every container opening at level `depth + 1` written empty,
    then each such container with those `depth` levels below it written empty, and so on.
    Every byte is in one piece, so the pieces parse in time linear in the document; a
    fault is the first in the document of those the pieces find."""
    # Each container that starts a band, and each closing that ends one, as the key
    # band * span + position: sorted, a band's in order, and bands in order.
    span = len(document) + 1
    open_keys: list[np.ndarray] = []
    close_keys: list[np.ndarray] = []
    for start, opening, closing, levels in _levels(document):
        # A band's container opens at level k * depth + 1 and closes back to k * depth.
        at = np.flatnonzero(opening & (levels > depth) & (levels % depth == 1))
        open_keys.append(((levels[at] - 1) // depth).astype(np.int64) * span + at + start)
        at = np.flatnonzero(closing & (levels >= depth) & (levels % depth == 0))
        close_keys.append((levels[at] // depth).astype(np.int64) * span + at + start)
    opens, closes = np.sort(np.concatenate(open_keys)), np.sort(np.concatenate(close_keys))
    # A container closes at the first closing back to its band's level after it opened;
    # with none, it is left open (-1).
    matched = np.append(closes, -1)[np.searchsorted(closes, opens, side="right")]
    ends = np.where((matched >= 0) & (matched // span == opens // span), matched % span, -1)
    cuts: dict[int, tuple[list[int], list[int]]] = {}
    for band, begin, end in zip((opens // span).tolist(), (opens % span).tolist(), ends.tolist(), strict=True):
        begins_of, ends_of = cuts.setdefault(band, ([], []))
        begins_of.append(begin)
        ends_of.append(end)
    result = [_piece(document, 0, len(document), cuts.get(1))]
    for band in sorted(cuts):
        for begin, end in zip(*cuts[band], strict=True):
            stop = len(document) if end < 0 else end + 1
            result.append(_piece(document, begin, stop, cuts.get(band + 1)))
    return result


def _piece(document: bytes, begin: int, stop: int, inner: tuple[list[int], list[int]] | None) -> Piece:
    """document[begin:stop] with the containers of `inner` inside it written empty."""
    texts: list[bytes] = []
    runs: list[int] = []
    origins: list[int] = []
    length = 0

    def run(text: bytes, origin: int) -> None:
        nonlocal length
        if text:
            texts.append(text)
            runs.append(length)
            origins.append(origin)
            length += len(text)

    position, open_at = begin, None
    if inner is not None:
        begins, ends = inner
        first, last = bisect.bisect_left(begins, begin), bisect.bisect_left(begins, stop)
        for cut, end in zip(begins[first:last], ends[first:last], strict=True):
            run(document[position:cut], position)
            run(document[cut : cut + 1], cut)  # its opening bracket or brace
            if end < 0:  # left open: it runs to the end, and so does this piece
                open_at = length
                position = stop
                break
            run(document[end : end + 1], end)
            position = end + 1
    run(document[position:stop], position)
    return Piece(b"".join(texts), runs or [0], origins or [begin], open_at)
