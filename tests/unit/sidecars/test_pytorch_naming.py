"""Triton's PyTorch naming rules as pure logic over a forward() signature: what forward()
may take, which naming convention a config's names follow, where each tensor binds."""

from __future__ import annotations

import logging

import pytest

from protos.status import Status, TurnoutError
from sidecars.pytorch.naming import (
    Argument,
    Convention,
    ForwardInputs,
    bind_inputs,
    forward_inputs,
    named_index,
    naming_convention,
    output_indices,
)

TWO = [Argument("x", "TensorType", "Tensor"), Argument("y", "TensorType", "Tensor")]
FORWARD = ForwardInputs(False, ("x", "y"))


def failure(call: object, *args: object) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value.status, caught.value.message


def test_named_index_reads_digits_after_the_first_double_underscore() -> None:
    assert named_index("OUT__12") == 12 and named_index("OUT__") == 0
    assert named_index("A__B__0") is None and named_index("OUT") is None and named_index("OUT__\u00b2") is None


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            [Argument("x", "TensorType"), Argument("d", "DictType", "Dict(str, Tensor)")],
            (
                Status.INTERNAL,
                "Multiple inputs of kind DictType were detected. Only a single input of type Dict(str, Tensor) is "
                "supported.",
            ),
        ),
        (
            [Argument("x", "TensorType"), Argument("n", "IntType", "int")],
            (
                Status.INTERNAL,
                "An input of type 'int' was detected in the model. Only a single input of type Dict(str, Tensor) or "
                "input(s) of type Tensor are supported.",
            ),
        ),
        (
            [Argument("x", "TensorType")],
            (Status.INVALID_ARG, "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
        ),
    ],
)
def test_signatures_triton_refuses(arguments: list[Argument], expected: tuple[Status, str]) -> None:
    assert failure(forward_inputs, "m", arguments, 2) == expected


def test_a_single_dict_argument_is_not_counted() -> None:
    assert forward_inputs("m", [Argument("inputs", "DictType")], 3) == ForwardInputs(True, ())
    assert forward_inputs("m", [], 3) == ForwardInputs(False, ())


def test_forward_argument_names_bind_by_name() -> None:
    convention = naming_convention("m", "input", ["y", "x"], FORWARD.names, None)
    layout = bind_inputs("m", FORWARD, convention, ["y", "x"])
    assert convention is Convention.FORWARD_ARGUMENT and layout.positions == {"y": 1, "x": 0}


def test_named_index_binds_by_the_index() -> None:
    convention = naming_convention("m", "input", ["INPUT__1", "INPUT__0"], FORWARD.names, None)
    layout = bind_inputs("m", FORWARD, convention, ["INPUT__1", "INPUT__0"])
    assert convention is Convention.NAMED_INDEX and layout.positions == {"INPUT__1": 1, "INPUT__0": 0}


def test_names_without_an_index_fall_back_to_config_order_silently(caplog: pytest.LogCaptureFixture) -> None:
    convention = naming_convention("m", "input", ["x", "other"], FORWARD.names, None)
    assert convention is Convention.CONFIG_ORDER and not caplog.records
    layout = bind_inputs("m", FORWARD, convention, ["x", "other"])
    assert layout.positions == {"x": 0, "other": 1}


def test_a_non_numeric_index_warns_in_tritons_words(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert naming_convention("m", "input", ["A__0", "B__x"], FORWARD.names, None) is Convention.CONFIG_ORDER
        assert naming_convention("m", "output", ["OUT__a"], (), None) is Convention.CONFIG_ORDER
    assert [r.getMessage() for r in caplog.records] == [
        "input 'B__x' or previous input(s) are neither an input argument to the model 'm' nor do they follow the "
        "<name>__<index> naming convention. Falling back to enforcing strict ordering from model configuration.",
        "output 'OUT__a' or previous output(s) of the model 'm' do not follow the <name>__<index> naming "
        "convention. Falling back to enforcing strict ordering from model configuration.",
    ]


def test_sequence_batching_needs_indexed_names_even_without_state() -> None:
    # Triton's JSON config always has a `state` list under sequence_batching.
    assert failure(naming_convention, "m", "input", ["x", "y"], FORWARD.names, []) == (
        Status.INVALID_ARG,
        "PyTorch model 'm' is using sequence batching with state but not all inputs and outputs follow the "
        "<name>__<index> naming convention. ",
    )
    assert naming_convention("m", "input", ["IN__0"], FORWARD.names, []) is Convention.NAMED_INDEX


def test_every_state_name_needs_an_index() -> None:
    assert failure(naming_convention, "m", "output", ["OUT__0"], (), ["STATE_OUT"]) == (
        Status.INVALID_ARG,
        "PyTorch model 'm' is using sequence batching with state but state 'STATE_OUT' does not follow the "
        "<name>__<index> naming convention. ",
    )


def test_controls_and_states_bind_by_their_index() -> None:
    forward = ForwardInputs(False, ("a", "b", "c", "d"))
    layout = bind_inputs("m", forward, Convention.NAMED_INDEX, ["IN__0"], ["START__2", "STATE__1", "READY__3"])
    assert layout.positions == {"IN__0": 0, "START__2": 2, "STATE__1": 1, "READY__3": 3} and layout.count == 4


def test_an_index_forward_does_not_have_or_a_shared_one_is_refused() -> None:
    assert failure(bind_inputs, "m", FORWARD, Convention.NAMED_INDEX, ["IN__0", "IN__5"]) == (
        Status.INVALID_ARG,
        "unable to load model 'm', input 'IN__5' names index 5 but forward() takes 2 inputs",
    )
    assert failure(bind_inputs, "m", FORWARD, Convention.CONFIG_ORDER, ["a", "b"], ["START__1"]) == (
        Status.INVALID_ARG,
        "unable to load model 'm', inputs 'b' and 'START__1' share index 1",
    )


def test_outputs_use_the_index_or_config_order() -> None:
    assert output_indices(Convention.NAMED_INDEX, ["OUTPUT__1", "OUTPUT__0"]) == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    assert output_indices(Convention.CONFIG_ORDER, ["SUM", "DIFF"], ["STATE__2"]) == {
        "SUM": 0,
        "DIFF": 1,
        "STATE__2": 2,
    }
