"""protos.validation's in-process rules that no end-to-end test reaches alone."""

from __future__ import annotations

import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from protos.model_config_pb2 import TYPE_INT32, ModelConfig, ModelInput
from protos.status import TurnoutError
from protos.validation import PLAIN_PARAMETERS, Signature, validate

SIGNATURE = Signature(ModelConfig(name="m", input=[ModelInput(name="X", data_type=TYPE_INT32, dims=[1])]))


def _request(**parameters: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="X", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    for key, value in parameters.items():
        parameter = request.parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        else:
            parameter.string_param = str(value)
    return request


def test_plain_parameters_are_all_the_models_own() -> None:
    # A generate request's keys: Triton hands them to the model as they are.
    keys = {"timeout": "soon", "priority": 5, "sequence_id": 3, "triton_x": True, "binary_data_output": 1}
    valid = validate(_request(**keys, **{PLAIN_PARAMETERS: True}), SIGNATURE)
    assert (valid.priority, valid.timeout_us, valid.sequence) == (0, None, None)
    assert valid.parameters == keys
    with pytest.raises(TurnoutError):  # without the mark, each is checked as Triton's fronts check it
        validate(_request(**keys), SIGNATURE)


BATCHED = Signature(
    ModelConfig(
        name="b",
        max_batch_size=8,
        input=[
            ModelInput(name="A", data_type=TYPE_INT32, dims=[2]),
            ModelInput(name="B", data_type=TYPE_INT32, dims=[2]),
        ],
    )
)


def _batched(shapes: dict[str, list[int]], sizes: dict[str, int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="b")
    for name, shape in shapes.items():
        request.inputs.add(name=name, datatype="INT32", shape=shape)
        request.raw_input_contents.append(b"\0" * sizes[name])
    return request


def test_a_negative_batch_dim_is_a_huge_batch_as_core_keeps_it() -> None:
    # Core keeps the batch size in a uint32 and compares each input's dim as an int64 (B
    # comes first in core's order): -3 sets 4294967293, which no -3 or 0 matches.
    mismatch = "[request id: <id_unknown>] input 'A' batch size does not match other inputs for 'b'"
    for shapes in ({"A": [-3, 2], "B": [-3, 2]}, {"A": [0, 2], "B": [-3, 2]}):
        with pytest.raises(TurnoutError) as caught:
            validate(_batched(shapes, {"A": 8, "B": 8}), BATCHED)
        assert caught.value.message == mismatch
    with pytest.raises(TurnoutError) as caught:
        validate(_batched({"A": [-3, 2], "B": [0, 2]}, {"A": 8, "B": 8}), BATCHED)
    assert caught.value.message == "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'b'"


def test_data_for_a_batch_of_zero_rows_is_refused_after_tritons_own_checks() -> None:
    # B's bytes fit the shape without its batch dim; A's do not: A's mismatch is Triton's answer.
    with pytest.raises(TurnoutError) as caught:
        validate(_batched({"A": [0, 2], "B": [0, 2]}, {"A": 0, "B": 8}), BATCHED)
    assert "input byte size mismatch for input 'A'" in caught.value.message
    with pytest.raises(TurnoutError) as caught:
        validate(_batched({"A": [0, 2], "B": [0, 2]}, {"A": 8, "B": 8}), BATCHED)
    assert "holds data but a batch size of 0" in caught.value.message


def test_grpc_sequence_ids_and_timeouts_take_only_tritons_kinds() -> None:
    request = _request()
    request.parameters["sequence_id"].uint64_param = 3
    with pytest.raises(TurnoutError) as caught:
        validate(request, SIGNATURE)
    assert (
        caught.value.message == "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
    )
    request = _request()
    request.parameters["timeout"].uint64_param = 3
    with pytest.raises(TurnoutError) as caught:
        validate(request, SIGNATURE)
    assert caught.value.message == "invalid value type for 'timeout' parameter, expected int64_param."
