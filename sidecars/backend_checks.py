"""What Triton's backends check alike when they load a model (its `backend` repository's
helpers and their copies in each backend), in Triton's words: the missing model file,
`optional` inputs where a backend takes none, names a model does not have, and the
spelling of shapes and datatypes in those texts. Every framework runtime uses them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from protos import model_config_pb2 as mc
from protos.codec import shape_text
from protos.datatypes import BY_CONFIG_NAME
from protos.status import TurnoutError, invalid_arg, unavailable


def config_dims(tensor: mc.ModelInput | mc.ModelOutput) -> list[int]:
    """The shape the model sees: the reshape when there is one, else `dims`."""
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def server_type_name(data_type: int | None) -> str:
    """A datatype as `"TYPE_" + TRITONSERVER_DataTypeString(...)`, the form Triton uses
    for what a model provides: protocol names (`TYPE_BYTES`, not `TYPE_STRING`), and
    `TYPE_<invalid>` for a type the protocol has no name for."""
    found = BY_CONFIG_NAME.get(mc.DataType.Name(data_type)) if data_type is not None else None
    return "TYPE_" + (found.name if found is not None else "<invalid>")


def require_model_file(path: Path, owner: str) -> None:
    """Triton's UNAVAILABLE text for a model file that is not there; `owner` is the model
    name (ONNX Runtime, PyTorch) or the instance name (TensorRT)."""
    if not path.exists():
        raise unavailable(f"unable to find '{path}' for model instance '{owner}'")


def refuse_optional_inputs(config: mc.ModelConfig) -> None:
    """BackendModel's refusal of `optional: true` in a backend that takes every input
    (PyTorch, TensorRT), when the model is first read."""
    for tensor in config.input:
        if tensor.optional:
            raise invalid_arg(
                f"'optional' is set to true for input '{tensor.name}' while the backend model doesn't support "
                "optional input"
            )


def unexpected_input(name: str, allowed: Iterable[str]) -> TurnoutError:
    """CheckAllowedModelInput: the allowed names byte-wise sorted (a std::set), ", "-joined."""
    return invalid_arg(f"unexpected inference input '{name}', allowed inputs are: {', '.join(sorted(allowed))}")


def unexpected_output(name: str, allowed: Iterable[str]) -> TurnoutError:
    """CheckAllowedModelOutput, as unexpected_input."""
    return invalid_arg(f"unexpected inference output '{name}', allowed outputs are: {', '.join(sorted(allowed))}")


def check_dims(
    model: str, tensor: str, model_dims: Sequence[int], dims: Sequence[int], max_batch_size: int, exact: bool
) -> None:
    """The onnxruntime backend's shape check of one tensor (CompareDimsSupported, and its
    rule for rank-0 model tensors): `model_dims` with -1 for a dynamic dim, `dims` the
    config's without the batch dim. Inexact (inputs), a model -1 takes any config value;
    exact (outputs), every position must be equal, -1 included. turnout's torch.export
    check uses it too; the TensorRT backend has a variant of its own."""
    if not model_dims:
        if any(d != 1 for d in dims):
            raise invalid_arg(
                f"unable to load model '{model}', scalar tensor '{tensor}', should only provide 1 in the model "
                "configuration when the model doesn't support batching. Model configuration provided: "
                f"{shape_text(dims)}."
            )
        return
    prefix = f"model '{model}', tensor '{tensor}': "
    if max_batch_size > 0:
        if model_dims[0] != -1:
            raise invalid_arg(
                prefix + "for the model to support batching the shape should have at least 1 dimension and the "
                f"first dimension must be -1; but shape expected by the model is {shape_text(model_dims)}"
            )
        full = [-1, *dims]
        if not _dims_match(model_dims, full, exact):
            raise invalid_arg(
                prefix + f"the model expects {len(model_dims)} dimensions (shape {shape_text(model_dims)}) but the "
                f"model configuration specifies {len(full)} dimensions (an initial batch dimension because "
                "max_batch_size > 0 followed by the explicit tensor shape, making complete shape "
                f"{shape_text(full)})"
            )
    elif not _dims_match(model_dims, dims, exact):
        raise invalid_arg(
            prefix + f"the model expects {len(model_dims)} dimensions (shape {shape_text(model_dims)}) but the model "
            f"configuration specifies {len(dims)} dimensions (shape {shape_text(dims)})"
        )


def _dims_match(model_dims: Sequence[int], dims: Sequence[int], exact: bool) -> bool:
    if len(model_dims) != len(dims):
        return False
    return all(m == d for m, d in zip(model_dims, dims, strict=True) if exact or m != -1)
