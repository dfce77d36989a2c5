"""The gateway's checks of an ensemble's step maps against its step models' configs
(Triton's ValidateEnsembleConfig texts), and the plan it runs."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from gateway.ensemble_plan import build_plan
from protos import model_config_pb2 as mc
from protos.ensemble_steps import check_step_configs
from protos.status import Status, TurnoutError

SIMPLE = text_format.Parse(
    """name: "simple" max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [16] },
            { name: "INPUT1" data_type: TYPE_INT32 dims: [16] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [16] },
             { name: "OUTPUT1" data_type: TYPE_INT32 dims: [16] } ]""",
    mc.ModelConfig(),
)


def ensemble(
    inputs: str = "INPUT0", input_type: str = "TYPE_INT32", dims: str = "16", max_batch: int = 8
) -> mc.ModelConfig:
    return text_format.Parse(
        f"""name: "e" platform: "ensemble" max_batch_size: {max_batch}
        input [ {{ name: "A" data_type: {input_type} dims: [{dims}] }},
                {{ name: "B" data_type: TYPE_INT32 dims: [16] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [16] }} ]
        ensemble_scheduling {{ step [ {{ model_name: "simple" model_version: 2
          input_map {{ key: "{inputs}" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
          output_map {{ key: "OUTPUT0" value: "OUT" }} }} ] }}""",
        mc.ModelConfig(),
    )


CASES = {
    "unknown input": (
        ensemble(inputs="NOPE"),
        "in ensemble e, ensemble tensor A is mapping to non-existing input NOPE in model simple",
    ),
    "data type": (
        ensemble(input_type="TYPE_FP32"),
        "in ensemble e, ensemble tensor A: inconsistent data type: TYPE_FP32 is inferred from model e "
        "while TYPE_INT32 is inferred from model simple",
    ),
    "shape": (
        ensemble(dims="8"),
        "in ensemble e, ensemble tensor A: inconsistent shape: [-1,8] is inferred from model e "
        "while [-1,16] is inferred from model simple",
    ),
    "batch size": (
        ensemble(max_batch=16),
        "ensemble e allows maximum batch size 16, but it contains model simple which only allows maximum batch "
        "size to be 8",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_maps_that_contradict_the_step_model_give_tritons_text(case: str) -> None:
    config, text = CASES[case]
    with pytest.raises(TurnoutError) as caught:
        check_step_configs(config, [SIMPLE])
    assert (caught.value.status, caught.value.message) == (Status.INVALID_ARG, text)


def test_a_variable_dimension_matches_any_and_the_plan_keeps_the_pinned_version() -> None:
    config = ensemble(dims="-1")
    check_step_configs(config, [SIMPLE])
    plan = build_plan(config, "1")
    assert plan.outputs == ("OUT",)
    assert [(s.model, s.version, s.inputs, s.outputs) for s in plan.steps] == [
        ("simple", "2", (("INPUT0", "A"), ("INPUT1", "B")), (("OUTPUT0", "OUT"),))
    ]
    assert plan.signature.inputs["A"].datatype.name == "INT32"


def _model(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


STREAMING = _model('name: "tokens" model_transaction_policy { decoupled: true }')
PLAIN = _model('name: "plain"')


def _flow(*steps: tuple[str, dict[str, str], dict[str, str]]) -> mc.ModelConfig:
    config = _model('name: "flow" platform: "ensemble" input { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }')
    for model, inputs, outputs in steps:
        step = config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        step.input_map.update(inputs)
        step.output_map.update(outputs)
    return config


def test_a_decoupled_step_makes_the_ensemble_decoupled_and_takes_the_steps_after_it() -> None:
    config = _flow(
        ("plain", {"X": "IN"}, {"Y": "pre"}),
        ("tokens", {"X": "pre"}, {"Y": "token"}),
        ("plain", {"X": "token"}, {"Y": "post"}),
        ("plain", {"X": "post"}, {"Y": "OUT"}),
    )
    plan = build_plan(config, "1", [PLAIN, STREAMING, PLAIN, PLAIN])
    assert plan.decoupled and plan.decoupled_steps == {1}
    assert plan.after == {1: frozenset({2, 3})}
    assert not build_plan(config, "1", [PLAIN] * 4).decoupled


def test_a_step_fed_from_two_response_streams_is_refused_in_tritons_words() -> None:
    # Checked on Triton 2.51: the text names the model that declared the step's output first.
    config = _flow(
        ("tokens", {"X": "IN"}, {"Y": "token"}),
        ("plain", {"A": "IN", "B": "token"}, {"Y": "joined"}),
    )
    with pytest.raises(TurnoutError) as caught:
        build_plan(config, "1", [STREAMING, PLAIN])
    assert caught.value.message == (
        "in ensemble flow, step of model 'plain' receives inputs originated from different decoupled models"
    )
