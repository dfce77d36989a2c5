"""Triton's generate extension: `POST .../generate` and `.../generate_stream` bodies into a
ModelInferRequest, and each response back into the flat JSON object the extension returns
(`generate_stream` sends each as one server-sent event).

Each key of a body is read as Triton's HTTP server reads it, in the body's order: a key
that names an input of the model is that input (a JSON scalar one element, an array its
elements, shaped by the model's input shape: fixed dims take their share of the elements
and the innermost variable dim the rest); any other key is a request parameter, `id`
included (it is also the request's id); the `parameters` object holds more of either."""

from __future__ import annotations

import sys
from typing import Any

from gateway.http.parsing import json_strings, json_values
from protos import codec
from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME
from protos.status import TurnoutError, internal, invalid_arg, unsupported
from protos.validation import PLAIN_PARAMETERS

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DOUBLE_MAX = int(sys.float_info.max)
_NESTED = "parameters"  # the one key whose object holds more keys
_FINAL_FLAG = "triton_final_response"  # the gRPC stream's flag, no parameter of the model's


class _Conversion:
    """One body's conversion: the model's inputs, and the input bytes taken so far
    (Triton's limit counts them across inputs)."""

    def __init__(self, request: pb.ModelInferRequest, config: mc.ModelConfig, max_input_size: int) -> None:
        self.request = request
        self.inputs = {tensor.name: tensor for tensor in config.input}
        self.batched = config.max_batch_size > 0
        self.max_input_size = max_input_size
        self.consumed = 0

    def members(self, document: dict[str, Any], top: bool) -> None:
        for key, value in document.items():
            if top and key == _NESTED:
                self.nested(value)
            else:
                self.exact(key, value)

    def nested(self, value: Any) -> None:
        if _NESTED in self.inputs:
            raise invalid_arg(f"Keyword '{_NESTED}' for nested schema also given as input tensor name")
        if not isinstance(value, dict):  # TritonJson's failure: INTERNAL
            raise internal(
                f"Expected JSON object for keyword: '{_NESTED}': attempt to access JSON non-object as object"
            )
        try:
            self.members(value, top=False)
        except TurnoutError as error:
            raise TurnoutError(error.status, f"Converting keyword: '{_NESTED}': {error.message}") from None

    def exact(self, key: str, value: Any) -> None:
        tensor = self.inputs.get(key)
        if tensor is None:
            _set_parameter(self.request, key, value)
        else:
            self.add_input(tensor, value)

    def add_input(self, tensor: mc.ModelInput, value: Any) -> None:
        name = tensor.name
        datatype = BY_CONFIG_NAME[mc.DataType.Name(tensor.data_type)]
        data = value if isinstance(value, list) else [value]
        count = len(data)  # the elements of the outer array; nested arrays are walked later
        strings: list[bytes] | None = None
        if datatype.name == "BYTES":
            strings = json_strings(data)
            byte_size = sum(len(s) + 4 for s in strings)
        elif datatype.size:
            byte_size = count * datatype.size
        else:
            raise invalid_arg(f"input '{name}' has unsupported datatype {datatype.name}")
        if byte_size == 0:  # nothing to shape: the input goes without a shape or data
            self.request.inputs.add(name=name, datatype=datatype.name)
            self.request.raw_input_contents.append(b"")
            return
        if byte_size + self.consumed > self.max_input_size:
            raise invalid_arg(
                f"request size of {self.consumed} bytes with input '{name}' of size {byte_size} bytes exceeds the "
                f"maximum allowed input size of {self.max_input_size}. Use --http-max-input-size to increase the limit."
            )
        self.consumed += byte_size
        shape = _shape(name, count, [-1, *tensor.dims] if self.batched else list(tensor.dims))
        raw = codec.serialize_bytes(strings) if strings is not None else json_values(data, name, datatype.name, count)
        self.request.inputs.add(name=name, datatype=datatype.name, shape=shape)
        self.request.raw_input_contents.append(raw)


def generate_request(
    document: Any, name: str, version: str, config: mc.ModelConfig, max_input_size: int
) -> pb.ModelInferRequest:
    # Triton's texts and statuses: a TritonJson accessor's failure is INTERNAL.
    if not isinstance(document, dict):
        raise internal("attempt to get members for non-object")
    request = pb.ModelInferRequest(model_name=name, model_version=version)
    if "id" in document:  # read before the rest
        if not isinstance(document["id"], str):
            raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = document["id"]
    _Conversion(request, config, max_input_size).members(document, top=True)
    if request.parameters:  # Triton passes them as they are: none is priority, timeout or a sequence
        request.parameters[PLAIN_PARAMETERS].bool_param = True
    return request


def _shape(name: str, count: int, dims: list[int]) -> list[int]:
    """Triton's two passes: each fixed dim, innermost first, takes its share of `count`;
    the innermost variable dim takes what is left, any other variable dim is 1."""
    shape = list(dims)
    left = count
    for dim in reversed(shape):
        if dim != -1:
            if dim <= 0 or left % dim:
                raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= dim
    for index in reversed(range(len(shape))):
        if shape[index] == -1:
            shape[index], left = left, 1
    if left != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def _set_parameter(request: pb.ModelInferRequest, key: str, value: Any) -> None:
    """A key that names no input, as Triton keeps it: a string, an integer that fits
    int64, a boolean, or any other number as a double."""
    parameter = request.parameters[key]
    if isinstance(value, str):
        parameter.string_param = value
    elif isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    elif isinstance(value, int):
        if abs(value) > _DOUBLE_MAX:  # rapidjson refuses the document
            del request.parameters[key]
            raise internal("failed to parse the request JSON buffer: Number too big to be stored in double.")
        parameter.double_param = float(value)
    else:
        del request.parameters[key]
        raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def generate_response(response: pb.ModelInferResponse) -> dict[str, Any]:
    """The extension's response object: model name and version, the id, the response's
    parameters, and each output by name (one element as a scalar, more as a flat array); a
    name taken earlier in that list keeps its value, and the keys come in Triton's order
    (sorted, so upper-case output names come first)."""
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for key, parameter in response.parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which == "bytes_param":
            raise unsupported(
                f"Response parameter '{key}' has type 'TRITONSERVER_PARAMETER_BYTES' which is not currently supported"
            )
        if which is not None and key not in document and key != _FINAL_FLAG:
            document[key] = getattr(parameter, which)
    for index, output in enumerate(response.outputs):
        datatype = codec.datatype(output.datatype)
        if datatype is None or index >= len(response.raw_output_contents) or output.name in document:
            continue
        data = codec.to_json_data(response.raw_output_contents[index], datatype, list(output.shape))
        document[output.name] = data[0] if len(data) == 1 else data
    return dict(sorted(document.items()))
