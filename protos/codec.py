"""Tensor bytes as the protocol lays them out: little-endian, row-major, and BYTES
elements each prefixed by a uint32 little-endian length; and the tensor of a raw binary
HTTP body, whose shape Triton deduces from the model's config.

Sidecars decode once, into numpy; the gateway only needs these for JSON, shm and raw bodies.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME, BY_NAME, DataType
from protos.status import invalid_arg

_LENGTH = struct.Struct("<I")
# Marks the one input of a raw binary HTTP body until the gateway deduces its tensor.
RAW_BINARY_PARAMETER = "turnout_raw_binary"
# Triton's name for that input, which its errors about the data keep using.
RAW_INPUT_NAME = "raw_input"


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
    assert datatype.wire is not None
    expected = count * datatype.size
    if len(buffer) != expected:
        raise CodecError(f"expected {expected} bytes, got {len(buffer)}")
    return np.frombuffer(buffer, dtype=datatype.wire).reshape(shape)


def to_raw(array: np.ndarray, datatype: DataType) -> bytes:
    """The protocol bytes of an array."""
    if datatype.name == "BYTES":
        return serialize_bytes(array.reshape(-1))
    assert datatype.wire is not None
    return np.ascontiguousarray(array, dtype=datatype.wire).tobytes()


def shape_text(dims: Iterable[int]) -> str:
    """Triton's spelling of a shape in its messages: `[1,3,224]`, no spaces; `[]` when empty."""
    return "[" + ",".join(str(d) for d in dims) + "]"


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
    """Flat JSON `data` for a raw tensor: numbers, booleans, or strings for BYTES. Triton
    writes BYTES into JSON strings as they are, so bytes that are not UTF-8 come back
    surrogate-escaped: encode the document with errors="surrogateescape" to write them."""
    if datatype.name == "BYTES":
        return [e.decode("utf-8", errors="surrogateescape") for e in deserialize_bytes(buffer)]
    array = from_raw(buffer, datatype, shape)
    return array.reshape(-1).tolist()


def datatype(name: str) -> DataType | None:
    return BY_NAME.get(name)


def is_raw_binary(request: pb.ModelInferRequest) -> bool:
    """Whether `request` is a raw binary body still waiting for `deduce_raw_input`."""
    return len(request.inputs) == 1 and RAW_BINARY_PARAMETER in request.inputs[0].parameters


def deduce_raw_input(request: pb.ModelInferRequest, config: mc.ModelConfig) -> None:
    """Give a raw binary request's input its name, datatype and shape from the model's
    config, as Triton core's InferenceRequest::Normalize does: `[1] + dims` for a batching
    model (`dims` otherwise), the one variable dim taking what the body holds; a BYTES
    body is the one element of an input of shape [1]. Raises Triton's errors."""
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    model = request.model_name
    if len(config.input) != 1:
        raise invalid_arg(
            f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got {len(config.input)} "
            f"inputs in '{model}' model configuration"
        )
    spec = config.input[0]
    shape = [1] if config.max_batch_size != 0 else []
    variable = -1
    fixed_count = 1
    for dim in spec.dims:
        if dim == -1:
            if variable != -1:
                raise invalid_arg(
                    f"{prefix}The shape of the raw input '{spec.name}' can not be deduced because there are more "
                    "than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            fixed_count *= dim
        shape.append(dim)
    datatype = BY_CONFIG_NAME[mc.DataType.Name(spec.data_type)]
    data = request.raw_input_contents[0]
    if datatype.name == "BYTES":
        if variable != -1 or fixed_count != 1:
            raise invalid_arg(f"{prefix}For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        request.raw_input_contents[0] = _LENGTH.pack(len(data)) + data
    else:
        if variable != -1:
            shape[variable] = len(data) // fixed_count // datatype.size if fixed_count else 0
        expected = element_count(shape) * datatype.size
        if len(data) != expected:
            raise invalid_arg(
                f"{prefix}input byte size mismatch for input '{RAW_INPUT_NAME}' for model '{model}'. "
                f"Expected {expected}, got {len(data)}"
            )
    tensor = request.inputs[0]
    del tensor.parameters[RAW_BINARY_PARAMETER]
    tensor.name = spec.name
    tensor.datatype = datatype.name
    tensor.shape[:] = shape


def set_parameter(parameter: pb.InferParameter, value: bool | int | float | str) -> None:
    """A request or response parameter from a plain value, in the field its type takes;
    TypeError for any other value."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    elif isinstance(value, str):
        parameter.string_param = value
    else:
        raise TypeError(f"a parameter is a string, a number or a boolean, not {type(value).__name__}")
