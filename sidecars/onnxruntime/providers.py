"""ONNX Runtime execution providers chosen from a model config, as Triton's backend does:
KIND_GPU runs on the CUDA provider of the instance's device, a `tensorrt` GPU accelerator
puts the TensorRT provider first, and a provider this build lacks falls back to CPU."""

from __future__ import annotations

import ctypes
from collections.abc import Collection
from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from protos.status import invalid_arg

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

Provider = str | tuple[str, dict[str, str]]

# Triton's accelerator parameters -> ONNX Runtime TensorRT provider options.
_TENSORRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
    "minimum_segment_size": "trt_min_subgraph_size",
    "max_partition_iterations": "trt_max_partition_iterations",
}


@dataclass(frozen=True)
class Placement:
    """Where one instance runs: the provider list for its session and what to warn about."""

    providers: list[Provider]
    device: str  # "cpu" or "cuda:N", for logs
    warnings: list[str] = field(default_factory=list)


def instance_devices(group: mc.ModelInstanceGroup) -> list[int | None]:
    """One entry per instance of a group: its GPU id, or None on CPU. A GPU group runs
    `count` instances on each listed GPU (on device 0 when it lists none)."""
    if group.kind != mc.ModelInstanceGroup.KIND_GPU:
        return [None] * group.count
    gpus = list(group.gpus) or [0]
    return [gpu for gpu in gpus for _ in range(group.count)]


def place(config: mc.ModelConfig, device: int | None, available: Collection[str]) -> Placement:
    """The providers of an instance on `device` (None = CPU) given the providers this
    onnxruntime build offers; unknown accelerator names fail as in Triton."""
    if device is None:
        return Placement([CPU], "cpu")
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    providers: list[Provider] = []
    warnings = []
    for accelerator in accelerators:
        if accelerator.name != "tensorrt":
            raise invalid_arg(f"unknown Execution Accelerator '{accelerator.name}' is requested")
        if TENSORRT in available:
            providers.append((TENSORRT, _tensorrt_options(accelerator, device)))
        else:
            warnings.append(f"{TENSORRT} is not available in this onnxruntime build")
    if CUDA in available:
        providers.append((CUDA, {"device_id": str(device)}))
    else:
        warnings.append(f"{CUDA} is not available in this onnxruntime build")
    if not providers:
        return Placement([CPU], "cpu", [*warnings, "running on CPU instead"])
    return Placement([*providers, CPU], f"cuda:{device}", warnings)


def _tensorrt_options(
    accelerator: mc.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator, device: int
) -> dict[str, str]:
    options = {"device_id": str(device)}
    parameters = dict(accelerator.parameters)
    precision = parameters.get("precision_mode", "FP32").upper()
    if precision == "FP16":
        options["trt_fp16_enable"] = "True"
    elif precision == "INT8":
        options["trt_int8_enable"] = "True"
    for key, option in _TENSORRT_OPTIONS.items():
        if key in parameters:
            options[option] = parameters[key]
    return options


def cuda_device_count() -> int:
    """GPUs the CUDA driver reports, asked through libcuda itself so no framework or
    toolkit is needed; 0 where there is no driver or no device."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
