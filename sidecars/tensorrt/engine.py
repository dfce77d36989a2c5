"""What the TensorRT sidecar decides without TensorRT: an engine's I/O as plain data,
config auto-complete from it (as Triton's tensorrt backend), the optimization profile
that fits a batch, and how device buffers grow. Tested on machines without a GPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from protos.codec import element_count
from protos.status import invalid_arg

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
    one entry per optimization profile for inputs, none for outputs."""

    name: str
    is_input: bool
    trt_type: str
    shape: Shape
    profiles: tuple[Profile, ...] = field(default_factory=tuple)


def config_type(tensor: EngineTensor) -> int:
    data_type = TRT_TYPES.get(tensor.trt_type)
    if data_type is None:
        raise invalid_arg(f"unsupported TensorRT datatype {tensor.trt_type} for tensor '{tensor.name}'")
    return data_type


def supports_batching(tensors: Sequence[EngineTensor]) -> bool:
    """An explicit-batch engine batches when every I/O tensor's first dim is dynamic."""
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def max_profile_batch(tensors: Sequence[EngineTensor]) -> int:
    """The largest batch some profile accepts for every input."""
    inputs = [t for t in tensors if t.is_input]
    if not inputs or not inputs[0].profiles:
        return 0
    count = len(inputs[0].profiles)
    return max(min(t.profiles[p].max[0] for t in inputs if t.profiles) for p in range(count))


def auto_complete(config: mc.ModelConfig, tensors: Sequence[EngineTensor], default_max: int) -> None:
    """Complete `config` in place from the engine's I/O, as Triton's tensorrt backend:
    batching from dynamic first dims and the profiles' largest batch, then the tensors
    the config leaves out, dims without the batch dim."""
    batching = supports_batching(tensors)
    largest = max_profile_batch(tensors) if batching else 0
    if config.max_batch_size == 0 and batching and not (config.input and config.output):
        config.max_batch_size = min(max(default_max, 1), largest) if largest else max(default_max, 0)
        if config.max_batch_size > 1 and not _has_scheduler(config):
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size > 0 and not batching:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': model does not support batching while non-zero "
            "max_batch_size is specified"
        )
    elif largest and config.max_batch_size > largest:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': configuration specified max-batch {config.max_batch_size} "
            f"but TensorRT engine only supports max-batch {largest}"
        )
    batched = config.max_batch_size > 0
    if not config.input:
        for tensor in (t for t in tensors if t.is_input):
            _add(config.input.add(), tensor, batched)
    if not config.output:
        for tensor in (t for t in tensors if not t.is_input):
            _add(config.output.add(), tensor, batched)


def _has_scheduler(config: mc.ModelConfig) -> bool:
    return any(config.HasField(f) for f in ("dynamic_batching", "sequence_batching", "ensemble_scheduling"))


def _add(entry: mc.ModelInput | mc.ModelOutput, tensor: EngineTensor, batched: bool) -> None:
    entry.name = tensor.name
    entry.data_type = config_type(tensor)  # type: ignore[assignment]
    dims = list(tensor.shape[1:] if batched else tensor.shape)
    if not dims:
        entry.dims.append(1)
        entry.reshape.SetInParent()
    else:
        entry.dims.extend(dims)


def choose_profile(tensors: Sequence[EngineTensor], shapes: Mapping[str, Shape], model: str) -> int:
    """The first optimization profile whose bounds hold every input's shape (Triton's
    choice too); engines without profiles take profile 0."""
    inputs = [t for t in tensors if t.is_input]
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
