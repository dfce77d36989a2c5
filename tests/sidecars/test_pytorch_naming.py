"""Triton's PyTorch naming rules as pure logic over a forward() signature: which rule
applies, and Triton's texts for signatures the backend refuses."""

from __future__ import annotations

import pytest

from protos.status import TurnoutError
from sidecars.pytorch.naming import Argument, Convention, input_layout, named_index, output_indices

TWO = [Argument("x", "TensorType", "Tensor"), Argument("y", "TensorType", "Tensor")]


def test_forward_argument_names_bind_by_name() -> None:
    layout = input_layout("m", ["y", "x"], TWO)
    assert layout.convention is Convention.FORWARD_ARGUMENT and layout.positions == {"y": 1, "x": 0}


def test_named_index_binds_by_the_index() -> None:
    layout = input_layout("m", ["INPUT__1", "INPUT__0"], TWO)
    assert layout.convention is Convention.NAMED_INDEX and layout.positions == {"INPUT__1": 1, "INPUT__0": 0}


def test_mixed_names_fall_back_to_config_order() -> None:
    layout = input_layout("m", ["x", "other"], TWO)
    assert layout.convention is Convention.CONFIG_ORDER and layout.positions == {"x": 0, "other": 1}


def test_a_single_dict_argument_takes_every_input_by_key() -> None:
    layout = input_layout("m", ["a", "b", "c"], [Argument("inputs", "DictType", "Dict[str, Tensor]")])
    assert layout.dict_input and layout.count == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            [Argument("x", "TensorType"), Argument("d", "DictType", "Dict[str, Tensor]")],
            "Multiple inputs of kind DictType were detected",
        ),
        ([Argument("x", "TensorType"), Argument("n", "IntType", "int")], "An input of type 'int' was detected"),
        ([Argument("x", "TensorType")], "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
    ],
)
def test_signatures_triton_refuses(arguments: list[Argument], message: str) -> None:
    with pytest.raises(TurnoutError, match=message):
        input_layout("m", ["a", "b"], arguments)


def test_named_index_out_of_range_is_refused() -> None:
    with pytest.raises(TurnoutError, match="names index 5"):
        input_layout("m", ["INPUT__0", "INPUT__5"], TWO)


def test_outputs_use_the_index_or_config_order() -> None:
    assert output_indices("m", ["OUTPUT__1", "OUTPUT__0"]) == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    assert output_indices("m", ["SUM", "DIFF"]) == {"SUM": 0, "DIFF": 1}
    assert named_index("A__B__0") is None and named_index("OUT__12") == 12 and named_index("OUT") is None
