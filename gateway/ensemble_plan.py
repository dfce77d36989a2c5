"""An ensemble's execution plan: its steps in config order with their tensor maps."""

from __future__ import annotations

from dataclasses import dataclass

from protos import model_config_pb2 as mc
from protos.input_order import core_order
from protos.validation import Signature


@dataclass(frozen=True)
class Step:
    """One step: the model it runs, its pinned version ("" = the routing policy picks),
    and which ensemble tensor feeds each input and receives each output."""

    index: int
    model: str
    version: str
    inputs: tuple[tuple[str, str], ...]  # (step model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (step model output, ensemble tensor)


@dataclass(frozen=True)
class Plan:
    """What running one ensemble version needs, built once from its config."""

    name: str
    version: str
    outputs: tuple[str, ...]  # ensemble outputs, config order
    # The order an answer lists them in: Triton's ensemble keeps them in a std::unordered_map.
    answer_order: tuple[str, ...]
    steps: tuple[Step, ...]
    consumed: frozenset[str]  # tensors some step takes as input
    signature: Signature  # what a request must be, checked as Triton's core checks it


def build_plan(config: mc.ModelConfig, version: str) -> Plan:
    """The plan of a loaded (so already validated on its own) ensemble config."""
    steps = tuple(
        Step(
            index,
            step.model_name,
            "" if step.model_version < 0 else str(step.model_version),
            tuple(sorted(step.input_map.items())),
            tuple(sorted(step.output_map.items())),
        )
        for index, step in enumerate(config.ensemble_scheduling.step)
    )
    outputs = tuple(t.name for t in config.output)
    consumed = frozenset(tensor for step in steps for _, tensor in step.inputs)
    answer_order = tuple(outputs[i] for i in core_order(outputs))
    signature = Signature(config)
    return Plan(config.name, version, outputs, answer_order, steps, consumed, signature)
