"""Triton's PyTorch naming rules (libtorch.cc): what forward() may take, which naming
convention a config's names follow, which forward() argument each tensor the batcher
feeds binds to, and which returned tensor each output reads. Pure logic over
forward()'s signature, so it is tested without torch."""

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
class ForwardInputs:
    """What forward() takes: one Dict[str, Tensor] keyed by input name, or tensors and
    lists by position (`names`, the arguments' own names)."""

    dict_input: bool
    names: tuple[str, ...]


@dataclass(frozen=True)
class InputLayout:
    """How a batch's named inputs become forward() arguments."""

    dict_input: bool  # one Dict[str, Tensor] argument keyed by the config names
    positions: dict[str, int]  # input name -> argument position
    count: int  # arguments forward() takes
    convention: Convention


def named_index(name: str) -> int | None:
    """The index of a `<name>__<index>` name, else None. As Triton: the text after the
    first `__` must be ASCII digits, and may be empty (index 0)."""
    _, sep, tail = name.partition("__")
    if not sep or not all("0" <= c <= "9" for c in tail):
        return None
    return int(tail) if tail else 0


def forward_inputs(model: str, arguments: Sequence[Argument], expected: int) -> ForwardInputs:
    """Triton's rules for forward()'s arguments after `self`; `expected` counts every
    tensor the config feeds (inputs, batch inputs, sequence controls and states)."""
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        return ForwardInputs(True, ())
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
    # A forward() without arguments is not counted (Triton checks the count only when
    # there are tensor arguments).
    if arguments and len(arguments) != expected:
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects {expected} inputs, model provides {len(arguments)}"
        )
    return ForwardInputs(False, tuple(a.name for a in arguments))


def naming_convention(
    model: str, kind: str, names: Sequence[str], allowed: Sequence[str], states: Sequence[str] | None
) -> Convention:
    """Triton's GetNamingConvention for the config's "input" or "output" names: forward
    argument names (inputs only), else all `<name>__<index>`, else config order.

    `states` are the input (or output) names of `sequence_batching.state`, None without
    sequence batching. With sequence batching the names must be `<name>__<index>`, even
    without states: Triton reads the config as JSON, where `state` is always present
    (empty), and tests only its presence."""
    convention = Convention.FORWARD_ARGUMENT if kind == "input" else Convention.NAMED_INDEX
    if kind == "input" and any(name not in allowed for name in names):
        convention = Convention.NAMED_INDEX
    if convention is Convention.NAMED_INDEX:
        for name in names:
            if "__" not in name:
                convention = Convention.CONFIG_ORDER
                break
            if named_index(name) is None:
                if kind == "input":
                    log.warning(
                        "input '%s' or previous input(s) are neither an input argument to the model '%s' nor do they "
                        "follow the <name>__<index> naming convention. Falling back to enforcing strict ordering "
                        "from model configuration.",
                        name,
                        model,
                    )
                else:
                    log.warning(
                        "output '%s' or previous output(s) of the model '%s' do not follow the <name>__<index> naming "
                        "convention. Falling back to enforcing strict ordering from model configuration.",
                        name,
                        model,
                    )
                convention = Convention.CONFIG_ORDER
                break
    if states is None:
        return convention
    if convention is not Convention.NAMED_INDEX:
        raise invalid_arg(
            f"PyTorch model '{model}' is using sequence batching with state but not all inputs and outputs follow "
            "the <name>__<index> naming convention. "
        )
    for state in states:
        if named_index(state) is None:
            raise invalid_arg(
                f"PyTorch model '{model}' is using sequence batching with state but state '{state}' does not follow "
                "the <name>__<index> naming convention. "
            )
    return convention


def bind_inputs(
    model: str,
    forward: ForwardInputs,
    convention: Convention,
    inputs: Sequence[str],
    indexed: Sequence[str] = (),
) -> InputLayout:
    """Where each config input binds under `convention`, and each `indexed` tensor (the
    sequence controls and states, always `<name>__<index>`) by its index."""
    count = len(forward.names)
    if forward.dict_input:
        return InputLayout(True, {name: i for i, name in enumerate([*inputs, *indexed])}, 1, convention)
    positions: dict[str, int] = {}
    for position, name in enumerate(inputs):
        if convention is Convention.FORWARD_ARGUMENT:
            positions[name] = forward.names.index(name)
        elif convention is Convention.NAMED_INDEX:
            positions[name] = named_index(name) or 0
        else:
            positions[name] = position
    for name in indexed:
        positions[name] = named_index(name) or 0
    _check_positions(model, positions, count)
    return InputLayout(False, positions, count, convention)


def config_order_layout(inputs: Sequence[str]) -> InputLayout:
    """For a model whose signature cannot be read: every input in the order given."""
    return InputLayout(False, {name: i for i, name in enumerate(inputs)}, len(inputs), Convention.CONFIG_ORDER)


def output_indices(convention: Convention, outputs: Sequence[str], states: Sequence[str] = ()) -> dict[str, int]:
    """Config output name -> index in the model's returned tuple under `convention` (of
    naming_convention for outputs); state outputs always by their index."""
    indices = {}
    for position, name in enumerate(outputs):
        indices[name] = (named_index(name) or 0) if convention is Convention.NAMED_INDEX else position
    for name in states:
        indices[name] = named_index(name) or 0
    return indices


def _check_positions(model: str, positions: dict[str, int], count: int) -> None:
    """turnout's own rule, where Triton would fail at the first request: every binding
    names an argument forward() has, and no two name the same one."""
    seen: dict[int, str] = {}
    for name, index in positions.items():
        if count and index >= count:
            raise invalid_arg(
                f"unable to load model '{model}', input '{name}' names index {index} but forward() takes {count} inputs"
            )
        if index in seen:
            raise invalid_arg(
                f"unable to load model '{model}', inputs '{seen[index]}' and '{name}' share index {index}"
            )
        seen[index] = name
