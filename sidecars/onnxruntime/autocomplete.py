"""Triton's onnxruntime_backend auto-complete: inputs, outputs and batching read from the
model's own signature (through ONNX Runtime, so the image needs no `onnx` package)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protos import model_config_pb2 as mc
from protos.status import invalid_arg

ORT_TYPES: dict[str, int] = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(bfloat16)": mc.TYPE_BF16,
    "tensor(string)": mc.TYPE_STRING,
}


def _dims(shape: Sequence[Any]) -> list[int]:
    """ORT reports dynamic dims as None or a symbolic name; Triton writes -1."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def auto_complete(config: mc.ModelConfig, inputs: Sequence[Any], outputs: Sequence[Any], default_max: int) -> None:
    """Complete `config` in place from ORT NodeArg lists (name, type, shape)."""
    if config.input and config.output:
        return  # Triton's backend leaves a config that names both sides alone
    signature = [_dims(arg.shape) for arg in [*inputs, *outputs]]
    batching = bool(signature) and all(dims and dims[0] == -1 for dims in signature)
    if config.max_batch_size == 0:
        if batching:
            config.max_batch_size = max(default_max, 0)
            if config.max_batch_size > 1 and not _has_scheduler(config):
                config.dynamic_batching.SetInParent()
    elif not batching:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': model does not support batching "
            "while non-zero max_batch_size is specified"
        )
    if not config.input:
        for arg in inputs:
            _add(config.input.add(), arg, config.max_batch_size > 0)
    if not config.output:
        for arg in outputs:
            _add(config.output.add(), arg, config.max_batch_size > 0)


def _has_scheduler(config: mc.ModelConfig) -> bool:
    return any(config.HasField(f) for f in ("dynamic_batching", "sequence_batching", "ensemble_scheduling"))


def _add(tensor: mc.ModelInput | mc.ModelOutput, arg: Any, batched: bool) -> None:
    tensor.name = arg.name
    data_type = ORT_TYPES.get(arg.type)
    if data_type is None:
        raise invalid_arg(f"unsupported datatype '{arg.type}' for tensor '{arg.name}'")
    tensor.data_type = data_type  # type: ignore[assignment]
    dims = _dims(arg.shape)
    if batched:
        dims = dims[1:]
    if not dims:
        # Triton keeps dims non-empty: a scalar is [1], reshaped back to [] for the model.
        tensor.dims.append(1)
        if batched:
            tensor.reshape.SetInParent()
    else:
        tensor.dims.extend(dims)
