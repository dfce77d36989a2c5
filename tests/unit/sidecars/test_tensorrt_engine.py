"""What the TensorRT sidecar decides without TensorRT, over hand-built engine
descriptions: Triton's auto-complete from engine I/O, profile choice, binding layout
and buffer growth."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.tensorrt.engine import (
    EngineTensor,
    Profile,
    auto_complete,
    bindings,
    byte_size,
    choose_profile,
    grown_capacity,
)

SMALL = Profile((1, 16), (4, 16), (8, 16))
LARGE = Profile((9, 16), (32, 16), (64, 16))
ENGINE = [
    EngineTensor("INPUT0", True, "FLOAT", (-1, 16), (SMALL, LARGE)),
    EngineTensor("INPUT1", True, "INT32", (-1, 16), (SMALL, LARGE)),
    EngineTensor("OUTPUT0", False, "HALF", (-1, 16)),
]
FIXED = [
    EngineTensor("X", True, "FLOAT", (3, 4), (Profile((3, 4), (3, 4), (3, 4)),)),
    EngineTensor("Y", False, "FLOAT", ()),
]


def config(text: str = "") -> mc.ModelConfig:
    parsed = mc.ModelConfig(name="plan")
    text_format.Parse(text, parsed)
    return parsed


def tensors(entries: object) -> list[tuple[str, str, list[int], list[int] | None]]:
    """(name, datatype, dims, reshape or None) of each config input or output."""
    return [
        (t.name, mc.DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None)
        for t in entries  # type: ignore[attr-defined]
    ]


def failure(completed: mc.ModelConfig, engine: list[EngineTensor]) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        auto_complete(completed, engine)
    return caught.value.status, caught.value.message


def test_max_batch_size_is_profile_zeros_largest_batch() -> None:
    completed = config()
    auto_complete(completed, ENGINE)
    assert completed.max_batch_size == 8 and completed.HasField("dynamic_batching")
    assert tensors(completed.input) == [("INPUT0", "TYPE_FP32", [16], None), ("INPUT1", "TYPE_INT32", [16], None)]
    assert tensors(completed.output) == [("OUTPUT0", "TYPE_FP16", [16], None)]


def test_the_profiles_the_instance_groups_name_set_the_batch() -> None:
    completed = config('instance_group [ { profile: [ "1" ] } ]')
    auto_complete(completed, ENGINE)
    assert completed.max_batch_size == 64


def test_a_fixed_first_dim_is_read_as_the_batch_unless_the_config_says_otherwise() -> None:
    completed = config()
    auto_complete(completed, FIXED)
    assert completed.max_batch_size == 3 and completed.HasField("dynamic_batching")
    assert tensors(completed.input) == [("X", "TYPE_FP32", [4], None)]
    assert tensors(completed.output) == [("Y", "TYPE_FP32", [1], [])]
    unbatched = config('input [ { name: "X" dims: [ 3, 4 ] } ]')
    auto_complete(unbatched, FIXED)
    assert unbatched.max_batch_size == 0 and not unbatched.HasField("dynamic_batching")
    assert tensors(unbatched.input) == [("X", "TYPE_FP32", [3, 4], None)]


def test_a_config_larger_than_the_engines_batch_is_refused() -> None:
    assert failure(config("max_batch_size: 128"), ENGINE) == (
        Status.INTERNAL,
        "autofill failed for model 'plan': configuration specified max-batch 128 but TensorRT engine only supports "
        "max-batch 8",
    )
    assert failure(config('max_batch_size: 2 input [ { name: "X" dims: [ 3, 4 ] } ]'), FIXED) == (
        Status.INTERNAL,
        "autofill failed for model 'plan': configuration specified max-batch 2 but TensorRT engine only supports "
        "max-batch 0",
    )


def test_a_smaller_configured_batch_stays_and_still_gets_a_dynamic_batcher() -> None:
    completed = config("max_batch_size: 1")
    auto_complete(completed, ENGINE)
    assert completed.max_batch_size == 1 and completed.HasField("dynamic_batching")
    sequence = config("max_batch_size: 1 sequence_batching { }")
    auto_complete(sequence, ENGINE)
    assert not sequence.HasField("dynamic_batching")


def test_config_shapes_that_disagree_on_batching_are_refused() -> None:
    text = 'input [ { name: "INPUT0" dims: [ 16 ] } ] output [ { name: "OUTPUT0" dims: [ -1, 16 ] } ]'
    assert failure(config(text), ENGINE) == (
        Status.INTERNAL,
        "unable to autofill for 'plan', model tensor configurations are contradicting each other in terms of "
        "whether batching is supported",
    )


def test_a_batching_hint_needs_an_engine_that_batches() -> None:
    empty = Profile((0, 16), (0, 16), (0, 16))
    engine = [EngineTensor("X", True, "FLOAT", (-1, 16), (empty,)), EngineTensor("Y", False, "FLOAT", (-1, 16))]
    assert failure(config('input [ { name: "X" dims: [ 16 ] } ]'), engine) == (
        Status.INTERNAL,
        "autofill failed for model 'plan': model tensor shape configuration hints for dynamic batching but the "
        "underlying engine doesn't support batching.",
    )


def test_config_tensors_the_engine_lacks_are_refused() -> None:
    assert failure(config('input [ { name: "NOPE" dims: [ 16 ] } ]'), ENGINE) == (
        Status.INVALID_ARG,
        "unexpected inference input 'NOPE', allowed inputs are: INPUT0, INPUT1",
    )
    assert failure(config('output [ { name: "NOPE" dims: [ 16 ] } ]'), ENGINE) == (
        Status.INVALID_ARG,
        "unexpected inference output 'NOPE', allowed outputs are: OUTPUT0",
    )


INVALID_PROFILE = (
    "unable to autofill for 'plan', configuration specified invalid profile 5 . Number of profiles supported by "
    "TensorRT engine: 2"
)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("5", (Status.INTERNAL, INVALID_PROFILE)), ("abc", (Status.INVALID_ARG, "unable to parse 'abc': stoi"))],
)
def test_profiles_the_engine_lacks_are_refused(profile: str, expected: tuple[Status, str]) -> None:
    assert failure(config(f'instance_group [ {{ profile: [ "{profile}" ] }} ]'), ENGINE) == expected


def test_named_tensors_get_what_they_leave_out() -> None:
    completed = config('input [ { name: "INPUT1" } ]')
    auto_complete(completed, ENGINE)
    assert tensors(completed.input) == [("INPUT1", "TYPE_INT32", [16], None)]
    assert completed.max_batch_size == 8  # a tensor without dims is no hint


def test_shape_tensors_and_non_linear_formats_are_marked() -> None:
    engine = [
        EngineTensor("SHAPE", True, "INT32", (3,), (Profile((1, 2, 2), (4, 2, 2), (8, 2, 2)),), is_shape_tensor=True),
        EngineTensor("OUT", False, "HALF", (-1, 3, 4, 4), linear_format=False),
    ]
    completed = config()
    auto_complete(completed, engine)
    assert completed.max_batch_size == 8
    assert [(t.name, list(t.dims), t.is_shape_tensor) for t in completed.input] == [("SHAPE", [2], True)]
    assert [(t.name, t.is_non_linear_format_io) for t in completed.output] == [("OUT", True)]


def test_flags_the_engine_contradicts_are_refused() -> None:
    assert failure(config('input [ { name: "INPUT0" is_shape_tensor: true } ]'), ENGINE) == (
        Status.INVALID_ARG,
        "'INPUT0' is incorrectly specified as a shape tensor.",
    )
    assert failure(config('output [ { name: "OUTPUT0" is_non_linear_format_io: true } ]'), ENGINE) == (
        Status.INVALID_ARG,
        "'OUTPUT0' uses a linear IO format, but 'is_non_linear_format_io' is incorrectly set to true in the model "
        "configuration.",
    )


def test_names_stop_at_the_first_space_and_unknown_types_are_invalid() -> None:
    engine = [EngineTensor("X [profile 0]", True, "FP8", (-1, 2), (Profile((1, 2), (1, 2), (4, 2)),))]
    engine.append(EngineTensor("Y", False, "FLOAT", (-1, 2)))
    completed = config()
    auto_complete(completed, engine)
    assert tensors(completed.input) == [("X", "TYPE_INVALID", [2], None)]


@pytest.mark.parametrize(("batch", "profile"), [(1, 0), (8, 0), (9, 1), (64, 1)])
def test_the_first_profile_that_fits_the_batch_is_chosen(batch: int, profile: int) -> None:
    shapes = {"INPUT0": (batch, 16), "INPUT1": (batch, 16)}
    assert choose_profile(ENGINE, shapes, "plan") == profile


def test_a_batch_no_profile_fits_is_refused() -> None:
    with pytest.raises(TurnoutError, match="no optimization profile of model 'plan' accepts"):
        choose_profile(ENGINE, {"INPUT0": (65, 16), "INPUT1": (65, 16)}, "plan")


def test_bindings_put_inputs_first_and_size_buffers() -> None:
    layout = bindings([ENGINE[2], ENGINE[0], ENGINE[1]], {"FLOAT": 4, "INT32": 4, "HALF": 2})
    assert [(b.name, b.is_input) for b in layout] == [("INPUT0", True), ("INPUT1", True), ("OUTPUT0", False)]
    assert byte_size(layout[2], (8, 16)) == 256


def test_device_buffers_only_grow() -> None:
    assert grown_capacity(0, 10) == 256
    assert grown_capacity(256, 200) == 256
    assert grown_capacity(256, 1000) == 1024
