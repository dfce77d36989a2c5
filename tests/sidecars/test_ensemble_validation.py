"""An ensemble config checked on its own, as Triton's core checks it at load: each
problem gives Triton's text (its quirks included), a sound config passes."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.ensemble.validation import validate_ensemble

HEAD = """
name: "e" platform: "ensemble" max_batch_size: 8
input [ { name: "IN0" data_type: TYPE_INT32 dims: [16] }, { name: "IN1" data_type: TYPE_INT32 dims: [16] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [16] } ]
"""


def step(inputs: dict[str, str], outputs: dict[str, str], model: str = "simple") -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def config(*steps: str, head: str = HEAD, extra: str = "") -> mc.ModelConfig:
    text = f"{head}\nensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n{extra}"
    return text_format.Parse(text, mc.ModelConfig())


PAIR = {"INPUT0": "IN0", "INPUT1": "IN1"}
CASES = {
    "no steps": (config(), "must specify 'step' for ensemble 'e'"),
    "no model": (
        config(step(PAIR, {"OUTPUT0": "OUT"}, model="")),
        "must specify 'model_name' in step 0 of ensemble 'e'",
    ),
    "no outputs": (config(step(PAIR, {})), "must specify 'output_map' in step 0 of ensemble 'e'"),
    "written twice": (
        config(step(PAIR, {"OUTPUT0": "OUT"}), step(PAIR, {"OUTPUT0": "OUT"})),
        "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
    ),
    "input unused": (
        config(step({"INPUT0": "IN0", "INPUT1": "IN0"}, {"OUTPUT0": "OUT"})),
        "ensemble input 'IN1' for ensemble e' is not used",
    ),
    "output unmapped": (config(step(PAIR, {"OUTPUT0": "other"})), "ensemble output 'OUT' for ensemble e' is not used"),
    "cycle": (
        config(
            step({"INPUT0": "IN0", "INPUT1": "b"}, {"OUTPUT0": "a", "OUTPUT1": "OUT"}),
            step({"INPUT0": "a", "INPUT1": "IN1"}, {"OUTPUT0": "b"}),
        ),
        "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'a', is not connected",
    ),
    "tensor unused": (
        config(step(PAIR, {"OUTPUT0": "OUT", "OUTPUT1": "spare"})),
        "ensemble tensor 'spare' is unused in ensemble 'e'",
    ),
    "instance group": (
        config(step(PAIR, {"OUTPUT0": "OUT"}), extra="instance_group [ { kind: KIND_CPU } ]"),
        "instance group should not be specified for ensemble 'e'",
    ),
    "backend": (
        config(step(PAIR, {"OUTPUT0": "OUT"}), extra='backend: "onnxruntime"'),
        "Ensemble model 'e' must have platform type 'ensemble' and empty backend type",
    ),
    "no scheduling": (
        text_format.Parse(HEAD, mc.ModelConfig()),
        "ensemble scheduling must be set for ensemble e whose platform is ensemble",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_problem_gives_tritons_text(case: str) -> None:
    bad, text = CASES[case]
    with pytest.raises(TurnoutError) as caught:
        validate_ensemble(bad)
    assert (caught.value.status, caught.value.message) == (Status.INVALID_ARG, text)


def test_a_chain_and_a_fork_pass() -> None:
    validate_ensemble(
        config(step(PAIR, {"OUTPUT0": "s", "OUTPUT1": "d"}), step({"INPUT0": "s", "INPUT1": "d"}, {"OUTPUT0": "OUT"}))
    )
    head = HEAD.replace(
        'output [ { name: "OUT"', 'output [ { name: "B" data_type: TYPE_INT32 dims: [16] }, { name: "OUT"'
    )
    validate_ensemble(config(step(PAIR, {"OUTPUT0": "OUT"}), step(PAIR, {"OUTPUT0": "B"}), head=head))
