"""Triton's PyTorch naming rules: which forward() argument each config input feeds and
which model output each config output reads. Pure logic over the forward() signature,
so it is tested without torch."""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from protos.status import internal, invalid_arg

log = logging.getLogger(__name__)


class Convention(enum.Enum):
    FORWARD_ARGUMENT = "forward argument names"
    NAMED_INDEX = "<name>__<index>"
    CONFIG_ORDER = "config order"


@dataclass(frozen=True)
class Argument:
    """One forward() parameter after `self`: its name and TorchScript type kind
    ("TensorType", "DictType", "ListType", ...) and type text."""

    name: str
    kind: str
    type_text: str = ""


@dataclass(frozen=True)
class InputLayout:
    """How a batch's named inputs become forward() arguments."""

    dict_input: bool  # one Dict[str, Tensor] argument keyed by the config names
    positions: dict[str, int]  # config input name -> argument position
    count: int  # arguments forward() takes
    convention: Convention


def named_index(name: str) -> int | None:
    """The index of a `<name>__<index>` name, else None. As Triton, the text after the
    first `__` must be all digits."""
    _, sep, tail = name.partition("__")
    if not sep or not tail.isdigit():
        return None
    return int(tail)


def input_layout(model: str, inputs: Sequence[str], arguments: Sequence[Argument] | None) -> InputLayout:
    """Bind config inputs to forward() arguments (`arguments` None: a model whose
    signature cannot be read binds inputs in config order)."""
    if arguments is None:
        return InputLayout(False, {name: i for i, name in enumerate(inputs)}, len(inputs), Convention.CONFIG_ORDER)
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        return InputLayout(True, {name: i for i, name in enumerate(inputs)}, 1, Convention.FORWARD_ARGUMENT)
    if any(a.kind == "DictType" for a in arguments[1:]):
        raise internal(
            "Multiple inputs of kind DictType were detected. "
            "Only a single input of type Dict(str, Tensor) is supported."
        )
    for argument in arguments:
        if argument.kind not in ("TensorType", "ListType"):
            raise internal(
                f"An input of type '{argument.type_text}' was detected in the model. Only a single input of type "
                "Dict(str, Tensor) or input(s) of type Tensor are supported."
            )
    if len(arguments) != len(inputs):
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects {len(inputs)} inputs, "
            f"model provides {len(arguments)}"
        )
    names = [a.name for a in arguments]
    if all(name in names for name in inputs):
        return InputLayout(False, {n: names.index(n) for n in inputs}, len(names), Convention.FORWARD_ARGUMENT)
    indexes = [named_index(name) for name in inputs]
    if all(index is not None for index in indexes):
        positions = {name: index for name, index in zip(inputs, indexes, strict=True) if index is not None}
        _check_indexes(model, "input", positions, len(names))
        return InputLayout(False, positions, len(names), Convention.NAMED_INDEX)
    log.warning(
        "input(s) of model '%s' are neither input arguments to the model nor do they follow the "
        "<name>__<index> naming convention. Falling back to enforcing strict ordering from model configuration.",
        model,
    )
    return InputLayout(False, {name: i for i, name in enumerate(inputs)}, len(names), Convention.CONFIG_ORDER)


def output_indices(model: str, outputs: Sequence[str]) -> dict[str, int]:
    """Config output name -> index in the model's returned tuple: `<name>__<index>` when
    every name follows it, else config order."""
    indexes = [named_index(name) for name in outputs]
    if all(index is not None for index in indexes):
        return {name: index for name, index in zip(outputs, indexes, strict=True) if index is not None}
    if any(index is not None for index in indexes):
        log.warning(
            "output(s) of the model '%s' do not all follow the <name>__<index> naming convention. "
            "Falling back to enforcing strict ordering from model configuration.",
            model,
        )
    return {name: i for i, name in enumerate(outputs)}


def _check_indexes(model: str, kind: str, positions: dict[str, int], count: int) -> None:
    seen: dict[int, str] = {}
    for name, index in positions.items():
        if index >= count:
            raise invalid_arg(
                f"unable to load model '{model}', {kind} '{name}' names index {index} but forward() "
                f"takes {count} {kind}s"
            )
        if index in seen:
            raise invalid_arg(
                f"unable to load model '{model}', {kind}s '{seen[index]}' and '{name}' share index {index}"
            )
        seen[index] = name
