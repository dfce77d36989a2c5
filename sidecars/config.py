"""Model configuration: config.pbtxt and load-time overrides into `inference.ModelConfig`,
and the defaults Triton's core fills in before a framework completes the rest."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format

from protos import layout
from protos import model_config_pb2 as mc
from protos.status import TurnoutError, internal, invalid_arg
from sidecars.sequence_config import check_sequence_config, fill_sequence_defaults

CONFIG_FILE = "config.pbtxt"

# Triton gives CPU instances of these backends two execution slots by default.
_TWO_CPU_INSTANCES = {"onnxruntime", "tensorflow"}
_AOTI_PLATFORM, _AOTI_FILE = "torch_aoti", "model.pt2"


def load_failure(model: str, reason: str) -> TurnoutError:
    """Triton's wording for a model that could not be read or loaded."""
    return internal(f"failed to load '{model}', {reason}")


def read_config(model_dir: Path, model: str) -> mc.ModelConfig | None:
    """The parsed config.pbtxt of a model folder, or None when the folder has none."""
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return None
    return parse_text(path.read_text(), model)


def parse_text(text: str, model: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise load_failure(model, f"failed to parse model config: {exc}") from exc
    return config


def parse_override(text: str, model: str) -> mc.ModelConfig:
    """A load request's `config` parameter: protobuf JSON, possibly partial, ints as strings."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise load_failure(model, f"failed to parse model config override: {exc}") from exc
    return config


def fill_core_defaults(config: mc.ModelConfig, model: str, framework: str, gpu_count: int = 0) -> None:
    """What Triton's core sets before and after the backend's auto-complete; `gpu_count`
    is how many GPUs the framework sees here (KIND_AUTO and empty `gpus` lists)."""
    if config.name and config.name != model:
        raise invalid_arg(
            f"failed to load '{model}', unexpected 'name' in model configuration: '{config.name}', expected '{model}'"
        )
    config.name = model
    backend, platform, filename = layout.DEFAULTS[framework]
    if not config.backend:
        config.backend = backend
    if not config.platform and framework == "onnxruntime":
        config.platform = platform
    if not config.default_model_filename:
        # torch.export / AOTInductor packages are model.pt2, TorchScript model.pt.
        config.default_model_filename = _AOTI_FILE if config.platform == _AOTI_PLATFORM else filename
    policy = config.version_policy
    if not config.HasField("version_policy") or (policy.HasField("latest") and policy.latest.num_versions == 0):
        policy.latest.num_versions = 1
    batching = config.dynamic_batching
    if config.HasField("dynamic_batching") and not batching.preferred_batch_size and config.max_batch_size > 0:
        # Triton's core: without preferred sizes, max_batch_size is the one.
        batching.preferred_batch_size.append(config.max_batch_size)
    fill_sequence_defaults(config)
    if framework == "ensemble":
        return  # Triton's core gives ensembles no optimization and no instance groups
    if not config.HasField("optimization"):
        # Triton's core defaults: pinned host buffers for inputs and outputs.
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True
    _fill_instance_groups(config, gpu_count)


def _fill_instance_groups(config: mc.ModelConfig, gpu_count: int) -> None:
    # As Triton's core: KIND_AUTO is KIND_GPU where a GPU is usable, and a GPU group
    # without `gpus` runs on every GPU. Where none is, the runtime decides (the ONNX
    # sidecar falls back to CPU with a warning, the PyTorch one refuses the model).
    if not config.instance_group:
        config.instance_group.add()
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = config.name if len(config.instance_group) == 1 else f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpu_count else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(range(gpu_count))
        if group.count < 1:
            two = group.kind == mc.ModelInstanceGroup.KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = 2 if two else 1


def check(config: mc.ModelConfig) -> None:
    """Reject configs no runtime can serve, with Triton-like texts."""
    model = config.name
    if config.max_batch_size < 0:
        raise invalid_arg(f"failed to load '{model}', max_batch_size must be non-negative value for {model}")
    if not config.input:
        raise invalid_arg(f"failed to load '{model}', model configuration must specify 'input' for {model}")
    if not config.output:
        raise invalid_arg(f"failed to load '{model}', model configuration must specify 'output' for {model}")
    tensors = [("input", t) for t in config.input] + [("output", t) for t in config.output]
    for kind, tensor in tensors:
        if tensor.data_type == mc.TYPE_INVALID:
            raise invalid_arg(f"failed to load '{model}', model {kind} '{tensor.name}' must specify 'data_type'")
        if not tensor.dims and not tensor.HasField("reshape"):
            raise invalid_arg(f"failed to load '{model}', model {kind} '{tensor.name}' must specify 'dims'")
    check_sequence_config(config)


def model_file(config: mc.ModelConfig, version_dir: Path) -> Path:
    return version_dir / config.default_model_filename
