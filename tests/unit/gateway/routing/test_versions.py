"""Version choice (`gateway.routing.versions`), in process: what `parse_policy` and
`parse_policies` accept and reject (with PolicyError's texts), seeded weighted draws,
sticky keys by weighted rendezvous hashing and how they move when weights change, and
the shadow fraction."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest

from gateway.routing.versions import (
    Decision,
    ModelPolicy,
    PolicyError,
    Reason,
    Shadow,
    VersionChooser,
    arm_target,
    parse_policies,
    parse_policy,
    sticky_score,
)

DRAWS = 10_000
KEYS = [f"user-{n}" for n in range(8_000)]


def policy(weights: Mapping[str, float], **extra: object) -> ModelPolicy:
    return parse_policy("m", {"weights": dict(weights), **extra})


def sticky(weights: Mapping[str, float]) -> ModelPolicy:
    return policy(weights, sticky_header="x-user")


def versions_of_keys(chooser: VersionChooser, model_policy: ModelPolicy) -> list[str]:
    return [chooser.choose(model_policy, "", {"x-user": key}, None).version for key in KEYS]


def shares(choices: list[str]) -> dict[str, float]:
    return {version: count / len(choices) for version, count in Counter(choices).items()}


# --- parsing -------------------------------------------------------------------------


def test_a_policy_parses_with_versions_normalised_and_sorted_by_number() -> None:
    parsed = parse_policy("m", {"weights": {"10": 1, 9: 2, "02": 3.5}, "sticky_header": "X-User"})
    assert parsed == ModelPolicy((("2", 3.5), ("9", 2.0), ("10", 1.0)), "x-user", None)


def test_a_policy_may_leave_out_the_sticky_header_and_the_shadow() -> None:
    assert parse_policy("m", {"weights": {"1": 1}}) == ModelPolicy((("1", 1.0),))
    assert parse_policy("m", {"weights": {"1": 1}, "sticky_header": None}).sticky_header == ""


def test_a_shadow_takes_every_request_unless_it_gives_a_fraction() -> None:
    assert policy({"1": 1}, shadow={"version": 2}).shadow == Shadow("2", 1.0)
    assert policy({"1": 1}, shadow={"version": "3", "fraction": 0}).shadow == Shadow("3", 0.0)
    assert policy({"1": 1}, shadow={"version": "3", "fraction": 0.25}).shadow == Shadow("3", 0.25)


def test_a_zero_weight_is_accepted_beside_a_positive_one() -> None:
    assert policy({"1": 0, "2": 1}).weights == (("1", 0.0), ("2", 1.0))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "policy for model 'm' must be a mapping"),
        ({"weights": {"1": 1}, "extra": 1, "other": 2}, "policy for model 'm' has unknown keys ['extra', 'other']"),
        ({}, "policy for model 'm' needs a non-empty 'weights' mapping"),
        ({"weights": {}}, "policy for model 'm' needs a non-empty 'weights' mapping"),
        ({"weights": [1, 2]}, "policy for model 'm' needs a non-empty 'weights' mapping"),
        ({"weights": {"1": -1}}, "weight of version '1' of model 'm' must be a number >= 0"),
        ({"weights": {"1": True}}, "weight of version '1' of model 'm' must be a number >= 0"),
        ({"weights": {"1": "90"}}, "weight of version '1' of model 'm' must be a number >= 0"),
        ({"weights": {"1": float("inf")}}, "weight of version '1' of model 'm' must be a number >= 0"),
        ({"weights": {"1": float("nan")}}, "weight of version '1' of model 'm' must be a number >= 0"),
        ({"weights": {"m": 1}}, "arm 'm' of model 'm' names the model itself; name one of its versions"),
        ({"weights": {"a b:1": 1}}, "arm 'a b:1' of model 'm' does not name a model"),
        ({"weights": {"x/y": 1}}, "arm 'x/y' of model 'm' does not name a model"),
        ({"weights": {"other:0": 1}}, "version '0' is not a positive integer"),
        ({"weights": {"m:2": 1, "2": 1}}, "arm '2' of model 'm' is weighted twice"),
        ({"weights": {"0": 1}}, "version '0' is not a positive integer"),
        ({"weights": {"-1": 1}}, "version '-1' is not a positive integer"),
        ({"weights": {"1": 0, "2": 0}}, "weights of model 'm' must not all be zero"),
        ({"weights": {"1": 1}, "sticky_header": 5}, "sticky_header of model 'm' must be a string"),
        ({"weights": {"1": 1}, "shadow": "2"}, "shadow of model 'm' must be a mapping with a 'version'"),
        ({"weights": {"1": 1}, "shadow": {"fraction": 0.5}}, "shadow of model 'm' must be a mapping with a 'version'"),
        ({"weights": {"1": 1}, "shadow": {"version": "0"}}, "version '0' is not a positive integer"),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "rtol": -1}},
            "shadow rtol of model 'm' must be a finite number >= 0",
        ),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "atol": float("nan")}},
            "shadow atol of model 'm' must be a finite number >= 0",
        ),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "outputs": {"OUT": {"rtol": "x"}}}},
            "shadow rtol of output 'OUT' of model 'm' must be a finite number >= 0",
        ),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "outputs": {"OUT": {"tol": 1}}}},
            "shadow output 'OUT' of model 'm' takes only 'rtol' and 'atol'",
        ),
        ({"weights": {"1": 1}, "shadow": {"version": "2", "rtl": 1}}, "shadow of model 'm' has unknown keys ['rtl']"),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.5}},
            "shadow fraction of model 'm' must be between 0 and 1",
        ),
        (
            {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": True}},
            "shadow fraction of model 'm' must be between 0 and 1",
        ),
    ],
)
def test_an_invalid_policy_is_rejected_saying_why(raw: object, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy("m", raw)
    assert str(info.value) == message


def test_a_routing_document_maps_model_names_to_policies() -> None:
    document = {"models": {"simple": {"weights": {"1": 90, "2": 10}}, "other": {"weights": {"3": 1}}}}
    assert parse_policies(document) == {
        "simple": ModelPolicy((("1", 90.0), ("2", 10.0))),
        "other": ModelPolicy((("3", 1.0),)),
    }


def test_an_empty_routing_document_has_no_policies() -> None:
    assert parse_policies(None) == {}
    assert parse_policies({}) == {}


@pytest.mark.parametrize("document", [["models"], "models", {"models": ["simple"]}])
def test_a_routing_document_of_the_wrong_shape_is_rejected(document: object) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policies(document)
    assert str(info.value) == "a routing document must be a mapping with a 'models' mapping"


def test_one_invalid_policy_rejects_the_document_naming_its_model() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policies({"models": {"good": {"weights": {"1": 1}}, "bad": {"weights": {}}}})
    assert str(info.value) == "policy for model 'bad' needs a non-empty 'weights' mapping"


# --- weighted draws ------------------------------------------------------------------


def test_weighted_draws_follow_the_weights(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    choices = [chooser.choose(policy({"1": 70, "2": 20, "3": 10}), "", {}, None) for _ in range(DRAWS)]
    assert {d.reason for d in choices} == {Reason.WEIGHTED}
    observed = shares([d.version for d in choices])
    for version, expected in {"1": 0.7, "2": 0.2, "3": 0.1}.items():
        assert abs(observed[version] - expected) < 0.015


def test_a_zero_weight_version_is_never_drawn(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = policy({"1": 0, "2": 1, "3": 0})
    assert {chooser.choose(model_policy, "", {}, None).version for _ in range(DRAWS)} == {"2"}


def test_weighted_draws_replay_with_the_same_seed() -> None:
    model_policy = policy({"1": 50, "2": 30, "3": 20})
    first, second = VersionChooser(random.Random(3)), VersionChooser(random.Random(3))
    assert [first.choose(model_policy, "", {}, None) for _ in range(200)] == [
        second.choose(model_policy, "", {}, None) for _ in range(200)
    ]


def test_the_weight_of_a_version_not_ready_goes_to_the_others_in_proportion(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = policy({"1": 50, "2": 25, "3": 25})
    choices = [chooser.choose(model_policy, "", {}, frozenset({"1", "2"})) for _ in range(DRAWS)]
    assert {d.skipped for d in choices} == {("3",)}
    observed = shares([d.version for d in choices])
    assert set(observed) == {"1", "2"}
    assert abs(observed["1"] - 2 / 3) < 0.015


def test_no_ready_version_leaves_the_choice_to_the_sidecar(rng: random.Random) -> None:
    decision = VersionChooser(rng).choose(policy({"1": 50, "2": 50, "3": 0}), "", {}, frozenset({"3"}))
    assert decision == Decision("", Reason.DEFAULT, skipped=("1", "2"))


def test_a_requested_version_wins_over_the_policy(rng: random.Random) -> None:
    decision = VersionChooser(rng).choose(policy({"1": 1}), "7", {"x-user": "u"}, frozenset({"1"}))
    assert (decision.version, decision.reason) == ("7", Reason.EXPLICIT)


def test_without_a_policy_the_request_decides(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    assert chooser.choose(None, "4", {}, None) == Decision("4", Reason.EXPLICIT)
    assert chooser.choose(None, "", {}, None) == Decision("", Reason.DEFAULT)


# --- sticky keys ---------------------------------------------------------------------


def test_a_sticky_key_always_gets_the_same_version_whatever_the_seed() -> None:
    model_policy = sticky({"1": 50, "2": 30, "3": 20})
    first = versions_of_keys(VersionChooser(random.Random(1)), model_policy)
    again = versions_of_keys(VersionChooser(random.Random(2)), model_policy)
    assert first == again
    assert len(set(first)) == 3


def test_a_sticky_choice_says_so_and_keeps_its_key(rng: random.Random) -> None:
    decision = VersionChooser(rng).choose(sticky({"1": 1, "2": 1}), "", {"x-user": "user-7"}, None)
    assert (decision.reason, decision.sticky_key) == (Reason.STICKY, "user-7")


def test_a_request_without_the_sticky_header_is_drawn_by_weight(rng: random.Random) -> None:
    decision = VersionChooser(rng).choose(sticky({"1": 1, "2": 1}), "", {"x-other": "user-7"}, None)
    assert (decision.reason, decision.sticky_key) == (Reason.WEIGHTED, "")


def test_sticky_keys_spread_over_versions_by_weight(rng: random.Random) -> None:
    observed = shares(versions_of_keys(VersionChooser(rng), sticky({"1": 70, "2": 20, "3": 10})))
    for version, expected in {"1": 0.7, "2": 0.2, "3": 0.1}.items():
        assert abs(observed[version] - expected) < 0.02


def test_a_sticky_score_is_the_same_on_every_gateway() -> None:
    # A fixed value: a gateway with another hash would send a user to another version
    # than its peers during a rolling upgrade.
    assert sticky_score("user-1", "1", 1.0) == pytest.approx(1.584885722175959, rel=1e-12)
    assert sticky_score("user-1", "1", 3.0) == pytest.approx(3 * sticky_score("user-1", "1", 1.0), rel=1e-12)


def test_moving_weight_to_version_2_moves_only_keys_from_1_to_2(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    before = versions_of_keys(chooser, sticky({"1": 90, "2": 10}))
    after = versions_of_keys(chooser, sticky({"1": 80, "2": 20}))
    moved = Counter((a, b) for a, b in zip(before, after, strict=True) if a != b)
    assert set(moved) == {("1", "2")}
    # Version 2 grows from 10% to 20% of the keys: 10% of them move (sd 0.3%).
    assert abs(moved["1", "2"] / len(KEYS) - 0.10) < 0.015


def test_moving_weight_back_to_version_1_moves_only_keys_from_2_to_1(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    before = versions_of_keys(chooser, sticky({"1": 80, "2": 20}))
    after = versions_of_keys(chooser, sticky({"1": 90, "2": 10}))
    moved = Counter((a, b) for a, b in zip(before, after, strict=True) if a != b)
    assert set(moved) == {("2", "1")}
    assert abs(moved["2", "1"] / len(KEYS) - 0.10) < 0.015


def test_a_new_version_takes_keys_only_into_itself_from_every_other_in_proportion(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    before = versions_of_keys(chooser, sticky({"1": 80, "2": 20}))
    after = versions_of_keys(chooser, sticky({"1": 80, "2": 20, "3": 25}))
    moved = Counter((a, b) for a, b in zip(before, after, strict=True) if a != b)
    assert set(moved) == {("1", "3"), ("2", "3")}
    # Version 3 takes 25/125 = 20% of the keys, a fifth of each version's.
    assert abs(sum(moved.values()) / len(KEYS) - 0.20) < 0.015
    assert abs(moved["1", "3"] / before.count("1") - 0.20) < 0.02
    assert abs(moved["2", "3"] / before.count("2") - 0.20) < 0.04


def test_a_version_set_to_zero_gives_its_keys_away_and_the_rest_stay(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    before = versions_of_keys(chooser, sticky({"1": 60, "2": 20, "3": 20}))
    after = versions_of_keys(chooser, sticky({"1": 60, "2": 20, "3": 0}))
    moved = Counter((a, b) for a, b in zip(before, after, strict=True) if a != b)
    assert set(moved) == {("3", "1"), ("3", "2")}
    assert sum(moved.values()) == before.count("3")


def test_keys_of_a_version_not_ready_move_and_the_others_stay(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = sticky({"1": 50, "2": 50})
    before = versions_of_keys(chooser, model_policy)
    during = [chooser.choose(model_policy, "", {"x-user": key}, frozenset({"1"})).version for key in KEYS]
    assert set(during) == {"1"}
    assert versions_of_keys(chooser, model_policy) == before


# --- shadows -------------------------------------------------------------------------


def test_a_shadow_mirrors_about_its_fraction_of_requests(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = policy({"1": 1}, shadow={"version": "2", "fraction": 0.25})
    mirrored = [chooser.choose(model_policy, "", {}, None).shadow for _ in range(DRAWS)]
    assert set(mirrored) == {"", "2"}
    assert abs(mirrored.count("2") / DRAWS - 0.25) < 0.015


def test_a_shadow_with_fraction_zero_mirrors_nothing(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = policy({"1": 1}, shadow={"version": "2", "fraction": 0})
    assert {chooser.choose(model_policy, "", {}, None).shadow for _ in range(1000)} == {""}


def test_a_request_is_never_shadowed_to_the_version_that_serves_it(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    model_policy = policy({"1": 50, "2": 50}, shadow={"version": "2"})
    decisions = [chooser.choose(model_policy, "", {}, None) for _ in range(1000)]
    assert {(d.version, d.shadow) for d in decisions} == {("1", "2"), ("2", "")}
    assert chooser.choose(model_policy, "2", {}, None).shadow == ""
    assert chooser.choose(model_policy, "1", {}, None).shadow == "2"


# --- arms of other models (experiments) -----------------------------------------------


def test_arms_of_other_models_keep_their_order_and_spelling() -> None:
    parsed = policy({"resnet_onnx:03": 90, " resnet_trt ": 10, "m:2": 0})
    assert parsed.weights == (("resnet_onnx:3", 90.0), ("resnet_trt", 10.0), ("2", 0.0))
    assert parsed.routes_elsewhere and not policy({"1": 1, "m:2": 1}).routes_elsewhere
    assert arm_target("resnet_onnx:3") == ("resnet_onnx", "3")
    assert arm_target("resnet_trt") == ("resnet_trt", "")
    assert arm_target("7") == ("", "7")
    assert arm_target("odd:name") == ("odd:name", "")
    assert policy({"1": 1}, shadow={"version": "other:4"}).arms() == ("1", "other:4")


def test_a_decision_for_an_arm_of_another_model_names_that_model(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    experiment = policy({"a:3": 50, "b": 50}, shadow={"version": "c:1"})
    decisions = {chooser.choose(experiment, "", {}, None) for _ in range(200)}
    assert {(d.model, d.version, d.arm, d.shadow) for d in decisions} == {
        ("a", "3", "a:3", "c:1"),
        ("b", "", "b", "c:1"),
    }
    explicit = chooser.choose(experiment, "b", {}, None)
    assert (explicit.model, explicit.arm, explicit.reason) == ("b", "b", Reason.EXPLICIT)
    # A version that is no arm stays the called model's; a client may not reach other models so.
    assert chooser.choose(experiment, "z:1", {}, None) == Decision("z:1", Reason.EXPLICIT, shadow="c:1")


def test_arms_without_a_ready_replica_are_skipped_and_the_first_answers_when_none_is(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    experiment = policy({"a:3": 50, "b": 50})
    assert {chooser.choose(experiment, "", {}, frozenset({"b"})).arm for _ in range(50)} == {"b"}
    nothing = chooser.choose(experiment, "", {}, frozenset())
    assert (nothing.arm, nothing.reason, nothing.skipped) == ("a:3", Reason.DEFAULT, ("a:3", "b"))


def test_sticky_keys_choose_among_arms_of_other_models_alike(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    experiment = sticky({"a:1": 90, "b:1": 10})
    first = [chooser.choose(experiment, "", {"x-user": key}, None).arm for key in KEYS]
    assert first == [chooser.choose(experiment, "", {"x-user": key}, None).arm for key in KEYS]
    assert abs(first.count("b:1") / len(KEYS) - 0.1) < 0.02


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            {"a": {"weights": {"b:1": 1}}, "b": {"weights": {"c:1": 1}}},
            "arm 'b:1' of model 'a' names model 'b', which routes to other models (a chain); "
            "arms must name models that serve",
        ),
        (
            {"a": {"weights": {"1": 1, "b:1": 1}}, "b": {"weights": {"a:1": 1}}},
            "arm 'b:1' of model 'a' names model 'b', which routes to other models "
            "(a cycle: 'a' -> 'b' -> 'a'); arms must name models that serve",
        ),
        (
            {"a": {"weights": {"1": 1}, "shadow": {"version": "b"}}, "b": {"weights": {"c": 1}}},
            "arm 'b' of model 'a' names model 'b', which routes to other models (a chain); "
            "arms must name models that serve",
        ),
    ],
)
def test_arms_naming_another_experiment_are_rejected(models: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policies({"models": models})
    assert str(info.value) == message


def test_arms_naming_a_model_with_versions_only_are_accepted() -> None:
    parsed = parse_policies({"models": {"a": {"weights": {"b:1": 1}}, "b": {"weights": {"1": 1, "2": 1}}}})
    assert parsed["a"].weights == (("b:1", 1.0),)
