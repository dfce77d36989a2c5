"""Triton's onnxruntime_backend auto-complete (ModelState::AutoCompleteConfig): inputs,
outputs and batching read from the model's own signature (through ONNX Runtime, so the
image needs no `onnx` package)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from protos import model_config_pb2 as mc
from protos.status import invalid_arg
from sidecars.onnxruntime.checks import OnnxTensor, describe

log = logging.getLogger(__name__)


# Reads a model's signature: its ORT NodeArg lists (name, type, shape), inputs then outputs.
SignatureReader = Callable[[], tuple[Sequence[Any], Sequence[Any]]]


def auto_complete(config: mc.ModelConfig, read_signature: SignatureReader, default_max: int) -> None:
    """Complete `config` in place from the model's signature, read only when needed."""
    if (config.input or config.batch_input) and config.output:
        # Triton's backend leaves a config that names both sides alone (batch inputs
        # count as inputs), and does not even open the model.
        log.info(
            "skipping model configuration auto-complete for '%s': inputs and outputs already specified", config.name
        )
        return
    inputs, outputs = read_signature()
    model_inputs, model_outputs = describe(inputs), describe(outputs)
    _complete_max_batch(config, [*model_inputs.values(), *model_outputs.values()], default_max)
    if not (config.input or config.batch_input):
        _complete_tensors(config.input, model_inputs, config.max_batch_size)
    if not config.output:
        _complete_tensors(config.output, model_outputs, config.max_batch_size)


def _complete_max_batch(config: mc.ModelConfig, tensors: list[OnnxTensor], default_max: int) -> None:
    # The model batches when every input and output has a dynamic first dim.
    batching = all(tensor.dims and tensor.dims[0] == -1 for tensor in tensors)
    if not batching:
        if config.max_batch_size != 0:
            raise invalid_arg(
                f"autofill failed for model '{config.name}': model does not support batching "
                "while non-zero max_batch_size is specified"
            )
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default_max, 0)
        log.warning(
            "autofilled max_batch_size to %d for model '%s' since batching is supporrted but no max_batch_size is "
            "specified in model configuration. Must specify max_batch_size to utilize autofill with a larger max "
            "batch size",
            config.max_batch_size,
            config.name,
        )
    scheduled = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
    if config.max_batch_size > 1 and not scheduled:
        config.dynamic_batching.SetInParent()


def _complete_tensors(entries: Any, tensors: dict[str, OnnxTensor], max_batch_size: int) -> None:
    """The whole list from the model, in name order (Triton iterates a std::map)."""
    for name in sorted(tensors):
        tensor = tensors[name]
        entry = entries.add()
        entry.name = name
        entry.data_type = tensor.config_type
        dims = tensor.dims[1:] if max_batch_size > 0 else tensor.dims
        if dims:
            entry.dims.extend(dims)
            continue
        # Triton keeps dims non-empty: a scalar is [1]; a batching model reshapes it back
        # to []. An empty reshape would be a scalar tensor, which a non-batching model
        # cannot have, so there it stays [1].
        entry.dims.append(1)
        if max_batch_size > 0:
            entry.reshape.SetInParent()
