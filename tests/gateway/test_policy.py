"""Routing policies: what parses, what is rejected and why, and how sticky keys move
when weights change (weighted rendezvous hashing)."""

from __future__ import annotations

import random

import pytest

from gateway.routing.dispatch import with_version
from gateway.routing.versions import PolicyError, Reason, VersionChooser, parse_policies, parse_policy
from protos import grpc_service_pb2 as pb


def test_a_policy_parses_with_versions_normalised() -> None:
    policy = parse_policy("m", {"weights": {"02": 10, 1: 90}, "sticky_header": "X-User", "shadow": {"version": 3}})
    assert policy.weights == (("1", 90.0), ("2", 10.0))
    assert policy.sticky_header == "x-user"
    assert policy.shadow is not None and policy.shadow.version == "3" and policy.shadow.fraction == 1.0
    assert parse_policies({"models": {"m": {"weights": {"1": 1}}}})["m"].weights == (("1", 1.0),)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([], "must be a mapping"),
        ({"weights": {}}, "non-empty 'weights'"),
        ({"weights": {"1": -1}}, "must be a number >= 0"),
        ({"weights": {"1": True}}, "must be a number >= 0"),
        ({"weights": {"0": 1}}, "is not a positive integer"),
        ({"weights": {"m": 1}}, "names the model itself"),
        ({"weights": {"1": 0}}, "must not all be zero"),
        ({"weights": {"1": 1}, "sticky_header": 5}, "sticky_header"),
        ({"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 2}}, "between 0 and 1"),
        ({"weights": {"1": 1}, "extra": 1}, "unknown keys"),
    ],
)
def test_invalid_policies_say_why(raw: object, reason: str) -> None:
    with pytest.raises(PolicyError, match=reason):
        parse_policy("m", raw)


def test_sticky_keys_move_only_towards_the_version_that_grew(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    before = parse_policy("m", {"weights": {"1": 90, "2": 10}, "sticky_header": "x-user"})
    after = parse_policy("m", {"weights": {"1": 70, "2": 30}, "sticky_header": "x-user"})
    keys = [{"x-user": f"k{i}"} for i in range(5000)]
    first = [chooser.choose(before, "", k, None).version for k in keys]
    second = [chooser.choose(after, "", k, None).version for k in keys]
    moved = [(a, b) for a, b in zip(first, second, strict=True) if a != b]
    assert all(pair == ("1", "2") for pair in moved)
    # About 20% of the keys must move (from 10% to 30% on version 2); 5 sigma ~ 2.8%.
    assert abs(len(moved) / len(keys) - 0.2) < 0.03
    assert all(chooser.choose(before, "", k, None).reason is Reason.STICKY for k in keys[:10])


def test_unready_versions_are_skipped_and_explicit_versions_win(rng: random.Random) -> None:
    chooser = VersionChooser(rng)
    policy = parse_policy("m", {"weights": {"1": 50, "2": 50}})
    decision = chooser.choose(policy, "", {}, frozenset({"2"}))
    assert decision.version == "2" and decision.skipped == ("1",)
    assert chooser.choose(policy, "", {}, frozenset()).reason is Reason.DEFAULT
    explicit = chooser.choose(policy, "1", {}, frozenset({"2"}))
    assert explicit.version == "1" and explicit.reason is Reason.EXPLICIT


def test_a_seeded_chooser_replays_its_draws() -> None:
    policy = parse_policy("m", {"weights": {"1": 1, "2": 1, "3": 1}})
    chooser_a, chooser_b = VersionChooser(random.Random(9)), VersionChooser(random.Random(9))
    assert [chooser_a.choose(policy, "", {}, None).version for _ in range(50)] == [
        chooser_b.choose(policy, "", {}, None).version for _ in range(50)
    ]


@pytest.mark.parametrize("version", ["", "2", "1" * 200])
def test_an_appended_version_wins_without_re_encoding(version: str) -> None:
    request = pb.ModelInferRequest(model_name="linear", model_version="1", id="x")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    encoded = request.SerializeToString()
    changed = pb.ModelInferRequest.FromString(with_version(encoded, version))
    assert changed.model_version == version
    assert changed.model_name == "linear" and changed.id == "x" and len(changed.inputs) == 1
