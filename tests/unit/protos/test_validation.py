"""protos.validation's in-process rules that no end-to-end test reaches alone."""

from __future__ import annotations

import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from protos.model_config_pb2 import (
    TYPE_FP32,
    TYPE_INT32,
    TYPE_STRING,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTensorReshape,
)
from protos.status import TurnoutError
from protos.validation import FORMS_PER_SIGNATURE, PLAIN_PARAMETERS, Signature, ValidRequest, validate

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


RESHAPED = ModelConfig(
    name="r",
    max_batch_size=4,
    input=[
        ModelInput(name="A", data_type=TYPE_INT32, dims=[4], reshape=ModelTensorReshape(shape=[2, 2])),
        ModelInput(name="B", data_type=TYPE_FP32, dims=[-1]),
    ],
    output=[
        ModelOutput(name="Y", data_type=TYPE_FP32, dims=[-1]),
        ModelOutput(name="Z", data_type=TYPE_FP32, dims=[1]),
    ],
)


def _two_inputs(rows: int, width: int, seed: int, outputs: tuple[str, ...] = ()) -> pb.ModelInferRequest:
    rng = np.random.default_rng(seed)
    request = pb.ModelInferRequest(model_name="r", id=f"request {seed}")
    # B before A: core walks them in its own order, which the decoded inputs keep.
    request.inputs.add(name="B", datatype="FP32", shape=[rows, width])
    request.raw_input_contents.append(rng.random((rows, width), dtype=np.float32).tobytes())
    request.inputs.add(name="A", datatype="INT32", shape=[rows, 4])
    request.raw_input_contents.append(rng.integers(0, 100, (rows, 4), dtype=np.int32).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def _fields(valid: ValidRequest) -> tuple[object, ...]:
    inputs = [(name, array.dtype, array.shape, array.tobytes()) for name, array in valid.inputs.items()]
    return (valid.id, inputs, valid.batch_size, valid.key, valid.outputs, valid.priority, valid.timeout_us)


def test_a_request_of_a_form_found_valid_has_only_its_sizes_checked_and_decodes_alike() -> None:
    remembering = Signature(RESHAPED)
    forms = [(1, 3, ()), (2, 3, ("Z",)), (1, 5, ("Z", "Y")), (2, 3, ()), (1, 3, ())]
    for seed, (rows, width, outputs) in enumerate(forms * 2):
        request = _two_inputs(rows, width, seed, outputs)
        # A fresh signature checks the request in full; the remembering one, from the
        # second round on, by its form.
        assert _fields(validate(request, remembering)) == _fields(validate(request, Signature(RESHAPED)))
    assert len(remembering.forms) == 4  # (1, 3, ()) came twice in each round
    valid = validate(_two_inputs(2, 3, 7), remembering)
    assert list(valid.inputs) == ["A", "B"] and valid.inputs["A"].shape == (2, 2, 2)


def test_a_remembered_form_with_the_wrong_bytes_gets_the_full_checks_answer() -> None:
    remembering = Signature(RESHAPED)
    validate(_two_inputs(2, 3, 0), remembering)
    short = _two_inputs(2, 3, 1)
    short.raw_input_contents[1] = short.raw_input_contents[1][:-4]
    for signature in (remembering, Signature(RESHAPED)):
        with pytest.raises(TurnoutError) as caught:
            validate(short, signature)
        assert caught.value.message == (
            "[request id: request 1] input byte size mismatch for input 'A' for model 'r'. Expected 32, got 28"
        )


def test_only_requests_whose_form_is_all_the_checks_read_are_remembered() -> None:
    remembering = Signature(RESHAPED)
    with_priority = _two_inputs(1, 3, 0)
    with_priority.parameters["priority"].int64_param = 3
    assert validate(with_priority, remembering).priority == 3
    with_classification = _two_inputs(1, 3, 1, ("Y",))
    with_classification.outputs[0].parameters["classification"].int64_param = 2
    assert validate(with_classification, remembering).outputs[0].class_count == 2
    strings = Signature(ModelConfig(name="s", input=[ModelInput(name="S", data_type=TYPE_STRING, dims=[1])], output=[]))
    text = pb.ModelInferRequest(model_name="s")
    text.inputs.add(name="S", datatype="BYTES", shape=[1])
    text.raw_input_contents.append(len(b"hi").to_bytes(4, "little") + b"hi")
    assert validate(text, strings).inputs["S"].tolist() == [b"hi"]
    assert remembering.forms == {} == strings.forms


def test_forms_are_forgotten_past_their_bound() -> None:
    remembering = Signature(RESHAPED)
    for width in range(1, FORMS_PER_SIGNATURE + 2):
        validate(_two_inputs(1, width, width), remembering)
        assert 1 <= len(remembering.forms) <= FORMS_PER_SIGNATURE
    assert len(remembering.forms) == 1  # the 65th cleared them and was remembered alone
