"""Triton's datatype helpers for python models: config type names and numbers to numpy
types and back, and BYTES tensors to and from their length-prefixed buffer."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# The config enum's numbers (TYPE_BOOL = 1 ... TYPE_STRING = 13), as Triton's helpers take them.
_NUMBERED = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64]
_NUMBERED += [np.float16, np.float32, np.float64, np.object_]


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMBERED[data_type - 1] if 1 <= data_type <= len(_NUMBERED) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type == np.bytes_:
        return 13
    for number, numpy_type in enumerate(_NUMBERED, start=1):
        if data_type == numpy_type:
            return number
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """BYTES elements as one buffer of length-prefixed items, in C order."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for element in input_tensor.reshape(-1):
        item = element if isinstance(element, bytes) else str(element).encode("utf-8")
        parts += [struct.pack("<I", len(item)), item]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)
