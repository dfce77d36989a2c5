"""ModelInferResponse building: requested outputs in request order, one raw entry per
output, and Triton's classification strings for outputs asked for top-k classes."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from protos import codec
from protos import grpc_service_pb2 as pb
from protos.datatypes import BY_NAME
from protos.validation import Signature, ValidRequest

_BYTES = BY_NAME["BYTES"]


def build_response(
    model: str,
    version: str,
    signature: Signature,
    request: ValidRequest,
    outputs: Mapping[str, np.ndarray],
    labels: Mapping[str, list[str]],
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.id)
    batched = signature.max_batch_size > 0
    raw = response.raw_output_contents
    for wanted in request.outputs:
        spec = signature.outputs[wanted.name]
        array = outputs.get(wanted.name)
        if array is None:  # a python model may leave a requested output out, as in Triton
            continue
        if spec.reshape is not None:
            array = array.reshape([request.batch_size, *spec.dims] if batched else list(spec.dims))
        if wanted.class_count > 0:
            array = classify(array, wanted.class_count, batched, labels.get(wanted.name, []))
            datatype = _BYTES
        else:
            datatype = spec.datatype
        response.outputs.add(name=wanted.name, datatype=datatype.name, shape=array.shape)
        raw.append(codec.to_raw(array, datatype))
    return response


def encode_response(
    model: str, version: str, signature: Signature, request: ValidRequest, outputs: Mapping[str, np.ndarray]
) -> bytes | None:
    """build_response(...).SerializeToString(), byte for byte, written without building the
    message: each output's metadata is serialized once per (name, datatype, shape) and kept
    on the signature. None where an output asks for classification (build_response then)."""
    batched = signature.max_batch_size > 0
    encoded = signature.encoded_outputs
    parts = [_head(model, version)]
    if request.id:
        parts += _field(_ID, request.id.encode())
    raws: list[bytes] = []
    for wanted in request.outputs:
        if wanted.class_count > 0:
            return None
        array = outputs.get(wanted.name)
        if array is None:
            continue
        spec = signature.outputs[wanted.name]
        if spec.reshape is not None:
            array = array.reshape([request.batch_size, *spec.dims] if batched else list(spec.dims))
        datatype = spec.datatype
        key = (wanted.name, datatype.name, array.shape)
        entry = encoded.get(key)
        if entry is None:
            if len(encoded) >= ENCODED_OUTPUTS_PER_SIGNATURE:  # shapes that keep changing: start over
                encoded.clear()
            tensor = pb.ModelInferResponse.InferOutputTensor(
                name=wanted.name, datatype=datatype.name, shape=array.shape
            )
            entry = encoded[key] = b"".join(_field(_OUTPUT, tensor.SerializeToString()))
        parts.append(entry)
        raws += _field(_RAW, codec.to_raw(array, datatype))
    return b"".join(parts + raws)


# Output metadata kept per signature, at most (outputs times the shapes they take).
ENCODED_OUTPUTS_PER_SIGNATURE = 256

# ModelInferResponse's length-delimited fields, as wire tags: id (3), outputs (5),
# raw_output_contents (6). model_name (1) and model_version (2) come first, in _head.
_ID = b"\x1a"
_OUTPUT = b"\x2a"
_RAW = b"\x32"


def _field(tag: bytes, value: bytes) -> tuple[bytes, bytes, bytes]:
    size = len(value)
    if size < 0x80:
        return tag, bytes((size,)), value
    varint = bytearray()
    while size >= 0x80:
        varint.append(size & 0x7F | 0x80)
        size >>= 7
    varint.append(size)
    return tag, bytes(varint), value


@functools.lru_cache(maxsize=256)
def _head(model: str, version: str) -> bytes:
    head: bytes = pb.ModelInferResponse(model_name=model, model_version=version).SerializeToString()
    return head


def classify(array: np.ndarray, class_count: int, batched: bool, labels: list[str]) -> np.ndarray:
    """Top-k "<value>:<index>[:<label>]" strings per batch row, highest value first."""
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(class_count, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for c, index in enumerate(order):
            text = f"{_value_text(row[index])}:{index}"
            if index < len(labels) and labels[index]:
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    return result if batched else result.reshape(k)


def _value_text(value: np.generic) -> str:
    """The value as C++ std::to_string writes it: "%f" for floats, plain for integers."""
    if isinstance(value, np.floating):
        return f"{float(value):f}"
    return str(int(value))


def read_labels(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\r\n") for line in handle]


def set_parameters(target: Any, parameters: Mapping[str, bool | int | str]) -> None:
    """A model's response parameters into a protobuf parameters map."""
    for key, value in parameters.items():
        codec.set_parameter(target[key], value)
