"""Triton's dependency checks of an ensemble, made where the ensemble loads: every step
model is in a repository, no ensemble depends on itself through its steps, and where the
repository states every step model's inputs and outputs (nothing left to complete), the
step maps agree with them. The gateway checks the maps again against the step models
as loaded."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.ensemble_steps import check_step_configs
from protos.status import invalid_arg
from sidecars.ensemble.validation import ENSEMBLE_PLATFORM

# A model name -> its config.pbtxt text ("" without one), or None where no repository has it.
ConfigLookup = Callable[[str], str | None]


def check_dependencies(config: mc.ModelConfig, lookup: ConfigLookup) -> None:
    name = config.name
    steps = [step.model_name for step in config.ensemble_scheduling.step]
    texts = {model: lookup(model) for model in dict.fromkeys(steps)}
    missing = sorted(model for model, text in texts.items() if text is None)
    if missing:
        raise invalid_arg(f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}")
    _check_cycles(name, config, lookup)
    step_configs = [_stated(texts[model]) for model in steps]
    if all(step is not None for step in step_configs):
        check_step_configs(config, [step for step in step_configs if step is not None])


def _check_cycles(name: str, config: mc.ModelConfig, lookup: ConfigLookup) -> None:
    """Follow the steps that are ensembles, depth first, back to `name`."""
    path = [name]

    def visit(current: mc.ModelConfig) -> None:
        for step in dict.fromkeys(s.model_name for s in current.ensemble_scheduling.step):
            if step == name:  # Triton names the start, the ensemble that closes the cycle, the start
                raise invalid_arg(f"circular dependency between ensembles: {name} -> ... -> {path[-1]} -> {name}")
            if step in path:
                continue  # a cycle that does not pass through `name` is its own members' to report
            inner = _ensemble(lookup(step))
            if inner is not None:
                path.append(step)
                visit(inner)
                path.pop()

    visit(config)


def _parse(text: str | None) -> mc.ModelConfig | None:
    if not text:
        return None
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError:
        return None  # its own load reports it
    return config


def _ensemble(text: str | None) -> mc.ModelConfig | None:
    config = _parse(text)
    return config if config is not None and config.platform == ENSEMBLE_PLATFORM else None


def _stated(text: str | None) -> mc.ModelConfig | None:
    """A step model's config when it states all the maps are checked against: inputs,
    outputs and, as no framework completes it then, max_batch_size."""
    config = _parse(text)
    if config is None or not config.input or not config.output or config.platform == ENSEMBLE_PLATFORM:
        return None
    if config.platform == "tensorrt_plan" or config.backend == "tensorrt":
        return None  # TensorRT completes from the engine even then
    return config
