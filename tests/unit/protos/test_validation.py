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
