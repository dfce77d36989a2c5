"""ModelInferResponse building: requested outputs in request order, one raw entry per
output, and Triton's classification strings for outputs asked for top-k classes."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from protos import codec, wire
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
        array = _output(signature, request, outputs, wanted.name)
        if array is None:  # a python model may leave a requested output out, as in Triton
            continue
        if wanted.class_count > 0:
            array = classify(array, wanted.class_count, batched, labels.get(wanted.name, []))
            datatype = _BYTES
        else:
            datatype = signature.outputs[wanted.name].datatype
        response.outputs.add(name=wanted.name, datatype=datatype.name, shape=array.shape)
        raw.append(codec.to_raw(array, datatype))
    return response


def encode_response(
    model: str, version: str, signature: Signature, request: ValidRequest, outputs: Mapping[str, np.ndarray]
) -> bytes | None:
    """build_response(...).SerializeToString(), byte for byte, written without building the
    message: each output's metadata (and, for a fixed-size type, its raw field's tag and
    length) is serialized once per (name, datatype, shape) and kept on the signature. None
    where an output asks for classification (build_response then)."""
    parts = [_head(model, version)]
    if request.id:
        parts.append(wire.length_delimited(_ID, request.id.encode()))
    raws: list[bytes] = []
    for wanted in request.outputs:
        if wanted.class_count > 0:
            return None
        array = _output(signature, request, outputs, wanted.name)
        if array is None:
            continue
        datatype = signature.outputs[wanted.name].datatype
        key = (wanted.name, datatype.name, array.shape)
        entry = signature.encoded_outputs.get(key)
        data = codec.to_raw(array, datatype)
        if entry is None:
            tensor = pb.ModelInferResponse.InferOutputTensor(
                name=wanted.name, datatype=datatype.name, shape=array.shape
            )
            # A fixed-size type's bytes have one length per shape: their field's tag and
            # length are written once too (None for BYTES, whose length varies).
            lead = _RAW_TAG + wire.varint(len(data)) if datatype.size else None
            entry = (wire.length_delimited(_OUTPUT, tensor.SerializeToString()), lead)
            signature.encoded_outputs.remember(key, entry)
        metadata, lead = entry
        parts.append(metadata)
        raws += (lead or _RAW_TAG + wire.varint(len(data)), data)  # joined once, with the rest
    return b"".join(parts + raws)


def _output(
    signature: Signature, request: ValidRequest, outputs: Mapping[str, np.ndarray], name: str
) -> np.ndarray | None:
    """The model's output `name` in the config's shape (its reshape undone); None if left out."""
    array = outputs.get(name)
    spec = signature.outputs[name]
    if array is None or spec.reshape is None:
        return array
    return array.reshape([request.batch_size, *spec.dims] if signature.max_batch_size > 0 else list(spec.dims))


# ModelInferResponse's fields written here: id (3), outputs (5), raw_output_contents (6,
# its tag written out). model_name (1) and model_version (2) come first, in _head.
_ID, _OUTPUT = 3, 5
_RAW_TAG = wire.varint(6 << 3 | wire.LENGTH_DELIMITED)


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
