"""Protobuf's wire format written and read by hand, for the few places that touch bytes
received from a peer instead of parsing and re-encoding the whole message: a parser
merges an appended field into the message (a later scalar wins, a map gains the entry),
and `fields` walks a message's top-level fields without decoding their contents;
`split_raw` finds the raw tensor contents at the end of an infer request or response."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    """`value` (>= 0) as a base-128 varint, least significant group first."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, data: bytes) -> bytes:
    """Field `number` holding `data` (bytes, a string or a serialized message): wire type 2."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def string_parameter(name: str, value: str) -> bytes:
    """The serialized `parameters` entry {name: string_param=value} of a ModelInferRequest
    (field 4; a map entry's key is 1, its value 2; InferParameter.string_param is 3)."""
    return length_delimited(
        4, length_delimited(1, name.encode()) + length_delimited(2, length_delimited(3, value.encode()))
    )


def read_varint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it; ValueError where it is cut off."""
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


class Field(NamedTuple):
    """One top-level field: its number and wire type, where it starts (its tag), where
    its value starts (after a length prefix, for wire type 2) and where it ends."""

    number: int
    wire_type: int
    start: int
    value_start: int
    end: int


def fields(data: bytes | memoryview) -> Iterator[Field]:
    """The top-level fields of a serialized message, in the order they lie; ValueError
    for bytes that are not one (group wire types included, which proto3 never writes)."""
    position = 0
    size = len(data)
    while position < size:
        start = position
        tag, position = read_varint(data, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            _, end = read_varint(data, position)
            value_start = position
        elif wire_type == FIXED64:
            value_start, end = position, position + 8
        elif wire_type == FIXED32:
            value_start, end = position, position + 4
        elif wire_type == LENGTH_DELIMITED:
            length, value_start = read_varint(data, position)
            end = value_start + length
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if end > size:
            raise ValueError("truncated field")
        yield Field(number, wire_type, start, value_start, end)
        position = end


def split_raw(data: bytes | memoryview, head_tags: frozenset[int], raw_tag: int) -> tuple[int, list[memoryview]] | None:
    """Where a serialized infer message's raw contents (the repeated bytes field of tag
    `raw_tag`) begin, and each of them as a view; None unless every field before them has
    one of `head_tags` and they come last, after every other field (as protobuf and the
    sidecars write them), or for bytes cut short (the full parse then says how).
    `fields` walks any message; this reads only length-delimited fields of one-byte tags,
    without a tuple per field, as it runs on every request or answer."""
    view = memoryview(data)
    end = len(data)
    at = 0
    head_end = -1
    raws = []
    try:
        while at < end:
            start = at
            tag = data[at]
            size = data[at + 1]
            at += 2
            if size > 0x7F:  # a length of more than one byte
                size, at = read_varint(data, at - 1)
            if tag == raw_tag:
                if head_end < 0:
                    head_end = start
                raws.append(view[at : at + size])
            elif tag not in head_tags or head_end >= 0:
                return None
            at += size
    except (IndexError, ValueError):
        return None
    return (head_end, raws) if head_end >= 0 and at == end else None
