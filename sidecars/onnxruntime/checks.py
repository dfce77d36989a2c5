"""Triton's onnxruntime backend checks of a config against the model each instance loads
(onnxruntime.cc: the sequence controls, ValidateInputs, ValidateOutputs), in its order,
status codes and words. They read ORT's descriptions of a session's tensors (NodeArg:
name, type text, shape) and never run the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protos import model_config_pb2 as mc
from protos.codec import shape_text
from protos.status import internal, invalid_arg, unsupported
from sidecars.backend_checks import (
    check_dims,
    config_dims,
    server_type_name,
    unexpected_input,
    unexpected_output,
)
from sidecars.sequence_config import sequence_controls

# ORT's element type text -> (Triton's OnnxDataTypeName, the config datatype Triton maps
# it to). BF16 and complex have no config datatype in Triton's backend.
_ELEMENTS: dict[str, tuple[str, int | None]] = {
    "tensor(float)": ("FLOAT", mc.TYPE_FP32),
    "tensor(uint8)": ("UINT8", mc.TYPE_UINT8),
    "tensor(int8)": ("INT8", mc.TYPE_INT8),
    "tensor(uint16)": ("UINT16", mc.TYPE_UINT16),
    "tensor(int16)": ("INT16", mc.TYPE_INT16),
    "tensor(int32)": ("INT32", mc.TYPE_INT32),
    "tensor(int64)": ("INT64", mc.TYPE_INT64),
    "tensor(string)": ("STRING", mc.TYPE_STRING),
    "tensor(bool)": ("BOOL", mc.TYPE_BOOL),
    "tensor(float16)": ("FLOAT16", mc.TYPE_FP16),
    "tensor(double)": ("DOUBLE", mc.TYPE_FP64),
    "tensor(uint32)": ("UINT32", mc.TYPE_UINT32),
    "tensor(uint64)": ("UINT64", mc.TYPE_UINT64),
    "tensor(complex64)": ("COMPLEX64", None),
    "tensor(complex128)": ("COMPLEX64", None),  # sic, Triton's name for it
    "tensor(bfloat16)": ("BFLOAT16", None),
}
# The config datatypes Triton's backend can hand ONNX Runtime, and as which element.
_ONNX_OF_CONFIG: dict[int, str] = {config: onnx for onnx, (_, config) in _ELEMENTS.items() if config is not None}
_KINDS = {"seq": "ONNX_TYPE_SEQUENCE", "map": "ONNX_TYPE_MAP", "opaque": "ONNX_TYPE_OPAQUE"}
_KINDS["sparse_tensor"] = "ONNX_TYPE_SPARSETENSOR"


@dataclass(frozen=True)
class OnnxTensor:
    """One session input, output or overridable initializer: ORT's element type text
    ("tensor(float)") and its shape, -1 for each dynamic or symbolic dim."""

    name: str
    onnx_type: str
    dims: tuple[int, ...]

    @property
    def config_type(self) -> int:
        """The config datatype auto-complete writes: TYPE_INVALID where Triton has none."""
        found = _ELEMENTS.get(self.onnx_type)
        return found[1] if found is not None and found[1] is not None else mc.TYPE_INVALID

    @property
    def type_name(self) -> str:
        """As Triton's OnnxDataTypeName: FLOAT, INT64, BOOL, ..."""
        found = _ELEMENTS.get(self.onnx_type)
        return found[0] if found is not None else "UNDEFINED"


def describe(args: Sequence[Any]) -> dict[str, OnnxTensor]:
    """ORT NodeArgs by name; Triton's backend takes tensors only."""
    tensors = {}
    for arg in args:
        if not arg.type.startswith("tensor("):
            kind = _KINDS.get(arg.type.partition("(")[0], "ONNX_TYPE_UNKNOWN")
            raise unsupported(f"Unsupported ONNX Type '{kind}' for I/O '{arg.name}', expected 'ONNX_TYPE_TENSOR'.")
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
        tensors[arg.name] = OnnxTensor(arg.name, arg.type, dims)
    return tensors


def check_session(config: mc.ModelConfig, session: Any) -> None:
    """Everything Triton's backend checks when an instance has opened its session."""
    inputs = session.get_inputs()
    check_sequence_controls(config, inputs)
    check_inputs(config, inputs, session.get_overridable_initializers())
    check_outputs(config, session.get_outputs())


def check_sequence_controls(config: mc.ModelConfig, inputs: Sequence[Any]) -> None:
    """Each control the sequence batcher feeds is a model input of shape [1] (after the
    batch dim) and of the config's datatype."""
    model = config.name
    controls = sequence_controls(config)
    tensors = describe(inputs) if controls else {}
    for control in controls:
        tensor = tensors.get(control.name)
        if tensor is None:
            raise internal(
                f"configuration specified sequence control '{control.name}', but model does not provide that input"
            )
        dims = tensor.dims[1:] if config.max_batch_size > 0 else tensor.dims
        if dims != (1,):
            raise invalid_arg(
                f"unable to load model '{model}', sequence control '{control.name}' in model has dims "
                f"{shape_text(dims)} but dims [1] is expected"
            )
        if _ONNX_OF_CONFIG.get(control.data_type) != tensor.onnx_type:
            raise invalid_arg(
                f"unable to load model '{model}', sequence control '{control.name}', the model expects data-type "
                f"{tensor.type_name} but the model configuration specifies data-type "
                f"{mc.DataType.Name(control.data_type)}"
            )


def check_inputs(config: mc.ModelConfig, inputs: Sequence[Any], initializers: Sequence[Any]) -> None:
    """Triton's ValidateInputs. Overridable initializers are not counted, yet a config
    may name them."""
    model = config.name
    tensors = describe(inputs)
    expected = sum(1 for tensor in config.input if not tensor.optional) + len(config.batch_input)
    expected += len(sequence_controls(config)) + len(config.sequence_batching.state)
    if len(tensors) != expected:
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects {expected} inputs, model provides {len(tensors)}"
        )
    tensors.update(describe(initializers))
    for tensor in config.input:
        name = tensor.name
        if tensor.optional and config.max_batch_size != 0:
            raise invalid_arg(
                f"unable to load model '{model}', optional input '{name}' is not supported for models that "
                "support batching"
            )
        found = tensors.get(name)
        if found is None:
            raise unexpected_input(name, tensors)
        _check_type(model, f"input '{name}'", tensor.data_type, found)
        if tensor.optional and tensor.allow_ragged_batch:
            raise invalid_arg(
                f"unable to load model '{model}', configuration expects model provides input with shape [-1] for "
                f"ragged input '{name}', which is not supported for optional input"
            )
        if tensor.allow_ragged_batch:
            if found.dims != (-1,):
                raise invalid_arg(
                    f"unable to load model '{model}', configuration expects model provides input with shape [-1]  "
                    f"for ragged input '{name}', model provides {shape_text(found.dims)}"
                )
        else:
            check_dims(model, name, found.dims, config_dims(tensor), config.max_batch_size, exact=False)


def check_outputs(config: mc.ModelConfig, outputs: Sequence[Any]) -> None:
    """Triton's ValidateOutputs: a config may leave model outputs out, not add any; batch
    outputs keep their own shapes."""
    model = config.name
    tensors = describe(outputs)
    scattered = {name for batch_output in config.batch_output for name in batch_output.target_name}
    for tensor in config.output:
        found = tensors.get(tensor.name)
        if found is None:
            raise unexpected_output(tensor.name, tensors)
        _check_type(model, f"output '{tensor.name}'", tensor.data_type, found)
        if tensor.name not in scattered:
            check_dims(model, tensor.name, found.dims, config_dims(tensor), config.max_batch_size, exact=True)
    # Triton 2.51 means to check state outputs here, but reads the state list only when
    # it is absent, so it never does; the sequence batcher reads each state output by
    # name, so turnout checks them as Triton's code intends.
    for state in config.sequence_batching.state:
        found = tensors.get(state.output_name)
        if found is None:
            raise unexpected_output(state.output_name, tensors)
        _check_type(model, f"output state '{state.output_name}'", state.data_type, found)


def _check_type(model: str, what: str, data_type: int, found: OnnxTensor) -> None:
    """The config datatype is one ONNX Runtime takes (INTERNAL) and the model's (INVALID_ARG)."""
    expected = _ONNX_OF_CONFIG.get(data_type)
    name = mc.DataType.Name(data_type)
    if expected is None:
        raise internal(f"unsupported datatype {name} for {what} for model '{model}'")
    if expected != found.onnx_type:
        provided = server_type_name(found.config_type)
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects datatype {name} for {what}, model provides "
            f"{provided}"
        )
