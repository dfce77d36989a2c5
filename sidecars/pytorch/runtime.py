"""PyTorch models: TorchScript (model.pt) and torch.export programs (model.pt2), one
loaded module per instance on its instance group's device, run under inference mode
on the instance's own thread (and its own CUDA stream on a GPU)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from protos import model_config_pb2 as mc
from protos.status import TurnoutError, internal, invalid_arg
from sidecars.backend_checks import refuse_optional_inputs, require_model_file
from sidecars.config import model_file
from sidecars.pytorch.checks import Bindings, check_model
from sidecars.pytorch.exported import ProgramSignature, check_program, read_signature
from sidecars.pytorch.naming import Argument
from sidecars.pytorch.tensors import CONFIG_TYPES, to_numpy, to_torch
from sidecars.runtime import ModelInstance, Tensors, ThreadedInstance
from sidecars.sequence_config import state_outputs

log = logging.getLogger(__name__)

# Triton's pytorch_backend parameter names, read from the config's `parameters`.
INTRA_OP = "INTRA_OP_THREAD_COUNT"
INTER_OP = "INTER_OP_THREAD_COUNT"
INFERENCE_MODE = "INFERENCE_MODE"
DISABLE_OPTIMIZED_EXECUTION = "DISABLE_OPTIMIZED_EXECUTION"


class TorchRuntime:
    """The `pytorch` framework. Triton's PyTorch backend completes no config, so a model
    brings its own inputs and outputs."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        # torch.export.load sets a process-wide deserializer while it runs, and refuses to
        # start while another load holds it; versions load on threads of their own.
        self._export_lock = threading.Lock()

    def gpu_count(self) -> int:
        return _gpu_count()

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        log.warning(
            "skipping model configuration auto-complete for '%s': not supported for pytorch backend", config.name
        )

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        devices = [
            (f"{group.name}_{i}", device)
            for number, group in enumerate(config.instance_group)
            for i, device in _devices(config, group)
            if i % group.count >= (first[number] if number < len(first) else 0)
        ]
        refuse_optional_inputs(config)
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        _set_threads(config.name, parameters, [name for name, _ in devices])
        path = model_file(config, version_dir)
        instances: list[ModelInstance] = []
        try:
            for name, device in devices:
                require_model_file(path, config.name)
                loaded = _load_module(config.name, path, device, self._export_lock)
                bindings = check_model(config, loaded.arguments)
                if loaded.program is not None:
                    check_program(config, loaded.program, bindings)
                instances.append(TorchInstance(name, loaded.module, device, bindings, config, parameters))
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        return instances


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _devices(config: mc.ModelConfig, group: mc.ModelInstanceGroup) -> Iterator[tuple[int, torch.device]]:
    """The device of each instance of a group, with Triton's texts for GPUs that are not there."""
    if group.kind != mc.ModelInstanceGroup.KIND_GPU:
        # KIND_CPU, and KIND_MODEL (the model places its own tensors), take CPU inputs.
        for index in range(group.count):
            yield index, torch.device("cpu")
        return
    available = _gpu_count()
    if not group.gpus:
        raise invalid_arg(
            f"instance group {group.name} of model {config.name} has kind KIND_GPU but no GPUs are available"
        )
    index = 0
    for gpu in group.gpus:
        if not 0 <= gpu < available:
            listed = " ".join(str(d) for d in range(available))
            raise invalid_arg(
                f"instance group {group.name} of model {config.name} specifies invalid or unsupported gpu id {gpu}. "
                f"GPUs with at least the minimum required CUDA compute compatibility of 6.0 are: {listed}"
            )
        for _ in range(group.count):
            yield index, torch.device("cuda", gpu)
            index += 1


def _int_parameter(model: str, parameters: dict[str, str], key: str) -> int | None:
    if key not in parameters:
        return None
    try:
        return int(parameters[key])
    except ValueError:
        raise invalid_arg(
            f"failed to parse parameter '{key}' of model '{model}': '{parameters[key]}' is not an integer"
        ) from None


def _bool_parameter(parameters: dict[str, str], key: str, default: bool) -> bool:
    value = parameters.get(key, "").strip().lower()
    return default if not value else value in ("true", "1", "yes", "on")


def _set_threads(model: str, parameters: dict[str, str], instances: list[str]) -> None:
    """As Triton's backend: torch's thread pools are per process, so the last model to
    set a count wins, and the inter-op pool can be sized only before its first use."""
    intra = _int_parameter(model, parameters, INTRA_OP)
    inter = _int_parameter(model, parameters, INTER_OP)
    if intra is not None and intra > 0:
        torch.set_num_threads(intra)
        for name in instances:
            log.info("Intra op thread count is set to %d for model instance '%s'", torch.get_num_threads(), name)
    if inter is not None and inter > 0:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError:
            log.warning(
                "Inter op thread count of model '%s' stays %d: torch sizes that pool once per process",
                model,
                torch.get_num_interop_threads(),
            )
        else:
            for name in instances:
                log.info("Inter op thread count is set to %d for model instance '%s'", inter, name)


@dataclass(frozen=True)
class LoadedModule:
    """A model file as loaded: the callable, its forward() arguments after `self` (None
    when unreadable), and a torch.export program's own signature (None for others)."""

    module: Any
    arguments: list[Argument] | None
    program: ProgramSignature | None = None


def _load_module(model: str, path: Path, device: torch.device, export_lock: threading.Lock) -> LoadedModule:
    try:
        if path.suffix == ".pt2":
            with export_lock:
                return _load_exported(path, device)
        module = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    except TurnoutError:
        raise
    except Exception as exc:  # torch raises its own types for unreadable files
        raise internal(f"failed to load model '{model}': {exc}") from exc
    module.eval()
    arguments = [Argument(a.name, a.type.kind(), str(a.type)) for a in module.forward.schema.arguments]
    if arguments and arguments[0].kind == "ClassType":
        arguments = arguments[1:]  # `self`
    return LoadedModule(module, arguments)


def _load_exported(path: Path, device: torch.device) -> LoadedModule:
    try:
        program = torch.export.load(str(path))
    except Exception:
        # Not a torch.export archive: an AOTInductor package, whose signature is opaque.
        runner = torch._inductor.aoti_load_package(str(path))
        return LoadedModule(runner, None)
    signature = read_signature(program, CONFIG_TYPES)
    module = program.module().to(device)
    names = list(signature.names)
    if not names:
        # The graph's placeholders are renamed (lower case); the module keeps forward()'s own names.
        parameters = inspect.signature(module.forward).parameters.values()
        names = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    return LoadedModule(module, [Argument(name, "TensorType", "Tensor") for name in names], signature)


class TorchInstance(ThreadedInstance):
    def __init__(
        self,
        name: str,
        module: Any,
        device: torch.device,
        bindings: Bindings,
        config: mc.ModelConfig,
        parameters: dict[str, str],
    ) -> None:
        super().__init__(name)
        self._module = module
        self._device = device
        self._layout = bindings.inputs
        self._outputs = [(t.name, t.data_type) for t in config.output] + state_outputs(config)
        self._indices = bindings.outputs
        self._inference_mode = _bool_parameter(parameters, INFERENCE_MODE, True)
        self._optimized = not _bool_parameter(parameters, DISABLE_OPTIMIZED_EXECUTION, False)
        # Each GPU instance queues its work on a stream of its own, as Triton's backend.
        self._stream = None
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def _context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode() if self._inference_mode else torch.no_grad())
        if not self._optimized:
            stack.enter_context(torch.jit.optimized_execution(False))  # type: ignore[attr-defined]
        if self._stream is not None:
            stack.enter_context(torch.cuda.stream(self._stream))
        return stack

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        with self._context():
            try:
                result = self._module(*self._arguments(inputs))
            except Exception as exc:  # TorchScript raises torch.jit.Error and others
                raise internal(f"PyTorch execute failure: {exc}") from exc
            values = _flatten(result)
            outputs = {}
            for name, data_type in self._outputs:
                index = self._indices[name]
                if index >= len(values):
                    raise internal(f"output tensor '{name}' is not found")
                outputs[name] = to_numpy(name, values[index], data_type)
            return outputs

    def _arguments(self, inputs: Tensors) -> list[Any]:
        layout = self._layout
        if layout.dict_input:
            return [{name: to_torch(array, self._device) for name, array in inputs.items()}]
        arguments: list[Any] = [None] * layout.count
        for name, array in inputs.items():
            arguments[layout.positions[name]] = to_torch(array, self._device)
        return arguments

    def close(self) -> None:
        super().close()
        del self._module
        if self._device.type == "cuda":
            torch.cuda.empty_cache()


def _flatten(result: Any) -> list[Any]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, list) and all(isinstance(e, str) for e in result):
        return [result]
    if isinstance(result, list) and all(isinstance(e, torch.Tensor) for e in result):
        return result  # torch.export flattens a returned tuple into a list
    raise internal(
        "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing one of these two "
        "types. It should not be a List / Dictionary of Tensors or a Scalar"
    )
