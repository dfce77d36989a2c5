"""The tensorrt backend's instance load checks over hand-built engine descriptions: the
instance kind, ValidateIO, and the checks made as each tensor is bound, each refusal
with Triton's status and exact text."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.backend_checks import refuse_optional_inputs
from sidecars.tensorrt.checks import check_bindings, check_instance_kind, validate_io
from sidecars.tensorrt.engine import EngineTensor, Profile

PROFILE = Profile((1, 16), (4, 16), (8, 16))
ENGINE = [
    EngineTensor("INPUT0", True, "INT32", (-1, 16), (PROFILE,)),
    EngineTensor("INPUT1", True, "INT32", (-1, 16), (PROFILE,)),
    EngineTensor("OUTPUT0", False, "FLOAT", (-1, 16)),
]
GOOD = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def config(text: str) -> mc.ModelConfig:
    parsed = mc.ModelConfig(name="plan")
    text_format.Parse(text, parsed)
    return parsed


def refusal(text: str, engine: list[EngineTensor] = ENGINE) -> tuple[Status, str]:
    parsed = config(text)
    with pytest.raises(TurnoutError) as caught:
        validate_io(parsed, engine)
        check_bindings(parsed, engine, "plan_0")
    return caught.value.status, caught.value.message


def test_a_matching_config_passes() -> None:
    validate_io(config(GOOD), ENGINE)
    check_bindings(config(GOOD), ENGINE, "plan_0")


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_MODEL"])
def test_only_gpu_instances_are_taken(kind: str) -> None:
    group = config(f"instance_group [ {{ kind: {kind} }} ]").instance_group[0]
    with pytest.raises(TurnoutError) as caught:
        check_instance_kind(config(GOOD), group)
    assert (caught.value.status, caught.value.message) == (
        Status.INVALID_ARG,
        "unable to load model 'plan', TensorRT backend supports only GPU device",
    )


def test_optional_inputs_are_refused() -> None:
    with pytest.raises(TurnoutError) as caught:
        refuse_optional_inputs(config(GOOD.replace("dims: [ 16 ] }, {", "dims: [ 16 ] optional: true }, {")))
    assert (caught.value.status, caught.value.message) == (
        Status.INVALID_ARG,
        "'optional' is set to true for input 'INPUT0' while the backend model doesn't support optional input",
    )


def test_more_inputs_than_the_engine_has_are_refused() -> None:
    text = GOOD.replace("input [ ", 'input [ { name: "INPUT2" data_type: TYPE_INT32 dims: [ 16 ] }, ')
    assert refusal(text) == (
        Status.INVALID_ARG,
        "unable to load model 'plan', configuration expects 3 inputs, model provides at most 2",
    )


def test_names_the_engine_lacks_list_the_allowed_ones() -> None:
    assert refusal(GOOD.replace('"INPUT1"', '"OTHER"')) == (
        Status.INVALID_ARG,
        "unexpected inference input 'OTHER', allowed inputs are: INPUT0, INPUT1",
    )
    assert refusal(GOOD.replace('"OUTPUT0"', '"OTHER"')) == (
        Status.INVALID_ARG,
        "unexpected inference output 'OTHER', allowed outputs are: OUTPUT0",
    )


@pytest.mark.parametrize("datatype", ["TYPE_STRING", "TYPE_UINT16", "TYPE_FP64"])
def test_datatypes_tensorrt_cannot_take_are_internal(datatype: str) -> None:
    assert refusal(GOOD.replace('"OUTPUT0" data_type: TYPE_FP32', f'"OUTPUT0" data_type: {datatype}')) == (
        Status.INTERNAL,
        f"unsupported datatype {datatype} for output 'OUTPUT0' for model 'plan'",
    )


SHAPE_ENGINE = [
    EngineTensor("SHAPE", True, "INT32", (3,), (Profile((1, 2, 2), (4, 2, 2), (8, 2, 2)),), is_shape_tensor=True),
    EngineTensor("OUT", False, "FLOAT", (-1, 2, 2)),
]
SHAPE_CONFIG = """
max_batch_size: 8
input [ { name: "SHAPE" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
"""


def test_shape_tensor_flags_must_be_the_engines() -> None:
    validate_io(config(SHAPE_CONFIG), SHAPE_ENGINE)
    check_bindings(config(SHAPE_CONFIG), SHAPE_ENGINE, "plan_0")
    assert refusal(SHAPE_CONFIG.replace(" is_shape_tensor: true", ""), SHAPE_ENGINE) == (
        Status.INTERNAL,
        "input 'SHAPE' for model 'plan' is a shape tensor but the model configuration doesn't mark it as a shape "
        "tensor.",
    )
    assert refusal(GOOD.replace("dims: [ 16 ] }, {", "dims: [ 16 ] is_shape_tensor: true }, {")) == (
        Status.INTERNAL,
        "input 'INPUT0' for model 'plan' is incorrectly marked as a shape tensor in the model configuration.",
    )


def test_non_linear_format_flags_must_be_the_engines() -> None:
    vectorized = [*ENGINE[:2], EngineTensor("OUTPUT0", False, "FLOAT", (-1, 16), linear_format=False)]
    assert refusal(GOOD, vectorized) == (
        Status.INTERNAL,
        "output 'OUTPUT0' for model 'plan' uses a non-linear IO format, but 'is_non_linear_format_io' is incorrectly "
        "set to false in the model configuration.",
    )
    text = GOOD.replace(
        '"OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ]',
        '"OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] is_non_linear_format_io: true',
    )
    assert refusal(text) == (
        Status.INTERNAL,
        "output 'OUTPUT0' for model 'plan' uses a linear IO format, but 'is_non_linear_format_io' is incorrectly set "
        "to true in the model configuration.",
    )


def test_shape_tensor_datatypes_and_value_counts() -> None:
    assert refusal(SHAPE_CONFIG.replace("TYPE_INT32", "TYPE_FP32"), SHAPE_ENGINE) == (
        Status.INVALID_ARG,
        "unexpected datatype TYPE_FP32 in model configuration for shape input 'SHAPE', expecting TYPE_INT32 or "
        "TYPE_INT64 for plan_0",
    )
    assert refusal(SHAPE_CONFIG.replace("TYPE_INT32", "TYPE_INT64"), SHAPE_ENGINE) == (
        Status.INVALID_ARG,
        "unexpected datatype TYPE_INT32 in engine for shape input 'SHAPE', expecting TYPE_INT64 for plan_0",
    )
    assert refusal(SHAPE_CONFIG.replace("dims: [ 2 ] is_shape", "dims: [ 3 ] is_shape"), SHAPE_ENGINE) == (
        Status.INTERNAL,
        "unable to load model 'plan', binding 'SHAPE' shape expected by framework [3] doesn't match model "
        "configuration shape [3]",
    )


def test_datatypes_must_be_the_engines() -> None:
    assert refusal(GOOD.replace('"INPUT1" data_type: TYPE_INT32', '"INPUT1" data_type: TYPE_FP16')) == (
        Status.INVALID_ARG,
        "unexpected datatype TYPE_INT32 for inference input 'INPUT1', expecting TYPE_FP16 for plan_0",
    )
    assert refusal(GOOD.replace('"OUTPUT0" data_type: TYPE_FP32', '"OUTPUT0" data_type: TYPE_BF16')) == (
        Status.INVALID_ARG,
        "unexpected datatype TYPE_FP32 for inference output 'OUTPUT0', expecting TYPE_BF16 for plan_0",
    )


def test_dims_match_where_neither_side_is_a_wildcard() -> None:
    fixed = [EngineTensor("INPUT0", True, "INT32", (4, 16)), EngineTensor("OUTPUT0", False, "FLOAT", (4, 16))]
    text = 'max_batch_size: 4 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ] '
    text += 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    check_bindings(config(text), fixed, "plan_0")  # unlike ONNX Runtime: no -1 needed at dim 0
    assert refusal(text.replace("dims: [ 16 ]", "dims: [ 8 ]"), fixed) == (
        Status.INVALID_ARG,
        "model 'plan', tensor 'OUTPUT0': the model expects 2 dimensions (shape [4,16]) but the model configuration "
        "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,8])",
    )
    assert refusal(text.replace("max_batch_size: 4", "").replace("dims: [ 16 ]", "dims: [ 8 ]"), fixed) == (
        Status.INVALID_ARG,
        "model 'plan', tensor 'INPUT0': the model expects 2 dimensions (shape [4,16]) but the model configuration "
        "specifies 1 dimensions (shape [-1])",
    )


def test_batching_needs_an_engine_tensor_with_a_dimension() -> None:
    scalar = [EngineTensor("INPUT0", True, "INT32", ()), EngineTensor("OUTPUT0", False, "FLOAT", (-1,))]
    text = 'max_batch_size: 4 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ] '
    text += 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ ] } ]'
    assert refusal(text, scalar) == (
        Status.INVALID_ARG,
        "model 'plan', tensor 'INPUT0': for the model to support batching the shape should have at least 1 "
        "dimension; but shape expected by the model is []",
    )


def test_a_ragged_input_needs_a_one_dimensional_engine_tensor() -> None:
    text = GOOD.replace("dims: [ 16 ] }, {", "dims: [ 16 ] allow_ragged_batch: true }, {")
    assert refusal(text) == (
        Status.INVALID_ARG,
        "model 'plan', tensor 'INPUT0': for the model to support ragged input, the engine shape is: [-1,16] while "
        "the model config shape is: [16]",
    )


SEQUENCE = """
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
}
"""


def sequence_engine(start: tuple[int, ...] = (-1, 1), batch: tuple[int, ...] = (-1,)) -> list[EngineTensor]:
    return [
        EngineTensor("INPUT", True, "INT32", (*batch, 1)),
        EngineTensor("START", True, "INT32", start),
        EngineTensor("STATE_IN", True, "FLOAT", (*batch, 4)),
        EngineTensor("OUTPUT", False, "INT32", (*batch, 1)),
        EngineTensor("STATE_OUT", False, "FLOAT", (*batch, 4)),
    ]


def test_controls_and_states_are_bound_and_checked() -> None:
    check_bindings(config(SEQUENCE), sequence_engine(), "plan_0")
    assert refusal(SEQUENCE, sequence_engine((-1, 2))) == (
        Status.INVALID_ARG,
        "unexpected shape [-1,2] for control input 'START' for model plan: expects all dimensions (conditionally "
        "first) to be 1 but the model specified shape [-1,2]",
    )
    assert refusal(SEQUENCE.replace("max_batch_size: 8", "max_batch_size: 0"), sequence_engine((-1,), ())) == (
        Status.INVALID_ARG,
        "unexpected shape [-1] for control input 'START' for model plan: expects the first dimension to be 1 but "
        "the model specified -1",
    )
    assert refusal(SEQUENCE.replace("TYPE_FP32 dims: [ 4 ]", "TYPE_INT32 dims: [ 4 ]"), sequence_engine()) == (
        Status.INVALID_ARG,
        "unexpected datatype TYPE_FP32 for inference input 'STATE_IN', expecting TYPE_INT32 for plan_0",
    )


def test_a_control_the_engine_lacks_is_not_found() -> None:
    assert refusal(SEQUENCE.replace('name: "START"', 'name: "NOPE"'), sequence_engine()) == (
        Status.NOT_FOUND,
        "input 'NOPE' not found for plan_0",
    )


def test_every_engine_tensor_needs_a_configuration() -> None:
    assert refusal(GOOD.replace(', { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }', "")) == (
        Status.INVALID_ARG,
        "expected configuration for input 'INPUT1' for plan_0",
    )
    extra = [*ENGINE, EngineTensor("OUTPUT1", False, "FLOAT", (-1, 16))]
    assert refusal(GOOD, extra) == (Status.INVALID_ARG, "expected configuration for output 'OUTPUT1' for plan_0")


def test_a_tensor_bound_twice_is_refused() -> None:
    text = GOOD.replace("input [ ", 'input [ { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }, ')
    with pytest.raises(TurnoutError) as caught:
        check_bindings(config(text.replace(', { name: "INPUT1"', ', { name: "INPUT0"', 1)), ENGINE, "plan_0")
    assert (caught.value.status, caught.value.message) == (
        Status.INVALID_ARG,
        "input 'INPUT0'  has already appeared as an input or output for plan_0",
    )
