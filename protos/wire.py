"""Protobuf's wire format written and read by hand, for the few places that touch bytes
received from a peer instead of parsing and re-encoding the whole message: a parser
merges an appended field into the message (a later scalar wins, a map gains the entry),
and `fields` walks a message's top-level fields without decoding their contents.
`serialize_infer` writes an infer message's tensor bytes itself, as upb's encoder is
slow on large ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

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


# The tensor bytes of each infer message: its last field, so upb writes them after all the
# others and appending them by hand gives the same bytes.
_RAW_FIELDS = {
    "inference.ModelInferRequest": "raw_input_contents",
    "inference.ModelInferResponse": "raw_output_contents",
}
# upb's encoder (protobuf 6.33, measured) writes a message under about 32 KB as fast as a
# copy and a larger one at about 2.5 ms a MB, some 90 times a copy.
_BY_HAND_FROM = 32 * 1024


def serialize_infer(message: Any) -> bytes:
    """`message.SerializeToString()`, byte for byte, for a ModelInferRequest or
    ModelInferResponse: where its tensor bytes are large, the rest of the message is
    serialized alone and the tensors are appended as length-delimited fields, which
    costs a few copies of them instead of upb's encoder."""
    name = _RAW_FIELDS[message.DESCRIPTOR.full_name]
    raw = getattr(message, name)
    contents = list(raw)
    if sum(map(len, contents)) < _BY_HAND_FROM:
        return bytes(message.SerializeToString())
    del raw[:]
    try:
        head = message.SerializeToString()
    finally:
        raw.extend(contents)  # the caller's message stays as it was
    tag = varint(message.DESCRIPTOR.fields_by_name[name].number << 3 | LENGTH_DELIMITED)
    parts = [head]
    for content in contents:
        parts += (tag, varint(len(content)), content)
    return b"".join(parts)


def serialize_stream_infer(message: Any) -> bytes:
    """`message.SerializeToString()`, byte for byte, for a ModelStreamInferResponse, its
    infer response serialized by serialize_infer."""
    if not message.HasField("infer_response"):
        return bytes(message.SerializeToString())
    fields = message.DESCRIPTOR.fields_by_name
    head = b""
    if message.error_message:
        head = length_delimited(fields["error_message"].number, message.error_message.encode())
    return head + length_delimited(fields["infer_response"].number, serialize_infer(message.infer_response))
