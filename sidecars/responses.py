"""ModelInferResponse building: requested outputs in request order, one raw entry per
output, and Triton's classification strings for outputs asked for top-k classes."""

from __future__ import annotations

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
