"""Triton core's rules for a model configuration, in its order and with its texts: the
backend fields it derives from a model folder, the checks of the configuration on its
own (ValidateModelConfig), of its inputs and outputs (ValidateModelIOConfig) and of its
instance groups. Every refusal is INVALID_ARG unless a rule says otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from protos import model_config_pb2 as mc
from protos.status import internal, invalid_arg, unsupported
from sidecars.ensemble.validation import ENSEMBLE_PLATFORM, validate_ensemble
from sidecars.sequence_config import check_sequence_config

# Triton's backend types: a known backend must go with its platform; any other backend
# (python, identity, a custom one) takes any platform. torch_aoti is turnout's own.
_PLATFORM_BACKEND = {
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",
}
_KNOWN_BACKENDS = frozenset(_PLATFORM_BACKEND.values())
_WILDCARD = -1
_Kind = mc.ModelInstanceGroup.Kind
_BatchInputKind = mc.BatchInput.Kind
_ONE_SOURCE_BATCH_INPUTS = frozenset(
    {
        _BatchInputKind.BATCH_ELEMENT_COUNT,
        _BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT,
        _BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO,
        _BatchInputKind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE,
        _BatchInputKind.BATCH_ITEM_SHAPE,
        _BatchInputKind.BATCH_ITEM_SHAPE_FLATTEN,
    }
)


# -- backend fields (AutoCompleteBackendFields) ------------------------------------------


def complete_backend_fields(config: mc.ModelConfig, model_dir: Path) -> None:
    """Derive backend, platform and model file name from the config and the files, as
    Triton's core does before anything else: it looks only in the model folder's first
    subfolder by name (not its newest version), and never opens a model file."""
    model = model_dir.name
    subfolders = sorted(p.name for p in model_dir.iterdir() if p.is_dir()) if model_dir.is_dir() else []
    first = model_dir / subfolders[0] if subfolders else None

    def has(name: str, directory: bool | None = None) -> bool:
        if first is None:
            return False
        path = first / name
        if directory is None:
            return path.exists()
        return path.is_dir() if directory else (path.exists() and not path.is_dir())

    if not config.name:
        config.name = model
    filename = config.default_model_filename
    if not config.platform and config.backend in ("", "tensorflow"):
        if filename == "model.savedmodel" or (not filename and has("model.savedmodel", directory=True)):
            config.platform = "tensorflow_savedmodel"
        if filename == "model.graphdef" or (not filename and has("model.graphdef", directory=False)):
            config.platform = "tensorflow_graphdef"
        if config.platform.startswith("tensorflow_"):
            config.backend = config.backend or "tensorflow"
            config.default_model_filename = filename or config.platform.replace("tensorflow_", "model.")
            return
    if config.platform == _AOTI_PLATFORM and not config.backend:
        config.backend = "pytorch"  # turnout's torch.export platform
    for backend, platform, file, directory in _DETECTED:
        if config.backend:
            break
        untouched = not config.platform and not filename
        if (platform and config.platform == platform) or filename == file or (untouched and has(file, directory)):
            config.backend = backend
    for known, platform, file, _ in _DETECTED:
        if config.backend != known:
            continue
        if known == "pytorch" and not config.platform and not filename and has(_AOTI_FILE) and not has(file):
            config.platform = _AOTI_PLATFORM  # only a torch.export package in the folder
        if platform and not config.platform:
            config.platform = platform
        if not config.default_model_filename and not (known == "pytorch" and config.runtime == "model.py"):
            config.default_model_filename = _AOTI_FILE if config.platform == _AOTI_PLATFORM else file
        return
    if not config.backend and not config.platform and not filename:
        if "." not in model:
            raise invalid_arg(
                f"Invalid model name: Could not determine backend for model '{model}' with no backend in model "
                "configuration. Expected model name of the form 'model.<backend_name>'."
            )
        config.backend = model.partition(".")[2]
        config.default_model_filename = "model." + config.backend


_AOTI_PLATFORM, _AOTI_FILE = "torch_aoti", "model.pt2"
# (backend, platform it implies, model file that implies it, whether that file is a folder),
# in Triton's detection order after TensorFlow; None: a file or a folder.
_DETECTED: tuple[tuple[str, str, str, bool | None], ...] = (
    ("tensorrt", "tensorrt_plan", "model.plan", False),
    ("onnxruntime", "onnxruntime_onnx", "model.onnx", None),
    ("openvino", "", "model.xml", None),
    ("pytorch", "pytorch_libtorch", "model.pt", False),
    ("pytorch", "torch_aoti", _AOTI_FILE, False),  # turnout's own: a torch.export package
    ("python", "", "model.py", None),
)


# -- the configuration on its own (ValidateModelConfig) ----------------------------------


def validate_model_config(config: mc.ModelConfig) -> None:
    name = config.name
    if not name:
        raise invalid_arg("model configuration must specify 'name'")
    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise invalid_arg(f"unexpected platform type '{config.platform}' for {name}")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise invalid_arg(f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type")
    if config.backend in _KNOWN_BACKENDS and _PLATFORM_BACKEND.get(config.platform) != config.backend:
        raise invalid_arg(f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}")
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config)
    check_sequence_config(config)
    if config.HasField("ensemble_scheduling") or config.platform == ENSEMBLE_PLATFORM:
        validate_ensemble(config)
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise invalid_arg(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )


def _check_dynamic_batching(config: mc.ModelConfig) -> None:
    name = config.name
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise invalid_arg(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid_arg(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise invalid_arg(f"default priority level must be in range [1, {levels}] for {name}")
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            raise invalid_arg(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise invalid_arg(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == mc.ModelQueuePolicy.DELAY for p in policies):
            raise invalid_arg(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )


# -- inputs and outputs (ValidateModelIOConfig) ------------------------------------------


class _Refused(Exception):
    """An input or output problem, before Triton adds ' for <model>'."""


def validate_io_config(config: mc.ModelConfig) -> None:
    """Every input, then every output, then the batch inputs and outputs; a refusal ends
    with ' for <model>'."""
    try:
        for tensor in config.input:
            _check_io(tensor, config, "model input ")
            if tensor.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW) and len(tensor.dims) != 3:
                raise _Refused("model input NHWC/NCHW require 3 dims")
            _check_tensorrt_only(tensor, config.platform, "input")
        for output in config.output:
            _check_io(output, config, "model output ")
            _check_tensorrt_only(output, config.platform, "output")
        _check_batch_io(config)
    except _Refused as exc:
        raise invalid_arg(f"{exc} for {config.name}") from None


def _check_io(tensor: mc.ModelInput | mc.ModelOutput, config: mc.ModelConfig, prefix: str) -> None:
    if not tensor.name:
        raise _Refused(prefix + "must specify 'name'")
    named = f"{prefix}'{tensor.name}' "
    if tensor.data_type == mc.TYPE_INVALID:
        raise _Refused(named + "must specify 'data_type'")
    if not tensor.dims:
        raise _Refused(named + "must specify 'dims'")
    reshape = tensor.reshape.shape if tensor.HasField("reshape") else None
    if reshape is not None and not reshape and config.max_batch_size == 0:
        raise _Refused(named + "cannot have empty reshape for non-batching model as scalar tensors are not supported")
    if any(d < 1 and d != _WILDCARD for d in tensor.dims):
        raise _Refused(named + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension")
    if reshape is None:
        return
    if any(d < 1 and d != _WILDCARD for d in reshape):
        raise _Refused(named + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension")
    dims_size, reshape_size = _element_count(tensor.dims), _element_count(reshape)
    if dims_size != reshape_size and not (reshape_size == 0 and dims_size == 1):
        raise _Refused(named + "has different size for dims and reshape")
    if dims_size == _WILDCARD:
        dims_parts, reshape_parts = _fixed_runs(tensor.dims), _fixed_runs(reshape)
        if len(dims_parts) != len(reshape_parts):
            raise _Refused(named + "has different number of variable-size dimensions for dims and reshape")
        if dims_parts != reshape_parts:
            raise _Refused(named + "has different size for dims and reshape")


def _element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 when any dim is variable, 0 for no dims."""
    if not dims:
        return 0
    count = 1
    for d in dims:
        if d == _WILDCARD:
            return _WILDCARD
        count *= d
    return count


def _fixed_runs(dims: Sequence[int]) -> list[int]:
    """The products of the dims between variable-size ones."""
    runs, product = [], 1
    for d in dims:
        if d == _WILDCARD:
            runs.append(product)
            product = 1
        else:
            product *= d
    return [*runs, product]


def _check_tensorrt_only(tensor: mc.ModelInput | mc.ModelOutput, platform: str, kind: str) -> None:
    if platform == "tensorrt_plan":
        if tensor.is_non_linear_format_io and len(tensor.dims) != 3:
            raise _Refused(f"Non-linear IO format {kind} requires 3 dims")
        return
    if tensor.is_shape_tensor:
        raise _Refused("shape tensors are only supported for TensorRT platform")
    if tensor.is_non_linear_format_io:
        raise _Refused("Non-linear IO format is only supported for the TensorRT platform")


def _check_batch_io(config: mc.ModelConfig) -> None:
    inputs = {tensor.name for tensor in config.input}
    for batch_input in config.batch_input:
        kind = _BatchInputKind.Name(batch_input.kind)
        if batch_input.kind not in _ONE_SOURCE_BATCH_INPUTS:
            raise _Refused(f"unknown batch input kind '{kind}'")
        if len(batch_input.source_input) != 1:
            raise _Refused(f"batch input kind '{kind}' expects 1 source input, got {len(batch_input.source_input)}")
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise _Refused("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_input.source_input:
            if source not in inputs:
                raise _Refused(f"unknown source input name '{source}'")
    outputs = {tensor.name for tensor in config.output}
    targets: set[str] = set()
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if batch_output.kind != mc.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE:
            raise _Refused(f"unknown batch output kind '{kind}'")
        if len(batch_output.source_input) != 1:
            raise _Refused(f"batch output kind '{kind}' expects 1 source input, got {len(batch_output.source_input)}")
        for source in batch_output.source_input:
            if source not in inputs:
                raise _Refused(f"unknown source input name '{source}'")
        for target in batch_output.target_name:
            if target not in outputs:
                raise _Refused(f"unknown target output name '{target}'")
            if target in targets:
                raise _Refused(f"target output name '{target}' can only be specified once")
            targets.add(target)


# -- instance groups (NormalizeInstanceGroup, ValidateInstanceGroup) ---------------------

# Triton gives CPU instances of these backends two execution slots by default.
_TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})


def normalize_instance_groups(config: mc.ModelConfig, gpus: Sequence[int]) -> None:
    """One group named after the model where none is given; unnamed groups named
    `<model>_<index>`; KIND_AUTO resolved; counts below 1 defaulted; GPU groups without
    `gpus` on every usable GPU."""
    if config.HasField("ensemble_scheduling"):
        return
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == _Kind.KIND_AUTO:
            usable = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
            group.kind = _Kind.KIND_GPU if usable else _Kind.KIND_CPU
        if group.count < 1:
            two = group.kind == _Kind.KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = 2 if two else 1
        if group.kind == _Kind.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def validate_instance_groups(config: mc.ModelConfig, gpus: Sequence[int]) -> None:
    """`gpus`: the GPU ids usable here. Where there are some, a GPU group's ids must be
    among them, as in Triton; on a machine without any, only a negative id is refused
    and the framework decides (the ONNX Runtime sidecar falls back to CPU with a
    warning, the PyTorch one refuses the group with Triton's text)."""
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.kind == _Kind.KIND_MODEL and group.gpus:
            raise invalid_arg(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == _Kind.KIND_GPU:
            for gpu in group.gpus:
                if gpu < 0 or (gpus and gpu not in gpus):
                    supported = ", ".join(str(g) for g in gpus)
                    raise invalid_arg(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at least the minimum "
                        f"required CUDA compute compatibility of 6.000000 are: {supported}"
                    )
        elif group.kind == _Kind.KIND_CPU and group.gpus:
            raise invalid_arg(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        elif group.kind not in (_Kind.KIND_CPU, _Kind.KIND_MODEL):
            raise internal(f"{where} has unexpected kind {_Kind.Name(group.kind)}")
        if group.profile and config.platform != "tensorrt_plan":
            raise invalid_arg(
                f"{where} and platform {config.platform}specifies profile field which is only supported for "
                "TensorRT models"
            )
        for profile in group.profile:
            if not profile:
                raise invalid_arg("profile name must not be empty")
            try:
                index = int(profile)
            except ValueError:
                raise invalid_arg(f"unable to parse '{profile}': stoi") from None
            if index < 0:
                raise invalid_arg(
                    f"{where} and platform {config.platform} specifies invalid profile {profile}. The field should "
                    "contain the string representation of a non-negative integer."
                )


# -- fields turnout does not implement ----------------------------------------------------


def check_unimplemented(config: mc.ModelConfig) -> list[str]:
    """Refuse the fields turnout does not implement that would change results or
    guarantees; return a warning for each one set that would only change performance.
    Runs on the configuration as given, before defaults are filled in."""
    name = config.name
    refused = _refused_fields(config)
    if refused:
        field, why = refused[0]
        raise unsupported(f"model '{name}' sets {field}, which turnout does not implement: {why}")
    return [
        f"model '{name}' sets {field}, which turnout does not implement; it loads without it ({why})"
        for field, why in _performance_fields(config)
    ]


def _refused_fields(config: mc.ModelConfig) -> list[tuple[str, str]]:
    refused = []
    if config.model_transaction_policy.decoupled and config.backend != "python":
        refused.append(
            ("model_transaction_policy { decoupled: true }", "only python models send several responses per request")
        )
    if config.sequence_batching.iterative_sequence:
        refused.append(("sequence_batching { iterative_sequence: true }", "requests are never rescheduled"))
    if config.batch_input:
        refused.append(("batch_input", "the model would not get the batch tensors it expects"))
    if config.batch_output:
        refused.append(("batch_output", "outputs would not be scattered to requests by input shape"))
    if config.model_repository_agents.agents:
        refused.append(("model_repository_agents", "no agent would prepare the model's files"))
    if config.model_operations.op_library_filename:
        refused.append(("model_operations { op_library_filename }", "custom operation libraries are not loaded"))
    if config.runtime:
        refused.append((f'runtime: "{config.runtime}"', "the framework's sidecar is the runtime"))
    return refused


def _performance_fields(config: mc.ModelConfig) -> list[tuple[str, str]]:
    fields = []
    if config.response_cache.enable:
        fields.append(("response_cache { enable: true }", "every request is computed"))
    groups = config.instance_group
    if any(group.HasField("rate_limiter") for group in groups):
        fields.append(("instance_group { rate_limiter }", "instances run whenever they are free"))
    if any(group.passive for group in groups):
        fields.append(("instance_group { passive: true }", "passive instances take requests too"))
    if any(group.host_policy for group in groups):
        fields.append(("instance_group { host_policy }", "no host policy applies"))
    if any(group.secondary_devices for group in groups):
        fields.append(("instance_group { secondary_devices }", "no secondary device is prepared"))
    optimization = config.optimization
    for field in ("graph", "priority", "cuda", "gather_kernel_buffer_threshold", "eager_batching"):
        if optimization.HasField(field) if field in ("graph", "cuda") else getattr(optimization, field):
            fields.append((f"optimization {{ {field} }}", "the framework's defaults apply"))
    if config.model_metrics.metric_control:
        fields.append(("model_metrics", "metrics keep their default buckets"))
    if config.cc_model_filenames:
        fields.append(("cc_model_filenames", "default_model_filename is loaded on every GPU"))
    return fields
