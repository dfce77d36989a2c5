"""An ensemble's execution plan: its steps in config order with their tensor maps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protos import model_config_pb2 as mc
from protos.ensemble_steps import decoupled_steps
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
    # Steps whose models are decoupled: each of their responses runs the steps after
    # them (`after`, by step index) on its own, and the ensemble is decoupled too.
    decoupled_steps: frozenset[int] = frozenset()
    after: Mapping[int, frozenset[int]] = field(default_factory=dict)

    @property
    def decoupled(self) -> bool:
        return bool(self.decoupled_steps)


def build_plan(config: mc.ModelConfig, version: str, step_configs: Sequence[mc.ModelConfig] = ()) -> Plan:
    """The plan of a loaded (so already validated on its own) ensemble config, given its
    step models' configs in step order (checked by protos.ensemble_steps)."""
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
    decoupled = decoupled_steps(config, step_configs) if step_configs else frozenset()
    after = {index: _after(steps, index) for index in decoupled}
    return Plan(config.name, version, outputs, answer_order, steps, consumed, signature, decoupled, after)


def _after(steps: Sequence[Step], first: int) -> frozenset[int]:
    """The steps that take, directly or through other steps, what step `first` produces."""
    produced = {tensor for _, tensor in steps[first].outputs}
    found: set[int] = set()
    changed = True  # steps may be listed in any order: look again until nothing joins
    while changed:
        changed = False
        for step in steps:
            if step.index == first or step.index in found:
                continue
            if any(tensor in produced for _, tensor in step.inputs):
                found.add(step.index)
                produced.update(tensor for _, tensor in step.outputs)
                changed = True
    return frozenset(found)
