"""The `sequence_batching` section of a model config: Triton's defaults and load-time
checks, and the tensors the sequence batcher feeds a model beside the client's own
(START, END, READY and CORRID controls, implicit state)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from protos import codec
from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME, DataType
from protos.status import invalid_arg

SEQUENCE_IDLE_DEFAULT_US = 1_000_000  # Triton's max_sequence_idle_microseconds when unset
INITIAL_STATE_FOLDER = "initial_state"  # data_file paths are relative to <model>/initial_state

_Control = mc.ModelSequenceBatching.Control
_FLAG_KINDS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
_FALSE_TRUE_DTYPE = {"int32_false_true": np.int32, "fp32_false_true": np.float32, "bool_false_true": np.bool_}
_FALSE_TRUE = tuple(_FALSE_TRUE_DTYPE)  # the fields that may give a flag control's false and true values
_FALSE_TRUE_CONFIG_TYPE = {
    "int32_false_true": mc.TYPE_INT32,
    "fp32_false_true": mc.TYPE_FP32,
    "bool_false_true": mc.TYPE_BOOL,
}


def fill_sequence_defaults(config: mc.ModelConfig) -> None:
    """Triton's normalisation: the idle timeout, and oldest's preferred size."""
    if not config.HasField("sequence_batching"):
        return
    batching = config.sequence_batching
    if batching.max_sequence_idle_microseconds == 0:
        batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
    if batching.HasField("oldest") and not batching.oldest.preferred_batch_size and config.max_batch_size > 0:
        batching.oldest.preferred_batch_size.append(config.max_batch_size)


def check_sequence_config(config: mc.ModelConfig) -> None:
    """Reject what Triton's core rejects in a `sequence_batching` section, in its words."""
    if not config.HasField("sequence_batching"):
        return
    model = config.name
    batching = config.sequence_batching
    if config.response_cache.enable:
        raise invalid_arg(
            f"Response Cache does not currently support model {model} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    for kind in (*_FLAG_KINDS, _Control.CONTROL_SEQUENCE_CORRID):
        _find_control(batching, model, kind)
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid_arg(f"sequence batching preferred batch size must be positive for {model}")
            if size > config.max_batch_size:
                raise invalid_arg(f"sequence batching preferred batch size must be <= max batch size for {model}")
    if batching.HasField("direct") and not 0.0 <= batching.direct.minimum_slot_utilization <= 1.0:
        raise invalid_arg(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}")
    for state in batching.state:
        _check_state(state)


def _find_control(
    batching: mc.ModelSequenceBatching, model: str, kind: int
) -> tuple[str, mc.ModelSequenceBatching.Control] | None:
    """The tensor name and control of `kind`, checked as Triton checks every control input."""
    kind_name = _Control.Kind.Name(kind)
    seen: set[str] = set()
    found = None
    for control_input in batching.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple control "
                f"kinds for {model}"
            )
        seen.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                raise invalid_arg(f"sequence batching specifies multiple {kind_name} tensors for {model}")
            found = (control_input.name, control)
            given = [field for field in _FALSE_TRUE if getattr(control, field)]
            if kind == _Control.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise invalid_arg(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind_name} for {model}"
                    )
                if control.data_type not in _CORRID_TYPES:
                    raise invalid_arg(
                        f"unexpected data type for control {kind_name} for {model}. Allowed data types are "
                        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                    )
                continue
            if not given:
                raise invalid_arg(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind_name} for {model}"
                )
            if len(given) > 1:
                raise invalid_arg(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                    f"'bool_false_true' for {kind_name} for {model}"
                )
            if len(getattr(control, given[0])) != 2:
                raise invalid_arg(
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind_name} for {model}"
                )
    return found


def _check_state(state: mc.ModelSequenceBatching.State) -> None:
    name = state.input_name
    if len(state.initial_state) > 1:
        raise invalid_arg(
            f"initial_state field for state input '{name}' must contain exactly one or zero element. "
            f"Found '{len(state.initial_state)}' elements."
        )
    if not state.initial_state:
        return
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise invalid_arg(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
        )
    if not initial.name:
        raise invalid_arg(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(initial.dims) != len(state.dims):
        raise invalid_arg(
            f"Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state "
            f"input '{name}'. {len(initial.dims)} != {len(state.dims)}"
        )
    for initial_dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if initial_dim == -1:
            raise invalid_arg(f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if state_dim != -1 and initial_dim != state_dim:
            raise invalid_arg(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
                f"{initial_dim} != {state_dim}"
            )
    if initial.WhichOneof("state_data") is None:
        raise invalid_arg(f"initial_state setting expects state'{name}' to have state_data set")


class SequenceControl(NamedTuple):
    """A control tensor the batcher feeds: its name, kind, and the datatype Triton gives it
    (a flag control's from the false/true field it sets, CORRID's own `data_type`)."""

    name: str
    kind: int
    data_type: int


def sequence_controls(config: mc.ModelConfig) -> list[SequenceControl]:
    """The controls a config sets, in the order Triton's backends check them: START, END,
    READY, then CORRID."""
    if not config.HasField("sequence_batching"):
        return []
    controls = []
    for kind in (*_FLAG_KINDS, _Control.CONTROL_SEQUENCE_CORRID):
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind != kind:
                    continue
                if kind == _Control.CONTROL_SEQUENCE_CORRID:
                    data_type = control.data_type
                else:
                    field = next((f for f in _FALSE_TRUE if getattr(control, f)), "int32_false_true")
                    data_type = _FALSE_TRUE_CONFIG_TYPE[field]
                controls.append(SequenceControl(control_input.name, kind, data_type))
    return controls


def sequence_inputs(config: mc.ModelConfig) -> list[tuple[str, int]]:
    """(name, config data type) of every tensor the batcher adds to a model's inputs, the
    controls then the state inputs; runtimes bind them beside the config's inputs."""
    if not config.HasField("sequence_batching"):
        return []
    extra = [(control.name, control.data_type) for control in sequence_controls(config)]
    extra += [(state.input_name, state.data_type) for state in config.sequence_batching.state]
    return extra


def state_outputs(config: mc.ModelConfig) -> list[tuple[str, int]]:
    """(name, config data type) of the state outputs a runtime must return beside the
    config's outputs."""
    if not config.HasField("sequence_batching"):
        return []
    listed = {output.name for output in config.output}
    return [(s.output_name, s.data_type) for s in config.sequence_batching.state if s.output_name not in listed]


@dataclass(frozen=True)
class Row:
    """What the controls of one batch row say; a filler row (READY false) keeps the
    other sequences in their slots."""

    start: bool = False
    end: bool = False
    ready: bool = False
    correlation_id: int | str = 0


FILLER = Row()


@dataclass(frozen=True)
class _Flag:
    name: str
    dtype: type[Any]
    false: Any
    true: Any


@dataclass(frozen=True)
class StateSpec:
    input_name: str
    output_name: str
    initial: np.ndarray  # one row, batch dim included when the model batches


class SequenceTensors:
    """Builds the control and initial-state tensors of one model version."""

    def __init__(self, config: mc.ModelConfig, model_dir: Path) -> None:
        self._batched = config.max_batch_size > 0
        batching = config.sequence_batching
        self._flags: dict[int, _Flag] = {}
        for kind in _FLAG_KINDS:
            found = _find_control(batching, config.name, kind)
            if found is not None:
                name, control = found
                field = next(f for f in _FALSE_TRUE if getattr(control, f))
                false, true = getattr(control, field)
                self._flags[kind] = _Flag(name, _FALSE_TRUE_DTYPE[field], false, true)
        corrid = _find_control(batching, config.name, _Control.CONTROL_SEQUENCE_CORRID)
        self.corrid: tuple[str, DataType] | None = None
        if corrid is not None:
            self.corrid = (corrid[0], BY_CONFIG_NAME[mc.DataType.Name(corrid[1].data_type)])
        self.states = [
            StateSpec(s.input_name, s.output_name, self._initial_state(s, model_dir)) for s in batching.state
        ]

    def controls(self, rows: Sequence[Row]) -> dict[str, np.ndarray]:
        """Each control tensor for a batch of `rows`: [rows, 1] when batched, else [1]."""
        shape = (len(rows), 1) if self._batched else (1,)
        tensors = {}
        for kind, flag in self._flags.items():
            values = [flag.true if _says(kind, row) else flag.false for row in rows]
            tensors[flag.name] = np.array(values, dtype=flag.dtype).reshape(shape)
        if self.corrid is not None:
            name, datatype = self.corrid
            if datatype.name == "BYTES":
                texts = [str(row.correlation_id).encode() if row.ready else b"" for row in rows]
                tensors[name] = np.array(texts, dtype=np.object_).reshape(shape)
            else:
                numbers = [_as_number(row.correlation_id) if row.ready else 0 for row in rows]
                tensors[name] = np.array(numbers, dtype=np.uint64).astype(datatype.numpy).reshape(shape)
        return tensors

    def initial(self) -> dict[str, np.ndarray]:
        """A new sequence's state inputs."""
        return {state.input_name: state.initial for state in self.states}

    def _initial_state(self, state: mc.ModelSequenceBatching.State, model_dir: Path) -> np.ndarray:
        datatype = BY_CONFIG_NAME[mc.DataType.Name(state.data_type)]
        batch = [1] if self._batched else []
        if not state.initial_state:
            # As Triton: variable dims start at 1, and the values at zero.
            dims = [1 if d == -1 else d for d in state.dims]
            return _zeros(datatype, [*batch, *dims])
        initial = state.initial_state[0]
        shape = [*batch, *initial.dims]
        if initial.WhichOneof("state_data") == "zero_data":
            return _zeros(datatype, shape)
        try:
            data = (model_dir / INITIAL_STATE_FOLDER / initial.data_file).read_bytes()
        except OSError as exc:
            raise invalid_arg(
                f"failed to read initial_state file '{initial.data_file}' for state input '{state.input_name}': "
                f"{exc.strerror}"
            ) from exc
        if datatype.name == "BYTES":
            return codec.from_raw(data, datatype, shape)
        expected = codec.element_count(shape) * datatype.size
        if len(data) < expected:
            raise invalid_arg(
                f"initial_state setting expects {expected} bytes, but the data provided from "
                f"{initial.data_file}only has {len(data)} bytes."
            )
        return codec.from_raw(data[:expected], datatype, shape)


def _says(kind: int, row: Row) -> bool:
    if kind == _Control.CONTROL_SEQUENCE_READY:
        return row.ready
    if kind == _Control.CONTROL_SEQUENCE_START:
        return row.start and row.ready
    return row.end and row.ready


def _as_number(correlation_id: int | str) -> int:
    """A numeric CORRID for a string id that spells a number, else 0."""
    if isinstance(correlation_id, int):
        return correlation_id
    return int(correlation_id) if correlation_id.isdigit() and int(correlation_id) < 2**64 else 0


def _zeros(datatype: DataType, shape: list[int]) -> np.ndarray:
    if datatype.name == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    assert datatype.numpy is not None
    return np.zeros(shape, dtype=datatype.numpy)
