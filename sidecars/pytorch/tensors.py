"""Tensors between the sidecar's numpy arrays and torch: the datatype table, and the
copies each way (none where torch can share numpy's memory)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from protos import model_config_pb2 as mc
from protos.datatypes import BY_NAME
from protos.status import invalid_arg

# Every protocol datatype torch has a tensor type for; BYTES travels as List[str].
TORCH_TYPES: dict[int, torch.dtype] = {
    mc.TYPE_BOOL: torch.bool,
    mc.TYPE_UINT8: torch.uint8,
    mc.TYPE_UINT16: torch.uint16,
    mc.TYPE_UINT32: torch.uint32,
    mc.TYPE_UINT64: torch.uint64,
    mc.TYPE_INT8: torch.int8,
    mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32,
    mc.TYPE_INT64: torch.int64,
    mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32,
    mc.TYPE_FP64: torch.float64,
    mc.TYPE_BF16: torch.bfloat16,
}
CONFIG_TYPES: dict[torch.dtype, int] = {dtype: config for config, dtype in TORCH_TYPES.items()}


def to_torch(array: np.ndarray, device: torch.device) -> Any:
    """A request's array as the model's argument: a tensor on `device`, or a list of
    str for BYTES."""
    if array.dtype == np.object_:
        return [e.decode("utf-8", "surrogateescape") if isinstance(e, bytes) else str(e) for e in array.reshape(-1)]
    if array.dtype == BY_NAME["BF16"].numpy:
        tensor = torch.from_numpy(_writable(array).view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(_writable(array))
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def _writable(array: np.ndarray) -> np.ndarray:
    # torch warns on read-only memory (decoded request bytes); such arrays are small
    # single requests, batches are already fresh concatenations.
    return array if array.flags.writeable and array.flags.c_contiguous else np.ascontiguousarray(array).copy()


def to_numpy(name: str, value: Any, expected: int) -> np.ndarray:
    """A model output as the array the response carries; `expected` is the config's
    datatype, checked as Triton does."""
    if isinstance(value, list):
        if expected != mc.TYPE_STRING:
            raise invalid_arg(
                f"configuration expects datatype {mc.DataType.Name(expected)} for output '{name}', "
                "model provides TYPE_STRING"
            )
        return np.array([s.encode("utf-8", "surrogateescape") for s in value], dtype=np.object_)
    if not isinstance(value, torch.Tensor):
        raise invalid_arg(f"output '{name}' must be of type Tensor or List[str].")
    provided = CONFIG_TYPES.get(value.dtype)
    if provided != expected:
        provided_text = mc.DataType.Name(provided) if provided is not None else str(value.dtype)
        raise invalid_arg(
            f"configuration expects datatype {mc.DataType.Name(expected)} for output '{name}', "
            f"model provides {provided_text}"
        )
    if value.dim() == 0:
        raise invalid_arg(f"output '{name}' is a scalar which is not supported.")
    tensor = value.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        bf16 = BY_NAME["BF16"].numpy
        assert bf16 is not None
        return tensor.view(torch.int16).numpy().view(bf16)
    return tensor.numpy()
