"""What the TensorRT sidecar decides without TensorRT: an engine's I/O as plain data,
config auto-complete from it (as Triton's tensorrt backend), the optimization profile
that fits a batch, and how device buffers grow. Tested on machines without a GPU."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protos import model_config_pb2 as mc
from protos.codec import element_count
from protos.status import internal, invalid_arg
from sidecars.backend_checks import config_dims, unexpected_input, unexpected_output

log = logging.getLogger(__name__)

_INT_MAX = 2**31 - 1  # where no input bounds the batch, Triton's running minimum stays INT_MAX

# tensorrt.DataType member names -> config datatypes (FP8/INT4 have no protocol type).
TRT_TYPES: dict[str, int] = {
    "FLOAT": mc.TYPE_FP32,
    "HALF": mc.TYPE_FP16,
    "BF16": mc.TYPE_BF16,
    "INT8": mc.TYPE_INT8,
    "UINT8": mc.TYPE_UINT8,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "BOOL": mc.TYPE_BOOL,
}

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One optimization profile's bounds for an input: min, opt and max shapes."""

    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True)
class EngineTensor:
    """One named I/O tensor of an engine; -1 marks a dynamic dimension. `profiles` has
    one entry per optimization profile for inputs, none for outputs; for a shape tensor
    (`is_shape_tensor`, an input whose values set other shapes) they bound its values,
    not its shape. `linear_format` is False for vectorized (non-linear) I/O formats."""

    name: str
    is_input: bool
    trt_type: str
    shape: Shape
    profiles: tuple[Profile, ...] = field(default_factory=tuple)
    is_shape_tensor: bool = False
    linear_format: bool = True


def config_type(tensor: EngineTensor) -> int:
    """Triton's ConvertTrtTypeToConfigDataType: TYPE_INVALID where there is none."""
    return TRT_TYPES.get(tensor.trt_type, mc.TYPE_INVALID)


def auto_complete(config: mc.ModelConfig, tensors: Sequence[EngineTensor]) -> None:
    """Complete `config` in place from the engine's I/O, as Triton's tensorrt backend
    (AutoCompleteConfigHelper): batching from the config's shapes and the profiles'
    largest batch, then the tensors the config leaves out and the fields of those it
    names. It runs even when the config names every tensor."""
    model = config.name
    hint = _batching_hint(config, tensors)
    engine_max = _max_supported_batch(config, tensors)
    shaped = any(config_dims(t) for t in [*config.input, *config.output] if not _ragged(t))
    if hint and engine_max == 0:
        raise internal(
            f"autofill failed for model '{model}': model tensor shape configuration hints for dynamic batching but "
            "the underlying engine doesn't support batching."
        )
    if shaped and not hint:
        log.warning("The specified dimensions in model config for %s hints that batching is unavailable", model)
        engine_max = 0
    if config.max_batch_size == 0:
        config.max_batch_size = engine_max
    elif config.max_batch_size > engine_max:
        raise internal(
            f"autofill failed for model '{model}': configuration specified max-batch {config.max_batch_size} but "
            f"TensorRT engine only supports max-batch {engine_max}"
        )
    scheduled = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
    if engine_max > 1 and not scheduled:
        config.dynamic_batching.SetInParent()
    batched = config.max_batch_size != 0
    _fix_tensors(config.input, [t for t in tensors if t.is_input], batched)
    _fix_tensors(config.output, [t for t in tensors if not t.is_input], batched)


def _ragged(tensor: mc.ModelInput | mc.ModelOutput) -> bool:
    return isinstance(tensor, mc.ModelInput) and tensor.allow_ragged_batch


def _batching_hint(config: mc.ModelConfig, tensors: Sequence[EngineTensor]) -> bool:
    """Whether the config's shapes say the model batches: a tensor whose engine rank is
    one more than its config rank, or a ragged input. Shapes that disagree are refused."""
    if not (config.input or config.batch_input or config.output):
        return False
    engine = {t.name: t for t in tensors}
    inputs = {t.name for t in tensors if t.is_input}
    outputs = {t.name for t in tensors if not t.is_input}
    hint = False
    for kind, entries in (("input", config.input), ("output", config.output)):
        for entry in entries:
            if _ragged(entry):
                return True  # Triton stops reading at the first ragged input
            dims = config_dims(entry)
            if kind == "input" and entry.name not in inputs:
                raise unexpected_input(entry.name, inputs)
            if kind == "output" and entry.name not in outputs:
                raise unexpected_output(entry.name, outputs)
            tensor = engine[entry.name]
            if not dims:
                continue
            if tensor.is_shape_tensor:
                batches = bool(tensor.shape) and tensor.shape[0] == dims[0] + 1
            else:
                batches = len(tensor.shape) == len(dims) + 1
            hint = hint or batches
            if hint and not batches:
                raise internal(
                    f"unable to autofill for '{config.name}', model tensor configurations are contradicting each "
                    "other in terms of whether batching is supported"
                )
    return hint


def _max_supported_batch(config: mc.ModelConfig, tensors: Sequence[EngineTensor]) -> int:
    """The largest batch over the profiles the instance groups name (profile 0 when none
    does), each profile's being the smallest kMAX first dim (or shape value) of its inputs."""
    inputs = [t for t in tensors if t.is_input]
    count = max((len(t.profiles) for t in inputs), default=0)
    selected = set()
    for group in config.instance_group:
        for profile in group.profile:
            index = profile_index(profile)
            if not 0 <= index < count:
                raise internal(
                    f"unable to autofill for '{config.name}', configuration specified invalid profile {profile} . "
                    f"Number of profiles supported by TensorRT engine: {count}"
                )
            selected.add(index)
    largest = 0
    for index in selected or {0}:
        bounds = [t.profiles[index].max[0] for t in inputs if index < len(t.profiles) and t.profiles[index].max]
        largest = max(largest, min(bounds, default=_INT_MAX))
    return largest


def profile_index(profile: str) -> int:
    """Triton's GetProfileIndex: the leading integer of the text, as std::stoi reads it."""
    if not profile:
        raise invalid_arg("profile name must not be empty")
    match = re.match(r"\s*[+-]?\d+", profile)
    if match is None:
        raise invalid_arg(f"unable to parse '{profile}': stoi")
    return int(match.group())


def _fix_tensors(entries: Any, tensors: list[EngineTensor], batched: bool) -> None:
    """Triton's FixIO: a config without any of these tensors takes them all from the
    engine; else each one it names gets the datatype, dims and flags it leaves out."""
    if not entries:
        for tensor in tensors:
            entry = entries.add(name=tensor.name.split(" ")[0], data_type=config_type(tensor))
            _set_dims(entry, tensor, batched)
            entry.is_shape_tensor = tensor.is_shape_tensor
            if not tensor.linear_format:
                entry.is_non_linear_format_io = True
        return
    engine = {t.name.split(" ")[0]: t for t in tensors}
    for entry in entries:
        found = engine.get(entry.name)
        if found is None:
            continue
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = config_type(found)
        if not entry.dims:
            _set_dims(entry, found, batched)
        if entry.is_shape_tensor and not found.is_shape_tensor:
            raise invalid_arg(f"'{entry.name}' is incorrectly specified as a shape tensor.")
        entry.is_shape_tensor = found.is_shape_tensor
        if entry.is_non_linear_format_io and found.linear_format:
            raise invalid_arg(
                f"'{entry.name}' uses a linear IO format, but 'is_non_linear_format_io' is incorrectly set to true "
                "in the model configuration."
            )
        entry.is_non_linear_format_io = not found.linear_format


def _set_dims(entry: Any, tensor: EngineTensor, batched: bool) -> None:
    """Triton's InitIODims: without the batch dim when batching; a shape tensor's dims
    are its value count, less one when batching; an empty shape is [1] reshaped to []."""
    if tensor.is_shape_tensor:
        if tensor.shape:
            entry.dims.append(tensor.shape[0] - 1 if batched else tensor.shape[0])
        return
    dims = tensor.shape[1:] if batched else tensor.shape
    if dims:
        entry.dims.extend(dims)
        return
    entry.dims.append(1)
    entry.reshape.SetInParent()


def choose_profile(tensors: Sequence[EngineTensor], shapes: Mapping[str, Shape], model: str) -> int:
    """The first optimization profile whose bounds hold every input's shape (Triton's
    choice too); engines without profiles take profile 0."""
    inputs = [t for t in tensors if t.is_input and not t.is_shape_tensor]
    count = max((len(t.profiles) for t in inputs), default=0)
    if count == 0:
        return 0
    for index in range(count):
        if all(_fits(t.profiles[index], shapes[t.name]) for t in inputs if t.name in shapes and t.profiles):
            return index
    wanted = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    raise invalid_arg(f"no optimization profile of model '{model}' accepts the input shapes {wanted}")


def _fits(profile: Profile, shape: Shape) -> bool:
    return len(shape) == len(profile.min) and all(
        low <= d <= high for low, d, high in zip(profile.min, shape, profile.max, strict=True)
    )


@dataclass(frozen=True)
class Binding:
    """Where one I/O tensor lives between calls: its name, direction and the size its
    device buffer must have for a given shape."""

    name: str
    is_input: bool
    element_size: int


def bindings(tensors: Sequence[EngineTensor], element_sizes: Mapping[str, int]) -> list[Binding]:
    """Inputs first, then outputs, each in engine order: the order addresses are set."""
    ordered = [t for t in tensors if t.is_input] + [t for t in tensors if not t.is_input]
    return [Binding(t.name, t.is_input, element_sizes[t.trt_type]) for t in ordered]


def byte_size(binding: Binding, shape: Shape) -> int:
    return element_count(shape) * binding.element_size


def grown_capacity(current: int, needed: int) -> int:
    """Device buffers are reused; when one is too small it grows to the next power of two
    (at least 256 bytes), so a slowly rising batch size reallocates only a few times."""
    if needed <= current:
        return current
    capacity = 256
    while capacity < needed:
        capacity *= 2
    return capacity
