"""Protobuf's wire format written by hand, for the few places that append a field to
bytes received from a peer instead of parsing and re-encoding the whole message:
a parser merges an appended field into the message (a later scalar wins, a map gains
the entry)."""

from __future__ import annotations


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
