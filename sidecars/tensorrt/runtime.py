"""TensorRT engines (model.plan) through the TensorRT 10 Python API: each engine
deserialized once per GPU, one execution context and CUDA stream per instance, named
I/O tensors, optimization profiles chosen per batch, device buffers reused across calls.

CUDA memory and streams come from cuda-python (the `tensorrt` extra installs it), so
this image needs no torch. Importing this module fails without `tensorrt`, and building
the runtime fails without a GPU: the sidecar then refuses to start (RuntimeUnavailable).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorrt as trt

try:  # cuda-python >= 12.6 moved the runtime bindings
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - older cuda-python
    from cuda import cudart  # type: ignore[no-redef, unused-ignore]

from protos import model_config_pb2 as mc
from protos.datatypes import BY_CONFIG_NAME
from protos.status import internal, invalid_arg
from sidecars.backend_checks import refuse_optional_inputs, require_model_file
from sidecars.config import model_file
from sidecars.runtime import ModelInstance, RuntimeUnavailable, Tensors, ThreadedInstance
from sidecars.tensorrt.checks import check_bindings, check_instance_kind, validate_io
from sidecars.tensorrt.engine import (
    TRT_TYPES,
    Binding,
    EngineTensor,
    Profile,
    Shape,
    auto_complete,
    bindings,
    byte_size,
    choose_profile,
    grown_capacity,
)

log = logging.getLogger(__name__)

# Bytes per element of each engine datatype: its protocol datatype's.
_ELEMENT_SIZES = {trt: BY_CONFIG_NAME[mc.DataType.Name(data_type)].size for trt, data_type in TRT_TYPES.items()}


def _cuda(result: tuple[Any, ...], what: str) -> Any:
    """cuda-python returns (error, *values); raise on an error, return the values."""
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise internal(f"CUDA error in {what}: {cudart.cudaGetErrorString(error)[1].decode()}")
    return values[0] if len(values) == 1 else values


class TensorrtRuntime:
    """The `tensorrt` framework; refuses to build where no GPU is visible."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        error, count = cudart.cudaGetDeviceCount()
        if error != cudart.cudaError_t.cudaSuccess or count == 0:
            reason = cudart.cudaGetErrorString(error)[1].decode() if error else "no device"
            raise RuntimeUnavailable(f"the tensorrt sidecar cannot start: no NVIDIA GPU is visible ({reason})")
        self._count = count
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)

    def gpu_count(self) -> int:
        return int(self._count)

    def _deserialize(self, path: Path, device: int) -> Any:
        """The engine in a plan file on a GPU, or None where TensorRT cannot read it."""
        _cuda(cudart.cudaSetDevice(device), "cudaSetDevice")
        try:
            data = path.read_bytes()
        except OSError:
            return None
        return self._runtime.deserialize_cuda_engine(data)

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        # Triton's backend takes no default max batch size: the engine's profiles set it.
        refuse_optional_inputs(config)
        groups = config.instance_group
        if not groups or groups[0].kind != mc.ModelInstanceGroup.KIND_GPU:
            return  # as Triton: only a model whose first group is on a GPU is completed
        path = model_file(config, version_dir)
        engine = self._deserialize(path, groups[0].gpus[0] if groups[0].gpus else 0)
        if engine is None:
            raise internal(f"unable to load plan file to auto complete config: {path}")
        auto_complete(config, engine_tensors(engine))

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        refuse_optional_inputs(config)
        path = model_file(config, version_dir)
        engines: dict[int, Any] = {}  # one deserialized engine per GPU, shared by its contexts
        instances: list[ModelInstance] = []
        try:
            for number, group in enumerate(config.instance_group):
                start = first[number] if number < len(first) else 0
                check_instance_kind(config, group)
                for gpu in group.gpus:
                    if not 0 <= gpu < self._count:
                        raise invalid_arg(
                            f"instance group {group.name} of model {config.name} specifies invalid or unsupported "
                            f"gpu id {gpu}"
                        )
                    # As Triton, each GPU's instances are <group>_0 .. <group>_<count - 1>.
                    for index in range(start, group.count):
                        name = f"{group.name}_{index}"
                        require_model_file(path, name)
                        if gpu not in engines:
                            engines[gpu] = self._deserialize(path, gpu)
                        if engines[gpu] is None:
                            raise internal(
                                f"unable to load model '{config.name}': TensorRT could not deserialize {path}"
                            )
                        tensors = engine_tensors(engines[gpu])
                        validate_io(config, tensors)
                        check_bindings(config, tensors, name)
                        instances.append(TensorrtInstance(name, engines[gpu], gpu, config))
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        return instances


def engine_tensors(engine: Any) -> list[EngineTensor]:
    """An engine's named I/O as plain data (names, modes, types, shapes, profiles, formats)."""
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        is_shape_tensor = bool(engine.is_shape_inference_io(name))
        profiles: tuple[Profile, ...] = ()
        if is_input:
            profiles = tuple(
                _profile(engine, name, p, is_shape_tensor) for p in range(engine.num_optimization_profiles)
            )
        linear = engine.get_tensor_format(name) == trt.TensorFormat.LINEAR
        dtype = engine.get_tensor_dtype(name)
        shape = tuple(engine.get_tensor_shape(name))
        tensors.append(EngineTensor(name, is_input, dtype.name, shape, profiles, is_shape_tensor, linear))
    return tensors


def _profile(engine: Any, name: str, index: int, is_shape_tensor: bool) -> Profile:
    """An input's min, opt and max under one profile: shapes, or a shape tensor's values."""
    if is_shape_tensor:
        bounds = engine.get_tensor_profile_values(index, name)
    else:
        bounds = engine.get_tensor_profile_shape(name, index)
    low, opt, high = (tuple(int(d) for d in b) for b in bounds)
    return Profile(low, opt, high)


class TensorrtInstance(ThreadedInstance):
    """One execution context on one GPU with its own stream and reusable device buffers."""

    def __init__(self, name: str, engine: Any, device: int, config: mc.ModelConfig) -> None:
        super().__init__(name)
        self._model = config.name
        self._device = device
        _cuda(cudart.cudaSetDevice(device), "cudaSetDevice")
        self._context = engine.create_execution_context()
        self._stream = _cuda(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._tensors = engine_tensors(engine)
        self._bindings = bindings(self._tensors, _ELEMENT_SIZES)
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, capacity)
        self._profile = -1
        self._outputs = {t.name: BY_CONFIG_NAME[mc.DataType.Name(t.data_type)].numpy for t in config.output}

    def _buffer(self, binding: Binding, size: int) -> int:
        pointer, capacity = self._buffers.get(binding.name, (0, 0))
        wanted = grown_capacity(capacity, max(size, 1))
        if wanted != capacity:
            if pointer:
                _cuda(cudart.cudaFree(pointer), "cudaFree")
            pointer = int(_cuda(cudart.cudaMalloc(wanted), "cudaMalloc"))
            self._buffers[binding.name] = (pointer, wanted)
        return pointer

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        _cuda(cudart.cudaSetDevice(self._device), "cudaSetDevice")
        stream, context = self._stream, self._context
        shapes: dict[str, Shape] = {name: tuple(array.shape) for name, array in inputs.items()}
        profile = choose_profile(self._tensors, shapes, self._model)
        if profile != self._profile:
            context.set_optimization_profile_async(profile, int(stream))
            self._profile = profile
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for binding in (b for b in self._bindings if b.is_input):
            array = np.ascontiguousarray(inputs[binding.name])
            context.set_input_shape(binding.name, array.shape)
            pointer = self._buffer(binding, array.nbytes)
            _cuda(cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, to_device, stream), "copy in")
            context.set_tensor_address(binding.name, pointer)
        results: dict[str, np.ndarray] = {}
        for binding in (b for b in self._bindings if not b.is_input):
            shape = tuple(context.get_tensor_shape(binding.name))
            pointer = self._buffer(binding, byte_size(binding, shape))
            context.set_tensor_address(binding.name, pointer)
            results[binding.name] = np.empty(shape, dtype=self._outputs.get(binding.name, np.float32))
        if not context.execute_async_v3(int(stream)):
            raise internal(f"TensorRT execute failure for model '{self._model}'")
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, array in results.items():
            pointer = self._buffers[name][0]
            _cuda(cudart.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, to_host, stream), "copy out")
        _cuda(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return {name: array for name, array in results.items() if name in self._outputs}

    def close(self) -> None:
        super().close()
        for pointer, _ in self._buffers.values():
            cudart.cudaFree(pointer)
        self._buffers.clear()
        cudart.cudaStreamDestroy(self._stream)
        del self._context
