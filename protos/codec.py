"""Tensor bytes as the protocol lays them out: little-endian, row-major, and BYTES
elements each prefixed by a uint32 little-endian length.

Sidecars decode once, into numpy; the gateway only needs these for JSON and shm.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from protos.datatypes import BY_NAME, DataType

_LENGTH = struct.Struct("<I")


class CodecError(ValueError):
    """Bytes that do not hold the tensor they claim to."""


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def serialize_bytes(elements: Iterable[Any]) -> bytes:
    """Length-prefix each element (bytes, or str encoded as UTF-8) and join them."""
    parts = []
    for element in elements:
        if isinstance(element, str):
            element = element.encode()
        elif not isinstance(element, bytes | bytearray | memoryview):
            element = str(element).encode()
        parts.append(_LENGTH.pack(len(element)))
        parts.append(bytes(element))
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Split a length-prefixed buffer into its elements.

    With `count`, the buffer must hold exactly that many elements; CodecError says
    how many it held, so callers can word Triton's message.
    """
    view = memoryview(buffer)
    elements: list[bytes] = []
    offset = 0
    end = len(view)
    while offset < end:
        if offset + 4 > end:
            raise CodecError("truncated BYTES element length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise CodecError("truncated BYTES element")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(elements) != count:
        raise CodecError(f"expected {count} string elements, got {len(elements)}")
    return elements


def from_raw(buffer: bytes | memoryview, datatype: DataType, shape: Sequence[int]) -> np.ndarray:
    """Build an array from raw protocol bytes; zero-copy for fixed-size types."""
    count = element_count(shape)
    if datatype.name == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = deserialize_bytes(buffer, count)
        return array.reshape(shape)
    assert datatype.numpy is not None
    expected = count * datatype.size
    if len(buffer) != expected:
        raise CodecError(f"expected {expected} bytes, got {len(buffer)}")
    return np.frombuffer(buffer, dtype=datatype.numpy.newbyteorder("<")).reshape(shape)


def to_raw(array: np.ndarray, datatype: DataType) -> bytes:
    """The protocol bytes of an array."""
    if datatype.name == "BYTES":
        return serialize_bytes(array.reshape(-1))
    assert datatype.numpy is not None
    return np.ascontiguousarray(array, dtype=datatype.numpy.newbyteorder("<")).tobytes()


def raw_byte_size(datatype: DataType, shape: Sequence[int]) -> int | None:
    """Bytes a tensor of this type and shape takes, or None for BYTES."""
    if datatype.name == "BYTES":
        return None
    return element_count(shape) * datatype.size


def from_contents(values: Sequence[Any], datatype: DataType, shape: Sequence[int]) -> np.ndarray:
    """Build an array from typed values (gRPC InferTensorContents or JSON `data`, flattened)."""
    count = element_count(shape)
    if len(values) != count:
        raise CodecError(f"expected {count} elements, got {len(values)}")
    if datatype.name == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
        return array.reshape(shape)
    assert datatype.numpy is not None
    return np.asarray(values, dtype=datatype.numpy).reshape(shape)


def to_json_data(buffer: bytes | memoryview, datatype: DataType, shape: Sequence[int]) -> list[Any]:
    """Flat JSON `data` for a raw tensor: numbers, booleans, or strings for BYTES."""
    if datatype.name == "BYTES":
        return [e.decode("utf-8", errors="replace") for e in deserialize_bytes(buffer)]
    array = from_raw(buffer, datatype, shape)
    return array.reshape(-1).tolist()


def datatype(name: str) -> DataType | None:
    return BY_NAME.get(name)
