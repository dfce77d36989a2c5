"""torch.export programs (model.pt2, platform "torch_aoti"): the signature a program
carries (forward()'s argument names, each input's and output's dtype and shape) and
turnout's own check of a config against it.

Triton's PyTorch backend cannot compare a TorchScript model with its config (TorchScript
keeps no shapes); a torch.export program keeps them, so turnout checks names, datatypes
and dims at load as Triton's onnxruntime backend checks an ONNX model, in its words:
inputs with model wildcards taking any config value, outputs exactly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protos import model_config_pb2 as mc
from protos.status import invalid_arg
from sidecars.backend_checks import check_dims, config_dims, server_type_name, unexpected_input
from sidecars.pytorch.checks import Bindings
from sidecars.pytorch.naming import Convention


@dataclass(frozen=True)
class ProgramTensor:
    """One user input or output of a program: its config datatype (None where the
    protocol has none) and its dims, -1 for each symbolic one."""

    data_type: int | None
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ProgramSignature:
    """What a program says of itself; a tensor it does not describe is None."""

    names: tuple[str, ...]  # forward()'s argument names, in order
    inputs: tuple[ProgramTensor | None, ...]
    outputs: tuple[ProgramTensor | None, ...]


def read_signature(program: Any, config_types: dict[Any, int]) -> ProgramSignature:
    """The signature of a torch.export ExportedProgram; `config_types` maps torch dtypes
    to config datatypes."""
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    calls = program.module_call_graph
    names = tuple(calls[0].signature.forward_arg_names) if calls and calls[0].signature else ()
    nodes = {node.name: node for node in program.graph.nodes}

    def tensor(argument: Any) -> ProgramTensor | None:
        node = nodes.get(getattr(argument, "name", ""))
        value = node.meta.get("val") if node is not None else None
        if not isinstance(value, torch.Tensor):
            return None
        dims = tuple(d if isinstance(d, int) else -1 for d in value.shape)
        return ProgramTensor(config_types.get(value.dtype), dims)

    signature = program.graph_signature
    inputs = tuple(tensor(s.arg) for s in signature.input_specs if s.kind == InputKind.USER_INPUT)
    outputs = tuple(tensor(s.arg) for s in signature.output_specs if s.kind == OutputKind.USER_OUTPUT)
    return ProgramSignature(names, inputs, outputs)


def check_program(config: mc.ModelConfig, program: ProgramSignature, bindings: Bindings) -> None:
    """turnout's own rule for torch.export programs, after Triton's PyTorch checks: config
    inputs name forward() arguments (or their `<name>__<index>`), and every input and
    output the program describes has the config's datatype and dims."""
    layout = bindings.inputs
    unknown = next((t.name for t in config.input if t.name not in program.names), None)
    if layout.convention is Convention.CONFIG_ORDER and unknown is not None:
        raise unexpected_input(unknown, program.names)
    for tensor in config.input:
        _check(config, f"input '{tensor.name}'", tensor, _at(program.inputs, layout.positions.get(tensor.name)), False)
    for output in config.output:
        _check(config, f"output '{output.name}'", output, _at(program.outputs, bindings.outputs.get(output.name)), True)


def _at(tensors: tuple[ProgramTensor | None, ...], index: int | None) -> ProgramTensor | None:
    return tensors[index] if index is not None and 0 <= index < len(tensors) else None


def _check(
    config: mc.ModelConfig, what: str, tensor: mc.ModelInput | mc.ModelOutput, found: ProgramTensor | None, exact: bool
) -> None:
    if found is None:
        return
    if found.data_type != tensor.data_type:
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects datatype "
            f"{mc.DataType.Name(tensor.data_type)} for {what}, model provides {server_type_name(found.data_type)}"
        )
    check_dims(config.name, tensor.name, found.dims, config_dims(tensor), config.max_batch_size, exact)
