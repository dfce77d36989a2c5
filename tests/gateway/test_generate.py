"""The generate extension's body -> ModelInferRequest, against what Triton's HTTP server
does with the same body (each row checked side by side with a running Triton)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.http.generate import generate_request, generate_response
from protos import codec
from protos.grpc_service_pb2 import ModelInferRequest, ModelInferResponse
from protos.model_config_pb2 import TYPE_FP16, TYPE_INT32, TYPE_STRING, ModelConfig, ModelInput
from protos.status import Status, TurnoutError
from protos.validation import PLAIN_PARAMETERS

LIMIT = 64 * 2**20


def _simple(max_batch_size: int = 8) -> ModelConfig:
    return ModelConfig(
        name="simple",
        max_batch_size=max_batch_size,
        input=[
            ModelInput(name="INPUT0", data_type=TYPE_INT32, dims=[16]),
            ModelInput(name="INPUT1", data_type=TYPE_INT32, dims=[16]),
        ],
    )


def _convert(body: object, config: ModelConfig | None = None, limit: int = LIMIT) -> ModelInferRequest:
    return generate_request(body, "simple", "", config or _simple(), limit)


def _refusal(body: object, config: ModelConfig | None = None, limit: int = LIMIT) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        _convert(body, config, limit)
    return caught.value.status, caught.value.message


def _input(request: ModelInferRequest, name: str) -> tuple[list[int], np.ndarray]:
    index = [tensor.name for tensor in request.inputs].index(name)
    tensor = request.inputs[index]
    return list(tensor.shape), np.frombuffer(request.raw_input_contents[index], np.int32)


def test_fixed_dims_take_their_share_and_the_batch_dim_the_rest() -> None:
    request = _convert({"INPUT0": list(range(32)), "INPUT1": [1] * 32})
    shape, values = _input(request, "INPUT0")
    assert shape == [2, 16]  # a batch of two rows, as Triton makes it
    assert values.tolist() == list(range(32))
    fixed = ModelConfig(name="m", input=[ModelInput(name="X", data_type=TYPE_INT32, dims=[2, 8])])
    assert _input(_convert({"X": list(range(16))}, fixed), "X")[0] == [2, 8]
    inner = ModelConfig(name="m", max_batch_size=4, input=[ModelInput(name="X", data_type=TYPE_INT32, dims=[-1])])
    assert _input(_convert({"X": [1, 2, 3]}, inner), "X")[0] == [1, 3]  # the innermost variable dim
    assert _input(_convert({"X": 7}, inner), "X")[0] == [1, 1]  # a scalar is one element


@pytest.mark.parametrize(
    "value",
    [list(range(8)), [[list(range(16))]], [list(range(16))] * 2, None, True, 7, "abc", [0] * 14 + [[1, 2]]],
)
def test_elements_the_shape_cannot_hold(value: object) -> None:
    # The outer array's length is what the shape must divide: nested arrays count as one.
    assert _refusal({"INPUT0": value, "INPUT1": [1] * 16}) == (
        Status.INVALID_ARG,
        "The schema can not convert input 'INPUT0' to tensor with proper shape",
    )


def test_data_is_read_as_the_infer_path_reads_it() -> None:
    nested = _convert({"INPUT0": [0] * 15 + [[1]], "INPUT1": [1] * 16})  # 16 scalars in all: taken
    assert _input(nested, "INPUT0")[1].tolist() == [0] * 15 + [1]
    assert _refusal({"INPUT0": [*range(15), 1.5], "INPUT1": [1] * 16}) == (
        Status.INTERNAL,
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    )
    assert _refusal({"INPUT0": [list(range(8))] * 2 + [0] * 14, "INPUT1": [1] * 16}) == (
        Status.INTERNAL,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    )
    wrapped = _convert({"INPUT0": [2**40 + 5] * 16, "INPUT1": [1] * 16})  # C's cast, as Triton
    assert _input(wrapped, "INPUT0")[1].tolist() == [5] * 16
    half = ModelConfig(name="m", input=[ModelInput(name="H", data_type=TYPE_FP16, dims=[1])])
    assert _refusal({"H": 1.0}, half) == (
        Status.INVALID_ARG,
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input H",
    )


def test_strings_and_an_empty_input() -> None:
    text = ModelConfig(name="m", max_batch_size=2, input=[ModelInput(name="T", data_type=TYPE_STRING, dims=[1])])
    request = _convert({"T": "hello"}, text)
    assert list(request.inputs[0].shape) == [1, 1]
    assert codec.deserialize_bytes(request.raw_input_contents[0]) == [b"hello"]
    assert _refusal({"T": [3]}, text) == (
        Status.INTERNAL,
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
    )
    empty = _convert({"INPUT0": [], "INPUT1": [1] * 16})  # no bytes: no shape, as current Triton
    assert list(empty.inputs[0].shape) == [] and empty.raw_input_contents[0] == b""


def test_inputs_count_against_the_input_size_limit() -> None:
    assert _refusal({"INPUT1": [1] * 16, "INPUT0": [1] * 16}, limit=100) == (
        Status.INVALID_ARG,
        "request size of 64 bytes with input 'INPUT0' of size 64 bytes exceeds the maximum allowed input size of "
        "100. Use --http-max-input-size to increase the limit.",
    )


def test_other_keys_are_parameters_of_the_type_they_hold() -> None:
    body = {"INPUT0": [1] * 16, "INPUT1": [1] * 16, "s": "x", "i": -3, "b": True, "d": 0.5, "u": 2**63, "id": "r1"}
    request = _convert(body)
    kinds = {key: value.WhichOneof("parameter_choice") for key, value in request.parameters.items()}
    assert request.parameters.pop(PLAIN_PARAMETERS).bool_param  # none is read as the core's own
    del kinds[PLAIN_PARAMETERS]
    assert kinds == {
        "s": "string_param",
        "i": "int64_param",
        "b": "bool_param",
        "d": "double_param",
        "u": "double_param",  # past int64: rapidjson's number, a double
        "id": "string_param",  # the request's id, and a parameter as well
    }
    assert request.id == "r1"
    for value in (None, [1], {"a": 1}):
        assert _refusal({**body, "x": value}) == (
            Status.INVALID_ARG,
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
        )


def test_the_parameters_object_holds_inputs_or_parameters() -> None:
    request = _convert({"INPUT0": [1] * 16, "parameters": {"INPUT1": [2] * 16, "p": 1}})
    assert _input(request, "INPUT1")[0] == [1, 16]
    assert request.parameters["p"].int64_param == 1
    assert _refusal({"parameters": {"INPUT0": [1]}}) == (
        Status.INVALID_ARG,
        "Converting keyword: 'parameters': The schema can not convert input 'INPUT0' to tensor with proper shape",
    )
    assert _refusal({"parameters": []}) == (
        Status.INTERNAL,
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object",
    )
    clash = ModelConfig(name="m", input=[ModelInput(name="parameters", data_type=TYPE_INT32, dims=[1])])
    assert _refusal({"parameters": {}}, clash) == (
        Status.INVALID_ARG,
        "Keyword 'parameters' for nested schema also given as input tensor name",
    )


def test_the_answer_holds_the_response_parameters_beside_the_outputs() -> None:
    response = ModelInferResponse(model_name="m", model_version="1", id="r")
    response.parameters["echo"].string_param = "hi"
    response.parameters["count"].int64_param = 3
    response.parameters["id"].string_param = "not the id"  # the id came first: it stays
    response.parameters["triton_final_response"].bool_param = True  # the stream's flag, not the model's
    response.outputs.add(name="count", datatype="INT32", shape=[1])  # a parameter took the name
    response.raw_output_contents.append(np.array([7], dtype=np.int32).tobytes())
    response.outputs.add(name="OUT", datatype="INT32", shape=[2])
    response.raw_output_contents.append(np.array([1, 2], dtype=np.int32).tobytes())
    assert list(generate_response(response).items()) == [
        ("OUT", [1, 2]),
        ("count", 3),
        ("echo", "hi"),
        ("id", "r"),
        ("model_name", "m"),
        ("model_version", "1"),
    ]
