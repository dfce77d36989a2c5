"""Triton's tensorrt backend checks of a config against the engine each instance loads
(instance_state.cc: the instance kind, ValidateIO, and the checks of InitIOBindingBuffers
as it binds every config input, sequence control, state and output), in its order,
status codes and words. Pure logic over EngineTensor lists, so they run without a GPU."""

from __future__ import annotations

from collections.abc import Sequence

from protos import model_config_pb2 as mc
from protos.codec import shape_text
from protos.status import internal, invalid_arg, not_found
from sidecars.backend_checks import config_dims, server_type_name, unexpected_input, unexpected_output
from sidecars.sequence_config import sequence_controls
from sidecars.tensorrt.engine import TRT_TYPES, EngineTensor

# The config datatypes TensorRT can take (ConvertDataTypeToTrtType).
_TRT_DATATYPES = frozenset(TRT_TYPES.values())


def check_instance_kind(config: mc.ModelConfig, group: mc.ModelInstanceGroup) -> None:
    """TensorRT engines run on GPUs only: KIND_CPU and KIND_MODEL are refused."""
    if group.kind != mc.ModelInstanceGroup.KIND_GPU:
        raise invalid_arg(f"unable to load model '{config.name}', TensorRT backend supports only GPU device")


def validate_io(config: mc.ModelConfig, tensors: Sequence[EngineTensor]) -> None:
    """Triton's ValidateIO: no more inputs than the engine has, only its names, datatypes
    TensorRT takes, and the shape-tensor and non-linear-format flags as the engine's."""
    model = config.name
    inputs = {t.name for t in tensors if t.is_input}
    outputs = {t.name for t in tensors if not t.is_input}
    if len(inputs) < len(config.input):
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects {len(config.input)} inputs, model provides at "
            f"most {len(inputs)}"
        )
    for tensor in config.input:
        if tensor.name not in inputs:
            raise unexpected_input(tensor.name, inputs)
    for output in config.output:
        if output.name not in outputs:
            raise unexpected_output(output.name, outputs)
    engine = {t.name: t for t in tensors}
    for kind, entries in (("input", config.input), ("output", config.output)):
        for entry in entries:
            _check_flags(model, kind, entry, engine[entry.name])


def _check_flags(model: str, kind: str, entry: mc.ModelInput | mc.ModelOutput, tensor: EngineTensor) -> None:
    what = f"{kind} '{entry.name}' for model '{model}'"
    if entry.data_type not in _TRT_DATATYPES:
        raise internal(f"unsupported datatype {mc.DataType.Name(entry.data_type)} for {what}")
    if tensor.is_shape_tensor and not entry.is_shape_tensor:
        raise internal(f"{what} is a shape tensor but the model configuration doesn't mark it as a shape tensor.")
    if entry.is_shape_tensor and not tensor.is_shape_tensor:
        raise internal(f"{what} is incorrectly marked as a shape tensor in the model configuration.")
    if not tensor.linear_format and not entry.is_non_linear_format_io:
        raise internal(
            f"{what} uses a non-linear IO format, but 'is_non_linear_format_io' is incorrectly set to false in the "
            "model configuration."
        )
    if tensor.linear_format and entry.is_non_linear_format_io:
        raise internal(
            f"{what} uses a linear IO format, but 'is_non_linear_format_io' is incorrectly set to true in the model "
            "configuration."
        )


def check_bindings(config: mc.ModelConfig, tensors: Sequence[EngineTensor], instance: str) -> None:
    """The checks Triton makes as it binds each tensor to a buffer, in its order: config
    inputs (shape tensors first), sequence controls, batch inputs, state inputs, then
    outputs and state outputs; finally every engine tensor must have been bound."""
    engine = {t.name: t for t in tensors}
    binder = _Binder(config, engine, instance)
    for entry in config.input:
        binder.shape_input(entry)
    for entry in config.input:
        binder.input(entry.name, entry.data_type, config_dims(entry), ragged=entry.allow_ragged_batch)
    for control in sequence_controls(config):
        binder.input(control.name, control.data_type, [1], control=True)
    for batch_input in config.batch_input:
        for name in batch_input.target_name:
            binder.batch_input(name)
    for state in config.sequence_batching.state:
        binder.input(state.input_name, state.data_type, list(state.dims), state=True)
    # A batch output is scattered by its source input's shape, so its dims go unchecked.
    scattered = {name for batch_output in config.batch_output for name in batch_output.target_name}
    for entry in config.output:
        if entry.is_shape_tensor:
            binder.shape_output(entry.name)
        else:
            binder.output(entry.name, entry.data_type, config_dims(entry), scattered=entry.name in scattered)
    for state in config.sequence_batching.state:
        binder.output(state.output_name, state.data_type, list(state.dims), state=True)
    for tensor in tensors:
        if tensor.name not in binder.bound:
            kind = "input" if tensor.is_input else "output"
            raise invalid_arg(f"expected configuration for {kind} '{tensor.name}' for {instance}")


class _Binder:
    """Triton's Initialize*Binding checks, remembering what is bound."""

    def __init__(self, config: mc.ModelConfig, engine: dict[str, EngineTensor], instance: str) -> None:
        self.model = config.name
        self.batching = config.max_batch_size > 0
        self.engine = engine
        self.instance = instance
        self.bound: set[str] = set()

    def _find(self, kind: str, name: str) -> EngineTensor:
        tensor = self.engine.get(name)
        if tensor is None:
            raise not_found(f"{kind} '{name}' not found for {self.instance}")
        return tensor

    def _once(self, kind: str, name: str) -> None:
        if name in self.bound:
            raise invalid_arg(f"{kind} '{name}'  has already appeared as an input or output for {self.instance}")

    def shape_input(self, entry: mc.ModelInput) -> None:
        tensor = self._find("input", entry.name)
        self._once("input", entry.name)
        if not tensor.is_input:
            raise invalid_arg(f"input '{entry.name}' is expected to be an input in model for {self.instance}")
        if not tensor.is_shape_tensor:
            return
        if entry.data_type not in (mc.TYPE_INT32, mc.TYPE_INT64):
            raise invalid_arg(
                f"unexpected datatype {server_type_name(entry.data_type)} in model configuration for shape input "
                f"'{entry.name}', expecting TYPE_INT32 or TYPE_INT64 for {self.instance}"
            )
        provided = TRT_TYPES.get(tensor.trt_type)
        if provided != entry.data_type:
            raise invalid_arg(
                f"unexpected datatype {server_type_name(provided)} in engine for shape input '{entry.name}', "
                f"expecting {server_type_name(entry.data_type)} for {self.instance}"
            )
        compare_shape_dims(self.model, entry.name, tensor.shape, config_dims(entry), self.batching)
        self.bound.add(entry.name)

    def input(
        self,
        name: str,
        data_type: int,
        dims: list[int],
        *,
        ragged: bool = False,
        control: bool = False,
        state: bool = False,
    ) -> None:
        tensor = self._find("input", name)
        if state and name in self.bound:
            return  # a state input the config also lists is bound once
        if tensor.is_shape_tensor:
            return  # bound with the shape inputs
        self._once("input", name)
        if not tensor.is_input:
            raise invalid_arg(f"input '{name}' is expected to be an input in model for {self.instance}")
        self._check_type("input", name, data_type, tensor)
        if control and -1 in tensor.shape:
            _check_dynamic_control(self.model, name, tensor.shape, self.batching)
        elif ragged:
            if len(tensor.shape) != 1 or not dims or tensor.shape[0] != dims[0]:
                raise invalid_arg(
                    f"model '{self.model}', tensor '{name}': for the model to support ragged input, the engine shape "
                    f"is: {shape_text(tensor.shape)} while the model config shape is: {shape_text(dims)}"
                )
        else:
            compare_dims(self.model, name, tensor.shape, dims, self.batching)
        self.bound.add(name)

    def batch_input(self, name: str) -> None:
        """turnout feeds no batch inputs, so only the name is bound, not checked further."""
        self._find("input", name)
        self._once("input", name)
        self.bound.add(name)

    def shape_output(self, name: str) -> None:
        self._once("output", name)
        if self.engine[name].is_input:
            raise invalid_arg(f"output '{name}' is expected to be an output in model for {self.instance}")
        self.bound.add(name)

    def output(
        self, name: str, data_type: int, dims: list[int], *, state: bool = False, scattered: bool = False
    ) -> None:
        tensor = self._find("output", name)
        if state and name in self.bound:
            return
        if tensor.is_input:
            # sic: Triton's text for an output name that is an engine input
            raise invalid_arg(f"output '{name}' is expected to be an input in model for {self.instance}")
        self._once("output", name)
        self._check_type("output", name, data_type, tensor)
        if not scattered:
            compare_dims(self.model, name, tensor.shape, dims, self.batching)
        self.bound.add(name)

    def _check_type(self, kind: str, name: str, data_type: int, tensor: EngineTensor) -> None:
        provided = TRT_TYPES.get(tensor.trt_type)
        if provided is None or provided != data_type:
            raise invalid_arg(
                f"unexpected datatype {server_type_name(provided)} for inference {kind} '{name}', expecting "
                f"{server_type_name(data_type)} for {self.instance}"
            )


def compare_dims(model: str, tensor: str, engine_dims: Sequence[int], dims: Sequence[int], batching: bool) -> None:
    """The tensorrt backend's CompareDimsSupported (never exact here): equal ranks, the
    batch dim included when batching, and equal dims wherever neither side is -1. Unlike
    ONNX Runtime's, a batching engine's first dim need not be -1."""
    prefix = f"model '{model}', tensor '{tensor}': "
    if batching:
        if not engine_dims:
            raise invalid_arg(
                prefix + "for the model to support batching the shape should have at least 1 dimension; but shape "
                f"expected by the model is {shape_text(engine_dims)}"
            )
        full = [-1, *dims]
        if not _wildcard_match(engine_dims, full):
            raise invalid_arg(
                prefix + f"the model expects {len(engine_dims)} dimensions (shape {shape_text(engine_dims)}) but the "
                f"model configuration specifies {len(full)} dimensions (an initial batch dimension because "
                "max_batch_size > 0 followed by the explicit tensor shape, making complete shape "
                f"{shape_text(full)})"
            )
    elif not _wildcard_match(engine_dims, dims):
        raise invalid_arg(
            prefix + f"the model expects {len(engine_dims)} dimensions (shape {shape_text(engine_dims)}) but the "
            f"model configuration specifies {len(dims)} dimensions (shape {shape_text(dims)})"
        )


def _wildcard_match(engine_dims: Sequence[int], dims: Sequence[int]) -> bool:
    if len(engine_dims) != len(dims):
        return False
    return all(e == d for e, d in zip(engine_dims, dims, strict=True) if e != -1 and d != -1)


def compare_shape_dims(
    model: str, tensor: str, engine_dims: Sequence[int], dims: Sequence[int], batching: bool
) -> None:
    """CompareShapeDimsSupported: a shape tensor is 0-D or 1-D, and a 1-D one holds as
    many values as the config's dims say, plus one for the batch when batching."""
    mismatch = len(dims) != len(engine_dims)
    if not mismatch and len(engine_dims) == 1:
        mismatch = dims[0] + (1 if batching else 0) != engine_dims[0] or dims[0] == -1
    elif not mismatch and len(engine_dims) > 1:
        raise internal(
            f"unable to load model '{model}', shape binding '{tensor}' can only be 0-d or 1-D tensor, got "
            f"{shape_text(engine_dims)}"
        )
    if mismatch:
        raise internal(
            f"unable to load model '{model}', binding '{tensor}' shape expected by framework "
            f"{shape_text(engine_dims)} doesn't match model configuration shape {shape_text(dims)}"
        )


def _check_dynamic_control(model: str, name: str, engine_dims: Sequence[int], batching: bool) -> None:
    """ValidateControlDimsDynamic: [-1, 1, ...] when batching, else [1, 1, ...]."""
    first = -1 if batching else 1
    inner = ""
    if engine_dims[0] != first:
        inner = f"expects the first dimension to be {first} but the model specified {engine_dims[0]}"
    elif any(d != 1 for d in engine_dims[1:]):
        inner = (
            "expects all dimensions (conditionally first) to be 1 but the model specified shape "
            f"{shape_text(engine_dims)}"
        )
    if inner:
        raise invalid_arg(
            f"unexpected shape {shape_text(engine_dims)} for control input '{name}' for model {model}: {inner}"
        )
