"""Triton's checks of an ensemble's step maps against the configs of its step models
(ValidateEnsembleConfig). The gateway runs them on the step models' complete configs,
which only it sees together; the ensemble sidecar on those a repository states whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protos import model_config_pb2 as mc
from protos.codec import shape_text
from protos.status import invalid_arg


@dataclass
class _Node:
    """An ensemble tensor as one model declares it: Triton's TensorNode."""

    model: str
    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def _node(model: str, batching: bool, data_type: int, dims: Sequence[int]) -> _Node:
    return _Node(model, data_type, tuple(dims), ((-1,) if batching else ()) + tuple(dims))


def check_step_configs(ensemble: mc.ModelConfig, step_configs: Sequence[mc.ModelConfig]) -> None:
    """Triton's ValidateEnsembleConfig: every step input mapped once, no map naming a
    tensor its model lacks, and one data type and a compatible shape per ensemble tensor.
    `step_configs` are the step models' complete configs, in step order."""
    name = ensemble.name
    batching = ensemble.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for tensor in ensemble.input:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        tensors[tensor.name] = _node(name, batching, tensor.data_type, dims)
    for tensor in ensemble.output:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        tensors.setdefault(tensor.name, _node(name, batching, tensor.data_type, dims))
    for step, config in zip(ensemble.ensemble_scheduling.step, step_configs, strict=True):
        model = step.model_name
        if config.max_batch_size != 0 and config.max_batch_size < ensemble.max_batch_size:
            raise invalid_arg(
                f"ensemble {name} allows maximum batch size {ensemble.max_batch_size}, but it contains model "
                f"{model} which only allows maximum batch size to be {config.max_batch_size}"
            )
        step_batching = config.max_batch_size > 0
        declared_inputs = {t.name: t for t in config.input}
        for model_input, tensor_name in step.input_map.items():
            if model_input not in declared_inputs:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor_name} is mapping to non-existing input "
                    f"{model_input} in model {model}"
                )
        for model_input in config.input:
            tensor_name = step.input_map.get(model_input.name)
            if tensor_name is None:
                if model_input.optional:
                    continue
                raise invalid_arg(
                    f"in ensemble {name}, input {model_input.name} in model {model} "
                    "is not mapped to any ensemble tensors"
                )
            _merge(tensors, name, tensor_name, _node(model, step_batching, model_input.data_type, model_input.dims))
        declared_outputs = {t.name: t for t in config.output}
        for model_output, tensor_name in step.output_map.items():
            found = declared_outputs.get(model_output)
            if found is None:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor_name} is mapped from non-existing output "
                    f"{model_output} in model {model}"
                )
            _merge(tensors, name, tensor_name, _node(model, step_batching, found.data_type, found.dims))


def _merge(tensors: dict[str, _Node], ensemble: str, tensor_name: str, node: _Node) -> None:
    known = tensors.get(tensor_name)
    if known is None:
        tensors[tensor_name] = node
        return
    prefix = f"in ensemble {ensemble}, ensemble tensor {tensor_name}: "
    if known.data_type != node.data_type:
        raise invalid_arg(
            f"{prefix}inconsistent data type: {mc.DataType.Name(known.data_type)} is inferred from model "
            f"{known.model} while {mc.DataType.Name(node.data_type)} is inferred from model {node.model}"
        )
    # A batching and a non-batching model may share a tensor when their full shapes agree.
    if not _dims_agree(known.dims, node.dims) and not _dims_agree(known.full_dims, node.full_dims):
        raise invalid_arg(
            f"{prefix}inconsistent shape: {shape_text(known.full_dims)} is inferred from model {known.model} "
            f"while {shape_text(node.full_dims)} is inferred from model {node.model}"
        )


def _dims_agree(first: Sequence[int], second: Sequence[int]) -> bool:
    """Equal rank, and every dimension equal or variable (-1) on either side."""
    return len(first) == len(second) and all(a == b or a == -1 or b == -1 for a, b in zip(first, second, strict=True))


def decoupled_steps(ensemble: mc.ModelConfig, step_configs: Sequence[mc.ModelConfig]) -> frozenset[int]:
    """The steps (by index) whose models are decoupled, on the data flow from the
    ensemble's inputs, checked as Triton's ValidateEnsembleConfig checks that flow: every
    step's inputs must descend from the same decoupled response stream (or from none).
    The ensemble is decoupled when this is not empty, as core makes it."""
    label = {tensor.name: 0 for tensor in ensemble.input}  # 0: no decoupled step upstream
    fresh = 0
    found: set[int] = set()
    pending = list(enumerate(zip(ensemble.ensemble_scheduling.step, step_configs, strict=True)))
    progressed = True
    while pending and progressed:
        progressed = False
        for item in list(pending):
            index, (step, config) = item
            sources = list(step.input_map.values())
            if not all(tensor in label for tensor in sources):
                continue
            pending.remove(item)
            progressed = True
            labels = {label[tensor] for tensor in sources}
            if len(labels) > 1:
                # Core names the model that declared the step's output tensor first.
                declared = _declared_by(ensemble, next(iter(step.output_map.values()), ""))
                raise invalid_arg(
                    f"in ensemble {ensemble.name}, step of model '{declared}' receives inputs originated "
                    "from different decoupled models"
                )
            own = labels.pop() if labels else 0
            if config.model_transaction_policy.decoupled:
                fresh += 1
                own = fresh
                found.add(index)
            for tensor in step.output_map.values():
                label.setdefault(tensor, own)
    return frozenset(found)


def _declared_by(ensemble: mc.ModelConfig, tensor: str) -> str:
    """The model whose declaration of `tensor` core's graph keeps: the ensemble's for its
    own inputs and outputs, else the first step's that maps it."""
    if any(t.name == tensor for t in (*ensemble.input, *ensemble.output)):
        return ensemble.name
    for step in ensemble.ensemble_scheduling.step:
        if tensor in step.input_map.values() or tensor in step.output_map.values():
            return str(step.model_name)
    return ensemble.name
