"""Triton's generate extension: `POST .../generate` and `.../generate_stream` bodies into a
ModelInferRequest, and each response back into the flat JSON object the extension returns
(`generate_stream` sends each as one server-sent event).

A body's keys that name an input of the model are that input (a JSON scalar is one
element, an array its elements, with the batch dimension added for a batching model); the
`parameters` object and any other key are request parameters; `id` is the request's id."""

from __future__ import annotations

from typing import Any

from protos import codec
from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME
from protos.status import internal, invalid_arg


def generate_request(document: Any, name: str, version: str, config: mc.ModelConfig) -> pb.ModelInferRequest:
    # Triton's texts and statuses: a TritonJson accessor's failure is INTERNAL.
    if not isinstance(document, dict):
        raise internal("attempt to get members for non-object")
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    if "id" in document:  # read before the rest
        if not isinstance(document["id"], str):
            raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = document["id"]
    inputs = {tensor.name: tensor for tensor in config.input}
    for key, value in document.items():
        if key == "id":
            continue
        if key == "parameters":
            if not isinstance(value, dict):
                raise internal(
                    "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"
                )
            for parameter, setting in value.items():
                _set_parameter(request, parameter, setting)
        elif key in inputs:
            _add_input(request, inputs[key], value, batched=config.max_batch_size > 0)
        else:
            _set_parameter(request, key, value)
    return request


def _add_input(request: pb.ModelInferRequest, tensor: mc.ModelInput, value: Any, batched: bool) -> None:
    datatype = BY_CONFIG_NAME[mc.DataType.Name(tensor.data_type)]
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, (list, dict)) for v in values):
        raise invalid_arg(f"generate input '{tensor.name}' must be a scalar or an array of scalars")
    shape = [1, len(values)] if batched else [len(values)]
    try:
        array = codec.from_contents(values, datatype, shape)
    except (ValueError, TypeError) as exc:
        raise invalid_arg(f"generate input '{tensor.name}': {exc}") from exc
    request.inputs.add(name=tensor.name, datatype=datatype.name, shape=shape)
    request.raw_input_contents.append(codec.to_raw(array, datatype))


def _set_parameter(request: pb.ModelInferRequest, key: str, value: Any) -> None:
    try:
        codec.set_parameter(request.parameters[key], value)
    except TypeError:
        del request.parameters[key]
        raise invalid_arg(f"generate parameter '{key}' must be a string, number or boolean") from None


def generate_response(response: pb.ModelInferResponse) -> dict[str, Any]:
    """The extension's response object: model name and version, the id, and each output by
    name, one element as a scalar, more as a flat array; keys in Triton's order (sorted,
    so upper-case output names come first)."""
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for index, output in enumerate(response.outputs):
        datatype = codec.datatype(output.datatype)
        if datatype is None or index >= len(response.raw_output_contents):
            continue
        data = codec.to_json_data(response.raw_output_contents[index], datatype, list(output.shape))
        document[output.name] = data[0] if len(data) == 1 else data
    return dict(sorted(document.items()))
