"""Triton's pytorch backend checks at instance load (libtorch.cc: the sequence controls,
ValidateInputs, ValidateOutputs) in its order, status codes and words, as pure logic
over the config and forward()'s arguments. TorchScript carries no shapes or datatypes,
so nothing here compares them with the model; the result says where each tensor binds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protos import model_config_pb2 as mc
from protos.status import internal
from sidecars.backend_checks import config_dims
from sidecars.pytorch.naming import (
    Argument,
    Convention,
    InputLayout,
    bind_inputs,
    config_order_layout,
    forward_inputs,
    named_index,
    naming_convention,
    output_indices,
)
from sidecars.sequence_config import SequenceControl, sequence_controls

# The config datatypes Triton's backend has a torch type for (ModelConfigDataTypeToTorchType);
# TYPE_STRING travels as a list of str beside them.
TORCH_DATATYPES = frozenset(
    {
        mc.TYPE_BOOL,
        mc.TYPE_UINT8,
        mc.TYPE_INT8,
        mc.TYPE_INT16,
        mc.TYPE_INT32,
        mc.TYPE_INT64,
        mc.TYPE_FP16,
        mc.TYPE_FP32,
        mc.TYPE_FP64,
    }
)
_CORRID = mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID


@dataclass(frozen=True)
class Bindings:
    """Where a model's tensors go: each input the batcher feeds (config inputs, sequence
    controls, state inputs) to a forward() argument, each output (and state output)
    from an index of what forward() returns."""

    inputs: InputLayout
    outputs: dict[str, int]
    output_convention: Convention


def check_model(config: mc.ModelConfig, arguments: Sequence[Argument] | None) -> Bindings:
    """Everything Triton's backend checks when an instance has loaded its module;
    `arguments` None for a model whose forward() signature cannot be read."""
    model = config.name
    sequence = config.HasField("sequence_batching")
    state_inputs = [state.input_name for state in config.sequence_batching.state]
    state_outputs = [state.output_name for state in config.sequence_batching.state]
    controls = [control.name for control in _check_controls(config)]
    inputs = [tensor.name for tensor in config.input]
    outputs = [tensor.name for tensor in config.output]

    # ValidateInputs
    forward = None
    if arguments is not None:
        expected = len(inputs) + len(config.batch_input) + len(controls) + len(state_inputs)
        forward = forward_inputs(model, arguments, expected)
    if not inputs:
        raise internal("model configuration must contain at least one input, none were specified.")
    convention = Convention.CONFIG_ORDER
    if forward is not None and forward.names:
        convention = naming_convention(model, "input", inputs, forward.names, state_inputs if sequence else None)
    elif forward is not None:
        # Triton's quirk: with no named arguments (a Dict input) it reads the outputs here.
        convention = naming_convention(model, "output", outputs, (), state_outputs if sequence else None)
    for tensor in config.input:
        _check_datatype(config, "input", tensor.name, tensor.data_type, config_dims(tensor))
    for state in config.sequence_batching.state:
        if state.data_type not in TORCH_DATATYPES and state.data_type != mc.TYPE_STRING:
            raise internal(
                f"unsupported datatype {mc.DataType.Name(state.data_type)} for input state '{state.input_name}' "
                f"for model '{model}'"
            )

    # ValidateOutputs
    if not outputs:
        raise internal("model configuration must contain at least one output, none were specified.")
    output_convention = naming_convention(model, "output", outputs, (), state_outputs if sequence else None)
    for tensor in config.output:
        _check_datatype(config, "output", tensor.name, tensor.data_type, config_dims(tensor))
    for state in config.sequence_batching.state:
        if state.data_type not in TORCH_DATATYPES and state.data_type != mc.TYPE_STRING:
            raise internal(
                f"unsupported datatype {mc.DataType.Name(state.data_type)} for state '{state.output_name}' for "
                f"model '{model}'"
            )
        _check_string_rank(config, "output", state.output_name, state.data_type, list(state.dims))
    if forward is None:
        layout = config_order_layout([*inputs, *controls, *state_inputs])
    else:
        layout = bind_inputs(model, forward, convention, inputs, [*controls, *state_inputs])
    return Bindings(layout, output_indices(output_convention, outputs, state_outputs), output_convention)


def _check_controls(config: mc.ModelConfig) -> list[SequenceControl]:
    """Each control binds by its `<name>__<index>`; CORRID needs a torch datatype."""
    controls = sequence_controls(config)
    for control in controls:
        if named_index(control.name) is None:
            raise internal(f"input '{control.name}' does not follow <name>__<index> naming convention.")
        if control.kind == _CORRID and control.data_type not in TORCH_DATATYPES:
            raise internal(
                f"input '{control.name}' type '{mc.DataType.Name(control.data_type)}' is not supported by PyTorch."
            )
    return controls


def _check_datatype(config: mc.ModelConfig, kind: str, name: str, data_type: int, dims: list[int]) -> None:
    if data_type not in TORCH_DATATYPES and data_type != mc.TYPE_STRING:
        raise internal(
            f"unsupported datatype {mc.DataType.Name(data_type)} for {kind} '{name}' for model '{config.name}'"
        )
    _check_string_rank(config, kind, name, data_type, dims)


def _check_string_rank(config: mc.ModelConfig, kind: str, name: str, data_type: int, dims: list[int]) -> None:
    """Strings travel as one List[str]: one dimension, the batch dim included."""
    if data_type == mc.TYPE_STRING and len(dims) + (1 if config.max_batch_size > 0 else 0) > 1:
        raise internal(
            f"Triton only supports 1 dimensional List of String as {kind} for '{name}' for model '{config.name}'"
        )
