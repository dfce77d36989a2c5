"""Triton's checks of an ensemble config on its own (no step model consulted): the
fields an ensemble may not set, and a data flow from the ensemble inputs that writes
every output and leaves no tensor unused. Texts are Triton's, quirks included."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from protos.status import invalid_arg

ENSEMBLE_PLATFORM = "ensemble"


@dataclass
class _Tensor:
    """An ensemble tensor in the data flow: which tensors it is computed from and feeds."""

    name: str
    written: bool  # some step's output_map writes it
    ready: bool = False
    sources: list[_Tensor] = field(default_factory=list)
    consumers: list[_Tensor] = field(default_factory=list)


def validate_ensemble(config: mc.ModelConfig) -> None:
    """Raise INVALID_ARG with Triton's text for the first problem of an ensemble config."""
    name = config.name
    scheduling = config.HasField("ensemble_scheduling")
    if config.platform == ENSEMBLE_PLATFORM and config.backend:
        raise invalid_arg(f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type")
    if not scheduling:
        raise invalid_arg(f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}")
    if config.platform != ENSEMBLE_PLATFORM:
        raise invalid_arg(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid_arg(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid_arg(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    tensors = _graph(config)
    _check_flow(config, tensors)


def _graph(config: mc.ModelConfig) -> dict[str, _Tensor]:
    """Link every step's input tensors to its output tensors."""
    name = config.name
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for key in ("model_name", "input_map", "output_map"):
            if not getattr(step, key):
                raise invalid_arg(f"must specify '{key}' in step {index} of ensemble '{name}'")
        outputs = []
        for tensor_name in step.output_map.values():
            tensor = tensors.get(tensor_name)
            if tensor is None:
                tensor = tensors[tensor_name] = _Tensor(tensor_name, written=True)
            elif tensor.written:
                raise invalid_arg(
                    f"ensemble tensor '{tensor_name}' can appear in an output map only once "
                    f"for ensemble '{name}' step {index}"
                )
            else:
                tensor.written = True
            outputs.append(tensor)
        # protobuf maps hold each step input once, so Triton's "mapped to multiple
        # ensemble tensors" cannot arise from a parsed config.
        for tensor_name in step.input_map.values():
            source = tensors.setdefault(tensor_name, _Tensor(tensor_name, written=False))
            for output in outputs:
                output.sources.append(source)
                source.consumers.append(output)
    return tensors


def _check_flow(config: mc.ModelConfig, tensors: dict[str, _Tensor]) -> None:
    name = config.name
    ready: deque[_Tensor] = deque()
    for model_input in config.input:
        tensor = tensors.get(model_input.name)
        if tensor is None:
            # Triton's text, its stray quote included.
            raise invalid_arg(f"ensemble input '{model_input.name}' for ensemble {name}' is not used")
        tensor.ready = True
        ready.append(tensor)
    while ready:
        for consumer in ready.popleft().consumers:
            if not consumer.ready and all(source.ready for source in consumer.sources):
                consumer.ready = True
                ready.append(consumer)
    outputs = set()
    for model_output in config.output:
        tensor = tensors.get(model_output.name)
        if tensor is None:
            raise invalid_arg(f"ensemble output '{model_output.name}' for ensemble {name}' is not used")
        if not tensor.ready:
            message = f"output '{model_output.name}' for ensemble '{name}' is not written"
            source = _first_unready_source(tensor)
            if source is not tensor:
                message += f": at least one of its depending tensors, '{source.name}', is not connected"
            raise invalid_arg(message)
        outputs.add(tensor.name)
    for tensor in tensors.values():
        if tensor.name not in outputs and (not tensor.ready or not tensor.consumers):
            raise invalid_arg(f"ensemble tensor '{tensor.name}' is unused in ensemble '{name}'")


def _first_unready_source(tensor: _Tensor) -> _Tensor:
    """Walk back through tensors that never became ready, to where the flow breaks;
    a cycle stops the walk."""
    seen: set[str] = set()
    last = tensor
    sources = tensor.sources
    while sources:
        following: list[_Tensor] = []
        for source in sources:
            if not source.ready and source.name not in seen:
                seen.add(source.name)
                last = source
                following = source.sources
                break
        sources = following
    return last
