"""The onnxruntime backend's load checks of a config against a real session of a tiny
model, each refusal with Triton's status and exact text."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper

from protos.status import Status, TurnoutError
from sidecars.onnxruntime.checks import check_session
from sidecars.onnxruntime.runtime import OnnxRuntime
from tests.unit.sidecars.onnx_models import (
    BFLOAT16,
    FLOAT,
    INT32,
    STRING,
    UINT64,
    config,
    open_session,
    write_model,
)

BATCHED = [("X", FLOAT, ["batch", 16]), ("Y", INT32, ["batch", 16])]
BATCHED_OUTPUTS = [("SUM", FLOAT, "X")]
GOOD = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


@pytest.fixture
def batched(tmp_path: Path) -> object:
    return open_session(write_model(tmp_path / "model.onnx", BATCHED, BATCHED_OUTPUTS))


def refusal(text: str, session: object) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        check_session(config(text), session)
    return caught.value.status, caught.value.message


def test_a_config_that_matches_the_model_passes(batched: object) -> None:
    check_session(config(GOOD), batched)


X_INPUT = '{ name: "X" data_type: TYPE_FP32 dims: [ 16 ] }'
Y_INPUT = '{ name: "Y" data_type: TYPE_INT32 dims: [ 16 ] }'
Z_INPUT = '{ name: "Z" data_type: TYPE_FP32 dims: [ 16 ] }'


@pytest.mark.parametrize(("inputs", "expected"), [([X_INPUT], 1), ([X_INPUT, Y_INPUT, Z_INPUT], 3)])
def test_the_input_count_must_be_the_models(batched: object, inputs: list[str], expected: int) -> None:
    text = f"max_batch_size: 8 input [ {', '.join(inputs)} ]"
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        f"unable to load model 'm', configuration expects {expected} inputs, model provides 2",
    )


def test_an_unknown_input_lists_the_allowed_names_sorted(batched: object) -> None:
    text = GOOD.replace('name: "Y"', 'name: "A"')
    assert refusal(text, batched) == (Status.INVALID_ARG, "unexpected inference input 'A', allowed inputs are: X, Y")


def test_overridable_initializers_are_allowed_by_name_but_not_counted(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, [4])], [("Y", FLOAT, "X")], initializers=[("W", [4])])
    session = open_session(path)
    inputs = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "W" data_type: TYPE_FP32 dims: [ 4 ]'
    outputs = 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    check_session(config(f"{inputs} optional: true }} ]\n{outputs}"), session)
    assert refusal(f"{inputs} }} ]\n{outputs}", session) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects 2 inputs, model provides 1",
    )
    unknown = inputs.replace('"W"', '"V"')
    assert refusal(f"{unknown} optional: true }} ]\n{outputs}", session) == (
        Status.INVALID_ARG,
        "unexpected inference input 'V', allowed inputs are: W, X",
    )


def test_a_config_datatype_onnx_runtime_cannot_take_is_internal(batched: object) -> None:
    text = GOOD.replace('"X" data_type: TYPE_FP32', '"X" data_type: TYPE_BF16')
    assert refusal(text, batched) == (Status.INTERNAL, "unsupported datatype TYPE_BF16 for input 'X' for model 'm'")


@pytest.mark.parametrize(
    ("element", "provided"), [(FLOAT, "TYPE_FP32"), (STRING, "TYPE_BYTES"), (BFLOAT16, "TYPE_<invalid>")]
)
def test_a_datatype_the_model_does_not_have(tmp_path: Path, element: int, provided: str) -> None:
    session = open_session(write_model(tmp_path / "model.onnx", [("X", element, [4])], [("Y", element, "X")]))
    text = 'input [ { name: "X" data_type: TYPE_INT64 dims: [ 4 ] } ]'
    assert refusal(text, session) == (
        Status.INVALID_ARG,
        f"unable to load model 'm', configuration expects datatype TYPE_INT64 for input 'X', model provides {provided}",
    )


def test_input_dims_take_any_value_where_the_model_is_dynamic(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, ["batch", "n"])], [("Y", FLOAT, "X")])
    text = 'max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    check_session(config(text), open_session(path))


def test_a_config_wildcard_against_a_fixed_model_dim_is_refused(batched: object) -> None:
    text = GOOD.replace('"X" data_type: TYPE_FP32 dims: [ 16 ]', '"X" data_type: TYPE_FP32 dims: [ -1 ]')
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
        "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,-1])",
    )


def test_batching_needs_a_dynamic_first_model_dim(tmp_path: Path) -> None:
    session = open_session(write_model(tmp_path / "model.onnx", [("X", FLOAT, [2, 16])], [("Y", FLOAT, "X")]))
    text = 'max_batch_size: 2 input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    assert refusal(text, session) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'X': for the model to support batching the shape should have at least 1 dimension and "
        "the first dimension must be -1; but shape expected by the model is [2,16]",
    )


def test_without_batching_the_full_shapes_are_compared(tmp_path: Path) -> None:
    session = open_session(write_model(tmp_path / "model.onnx", [("X", FLOAT, [2, 16])], [("Y", FLOAT, "X")]))
    text = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 32 ] } ]'
    assert refusal(text, session) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'X': the model expects 2 dimensions (shape [2,16]) but the model configuration "
        "specifies 1 dimensions (shape [32])",
    )


def test_a_reshape_is_what_the_model_is_compared_with(tmp_path: Path) -> None:
    session = open_session(write_model(tmp_path / "model.onnx", [("X", FLOAT, [4, 4])], [("Y", FLOAT, "X")]))
    check_session(
        config('input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] reshape { shape: [ 4, 4 ] } } ]'), session
    )


def test_a_scalar_model_tensor_takes_only_ones(tmp_path: Path) -> None:
    session = open_session(write_model(tmp_path / "model.onnx", [("X", FLOAT, [])], [("Y", FLOAT, "X")]))
    check_session(config('input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]'), session)
    assert refusal('input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]', session) == (
        Status.INVALID_ARG,
        "unable to load model 'm', scalar tensor 'X', should only provide 1 in the model configuration when the "
        "model doesn't support batching. Model configuration provided: [2].",
    )


def test_an_optional_input_refuses_batching(tmp_path: Path) -> None:
    # Only an overridable initializer can be left out, so only it may be optional.
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, ["batch", 16])], [("Y", FLOAT, "X")], [("W", [4])])
    text = f'max_batch_size: 2 input [ {X_INPUT}, {{ name: "W" data_type: TYPE_FP32 dims: [ 4 ] optional: true }} ]'
    assert refusal(text, open_session(path)) == (
        Status.INVALID_ARG,
        "unable to load model 'm', optional input 'W' is not supported for models that support batching",
    )


def test_a_ragged_input_needs_a_model_shape_of_minus_one(tmp_path: Path, batched: object) -> None:
    text = GOOD.replace(
        '"X" data_type: TYPE_FP32 dims: [ 16 ]', '"X" data_type: TYPE_FP32 dims: [ 16 ] allow_ragged_batch: true'
    )
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects model provides input with shape [-1]  for ragged input "
        "'X', model provides [-1,16]",
    )
    flat = open_session(write_model(tmp_path / "flat.onnx", [("X", FLOAT, ["n"])], [("Y", FLOAT, "X")]))
    check_session(
        config('max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] allow_ragged_batch: true } ]'),
        flat,
    )


def test_an_optional_ragged_input_is_refused(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, [4])], [("Y", FLOAT, "X")], [("W", [4])])
    optional = 'name: "W" data_type: TYPE_FP32 dims: [ 4 ] optional: true allow_ragged_batch: true'
    text = f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ {optional} }} ]'
    assert refusal(text, open_session(path)) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects model provides input with shape [-1] for ragged input "
        "'W', which is not supported for optional input",
    )


def test_an_unknown_output_lists_the_model_outputs(batched: object) -> None:
    assert refusal(GOOD.replace('"SUM"', '"NOPE"'), batched) == (
        Status.INVALID_ARG,
        "unexpected inference output 'NOPE', allowed outputs are: SUM",
    )


def test_output_datatypes_are_checked_as_inputs_are(batched: object) -> None:
    text = GOOD.replace('"SUM" data_type: TYPE_FP32', '"SUM" data_type: TYPE_INT32')
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for output 'SUM', model provides "
        "TYPE_FP32",
    )
    text = GOOD.replace('"SUM" data_type: TYPE_FP32', '"SUM" data_type: TYPE_BF16')
    assert refusal(text, batched) == (Status.INTERNAL, "unsupported datatype TYPE_BF16 for output 'SUM' for model 'm'")


def test_output_dims_must_equal_the_models_wildcards_included(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, ["batch", "n"])], [("Y", FLOAT, "X")])
    session = open_session(path)
    text = 'max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ] '
    check_session(config(text + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]'), session)
    assert refusal(text + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]', session) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'Y': the model expects 2 dimensions (shape [-1,-1]) but the model configuration "
        "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,16])",
    )


def test_a_batch_output_keeps_its_own_shape(batched: object) -> None:
    text = GOOD.replace('"SUM" data_type: TYPE_FP32 dims: [ 16 ]', '"SUM" data_type: TYPE_FP32 dims: [ 3 ]')
    text += 'batch_output [ { target_name: "SUM" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "X" } ]'
    check_session(config(text), batched)


SEQUENCE_INPUTS = [("INPUT", INT32, ["batch", 1]), ("START", INT32, ["batch", 1]), ("STATE_IN", FLOAT, ["batch", 1])]
SEQUENCE_OUTPUTS = [("OUTPUT", INT32, "INPUT"), ("STATE_OUT", FLOAT, "STATE_IN")]


def sequence_config(
    control: str = 'name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]',
    state_output: str = "STATE_OUT",
    state_type: str = "TYPE_FP32",
) -> str:
    return f"""
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  control_input [ {{ {control} }} ]
  state [ {{ input_name: "STATE_IN" output_name: "{state_output}" data_type: {state_type} dims: [ 1 ] }} ]
}}
"""


@pytest.fixture
def stateful(tmp_path: Path) -> object:
    return open_session(write_model(tmp_path / "model.onnx", SEQUENCE_INPUTS, SEQUENCE_OUTPUTS))


def test_controls_and_state_count_as_inputs(stateful: object) -> None:
    check_session(config(sequence_config()), stateful)


def test_a_control_the_model_does_not_take_is_internal(stateful: object) -> None:
    control = 'name: "NOPE" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]'
    assert refusal(sequence_config(control), stateful) == (
        Status.INTERNAL,
        "configuration specified sequence control 'NOPE', but model does not provide that input",
    )


def test_a_control_must_have_shape_one(tmp_path: Path) -> None:
    inputs = [SEQUENCE_INPUTS[0], ("START", INT32, ["batch", 2]), SEQUENCE_INPUTS[2]]
    session = open_session(write_model(tmp_path / "model.onnx", inputs, SEQUENCE_OUTPUTS))
    assert refusal(sequence_config(), session) == (
        Status.INVALID_ARG,
        "unable to load model 'm', sequence control 'START' in model has dims [2] but dims [1] is expected",
    )


def test_a_control_must_have_the_configured_datatype(stateful: object) -> None:
    control = 'name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ]'
    assert refusal(sequence_config(control), stateful) == (
        Status.INVALID_ARG,
        "unable to load model 'm', sequence control 'START', the model expects data-type INT32 but the model "
        "configuration specifies data-type TYPE_BOOL",
    )


def test_a_corrid_control_is_checked_with_its_own_datatype(tmp_path: Path) -> None:
    inputs = [SEQUENCE_INPUTS[0], ("START", UINT64, ["batch", 1]), SEQUENCE_INPUTS[2]]
    session = open_session(write_model(tmp_path / "model.onnx", inputs, SEQUENCE_OUTPUTS))
    control = 'name: "START" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]'
    check_session(config(sequence_config(control)), session)
    control = control.replace("TYPE_UINT64", "TYPE_STRING")
    assert refusal(sequence_config(control), session) == (
        Status.INVALID_ARG,
        "unable to load model 'm', sequence control 'START', the model expects data-type UINT64 but the model "
        "configuration specifies data-type TYPE_STRING",
    )


def test_state_outputs_must_be_model_outputs_of_the_state_datatype(stateful: object) -> None:
    assert refusal(sequence_config(state_output="NOPE"), stateful) == (
        Status.INVALID_ARG,
        "unexpected inference output 'NOPE', allowed outputs are: OUTPUT, STATE_OUT",
    )
    assert refusal(sequence_config(state_type="TYPE_INT64"), stateful) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects datatype TYPE_INT64 for output state 'STATE_OUT', model "
        "provides TYPE_FP32",
    )
    assert refusal(sequence_config(state_type="TYPE_BF16"), stateful) == (
        Status.INTERNAL,
        "unsupported datatype TYPE_BF16 for output state 'STATE_OUT' for model 'm'",
    )


def test_a_model_tensor_that_is_not_a_tensor_is_unsupported(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["S"], ["N"])],
        "sequence",
        [helper.make_tensor_sequence_value_info("S", FLOAT, None)],
        [helper.make_tensor_value_info("N", onnx.TensorProto.INT64, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "model.onnx"))
    text = 'input [ { name: "S" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    assert refusal(text, open_session(tmp_path / "model.onnx")) == (
        Status.UNSUPPORTED,
        "Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 'S', expected 'ONNX_TYPE_TENSOR'.",
    )


def test_a_missing_model_file_is_unavailable_with_its_full_path(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    complete = config(
        GOOD + 'default_model_filename: "model.onnx" instance_group [ { name: "m" kind: KIND_CPU count: 1 } ]'
    )
    with pytest.raises(TurnoutError) as caught:
        OnnxRuntime({}).load(complete, version)
    assert (caught.value.status, caught.value.message) == (
        Status.UNAVAILABLE,
        f"unable to find '{version / 'model.onnx'}' for model instance 'm'",
    )
