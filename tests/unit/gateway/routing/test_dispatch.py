"""One inference's path (`gateway.routing.dispatch.Dispatcher`), in process: failover
from a replica that cannot be reached to the next (each tried at most once, stopped by
the deadline), version choice joined to replica choice through the registry, sequence
pins (START pins, END unpins, no failover while pinned) and shadow sends; deadlines and
pin lifetimes on a fake clock."""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import pytest
from google.protobuf.message import Message

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.routing.dispatch import DEFAULT_BUDGET_SECS, Dispatcher, relabelled, with_model, with_version
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.replicas import Balancer
from gateway.routing.sequences import DEFAULT_IDLE_SECS, PIN_GRACE_SECS, in_rendezvous_order, placement_key
from gateway.routing.versions import Reason, parse_policy
from gateway.upstream import SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import Cause, Status, TurnoutError, invalid_arg
from tests.unit.fake_clock import FakeClock
from tests.unit.gateway.routing.replica_stand_in import (
    SequenceHoldingReplica,
    StandInReplica,
    let_background_tasks_run,
)

MODEL = "simple"
PAYLOAD = pb.ModelInferRequest(model_name=MODEL, id="r1").SerializeToString()


class StandInFleet:
    """The part of `gateway.registry.ModelRegistry` that `Dispatcher` uses, over a fixed
    table of which replica has which versions of which model READY. `replicas` follows
    `gateway.discovery`'s rule: the replicas with the version READY, else every replica
    serving the model. `find` reveals the models in `appears_on_find`, as a registry that
    learns of a newly loaded model on a refresh."""

    def __init__(self, table: Mapping[StandInReplica, Mapping[str, Iterable[str]]]) -> None:
        self._table = {replica: {m: frozenset(v) for m, v in models.items()} for replica, models in table.items()}
        self.appears_on_find: dict[StandInReplica, dict[str, frozenset[str]]] = {}
        self.finds: list[str] = []

    def replicas(self, model: str, version: str) -> Sequence[StandInReplica]:
        serving = [r for r, models in self._table.items() if model in models]
        ready_here = [r for r in serving if version in self._table[r][model]]
        return ready_here if version and ready_here else serving

    def ready_versions(self, model: str) -> frozenset[str] | None:
        versions = [v for models in self._table.values() for v in models.get(model, ())]
        return frozenset(versions) if versions else None

    async def find(self, model: str) -> StandInReplica | None:
        self.finds.append(model)
        for replica, models in self.appears_on_find.items():
            self._table.setdefault(replica, {}).update(models)
        self.appears_on_find = {}
        serving = self.replicas(model, "")
        return serving[0] if serving else None

    def remove(self, replica: StandInReplica) -> None:
        del self._table[replica]


def make_dispatcher(
    fleet: StandInFleet,
    balancer: Balancer,
    metrics: GatewayMetrics,
    policies: Mapping[str, object] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Dispatcher:
    store = PolicyStore({model: parse_policy(model, raw) for model, raw in (policies or {}).items()})
    return Dispatcher(fleet, store, balancer, metrics, random.Random(1), clock=clock)


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def failovers(metrics: GatewayMetrics, outcome: str) -> float | None:
    return sample(metrics, "turnout_gateway_failovers_total", model=MODEL, outcome=outcome)


def busy(balancer: Balancer, stack: contextlib.ExitStack, replica: StandInReplica, requests: int) -> None:
    """Hold `requests` requests in flight on `replica` until `stack` closes, so that the
    balancer's choice among replicas of different loads is known in advance."""
    for _ in range(requests):
        stack.enter_context(balancer.track(replica))


def in_sequence(sequence_id: int, *, start: bool = False, end: bool = False) -> RequestContext:
    return RequestContext(sequence=SequenceFlags(sequence_id, start, end))


# --- failover ------------------------------------------------------------------------


async def test_a_request_is_answered_by_a_replica_of_its_model(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a = StandInReplica("a")
    other = StandInReplica("other")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, other: {"other": {"1"}}}), balancer, metrics)
    assert await dispatcher.send(MODEL, "", PAYLOAD, RequestContext()) == b"a"
    assert a.received == [PAYLOAD]
    assert other.received == []


async def test_an_unreachable_replica_is_ejected_and_the_next_one_answers(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    down = StandInReplica("down", reachable=False)
    up = StandInReplica("up")
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)  # so `down` is tried first
        assert await dispatcher.send(MODEL, "", PAYLOAD, RequestContext()) == b"up"
    assert down.received == [PAYLOAD] and up.received == [PAYLOAD]
    assert balancer.ejected_count() == 1
    assert failovers(metrics, "retried") == 1
    assert failovers(metrics, "exhausted") is None
    assert sample(metrics, "turnout_gateway_replica_ejections_total", framework="onnxruntime") == 1


async def test_later_requests_pass_over_the_replica_that_failover_ejected(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    down = StandInReplica("down", reachable=False)
    up = StandInReplica("up")
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)
        await dispatcher.send(MODEL, "", PAYLOAD, RequestContext())
    for _ in range(20):
        assert await dispatcher.send(MODEL, "", PAYLOAD, RequestContext()) == b"up"
    assert len(down.received) == 1


async def test_each_replica_is_tried_at_most_once_and_the_last_failure_is_raised(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    journal: list[str] = []
    first, second, third = (StandInReplica(name, reachable=False, journal=journal) for name in ("1st", "2nd", "3rd"))
    fleet = StandInFleet({replica: {MODEL: {"1"}} for replica in (third, second, first)})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, second, 1)
        busy(balancer, stack, third, 2)
        with pytest.raises(SidecarUnreachable) as info:
            await dispatcher.send(MODEL, "", PAYLOAD, RequestContext())
    assert journal == ["1st", "2nd", "3rd"]
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == third.unreachable_message
    assert balancer.ejected_count() == 3
    assert failovers(metrics, "retried") == 2
    assert failovers(metrics, "exhausted") == 1


async def test_failover_tries_every_replica_in_some_order_when_loads_are_equal(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    journal: list[str] = []
    pool = [StandInReplica(str(n), reachable=False, journal=journal) for n in range(5)]
    dispatcher = make_dispatcher(StandInFleet({replica: {MODEL: {"1"}} for replica in pool}), balancer, metrics)
    with pytest.raises(SidecarUnreachable):
        await dispatcher.send(MODEL, "", PAYLOAD, RequestContext())
    assert sorted(journal) == ["0", "1", "2", "3", "4"]


async def test_a_passed_deadline_stops_failover_after_the_first_try(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    journal: list[str] = []
    pool = [StandInReplica(name, reachable=False, journal=journal) for name in ("a", "b", "c")]
    dispatcher = make_dispatcher(StandInFleet({replica: {MODEL: {"1"}} for replica in pool}), balancer, metrics)
    passed = RequestContext(deadline=time.monotonic() - 1.0)
    with pytest.raises(SidecarUnreachable):
        await dispatcher.send(MODEL, "", PAYLOAD, passed)
    assert len(journal) == 1
    assert failovers(metrics, "exhausted") == 1
    assert failovers(metrics, "retried") is None


async def test_a_deadline_ahead_leaves_room_to_fail_over(balancer: Balancer, metrics: GatewayMetrics) -> None:
    down = StandInReplica("down", reachable=False)
    up = StandInReplica("up")
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}}), balancer, metrics)
    ahead = RequestContext(deadline=time.monotonic() + 3600.0)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)
        assert await dispatcher.send(MODEL, "", PAYLOAD, ahead) == b"up"


async def test_an_error_from_a_replica_that_was_reached_is_not_failed_over(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    refusing = StandInReplica("refusing")
    refusing.error = invalid_arg("unexpected inference input 'INPUT9' for model 'simple'")
    other = StandInReplica("other")
    dispatcher = make_dispatcher(StandInFleet({refusing: {MODEL: {"1"}}, other: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, other, 1)
        with pytest.raises(TurnoutError) as info:
            await dispatcher.send(MODEL, "", PAYLOAD, RequestContext())
    assert info.value is refusing.error
    assert other.received == []
    assert balancer.ejected_count() == 0


async def test_an_unknown_model_is_looked_up_once_more_then_not_found(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    with pytest.raises(TurnoutError) as info:
        await dispatcher.send("nope", "", PAYLOAD, RequestContext())
    assert info.value.status is Status.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'nope' is not found"
    assert fleet.finds == ["nope"]


async def test_a_model_the_registry_learns_of_on_a_lookup_is_served(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    newcomer = StandInReplica("newcomer")
    fleet = StandInFleet({})
    fleet.appears_on_find = {newcomer: {MODEL: frozenset({"1"})}}
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    assert await dispatcher.send(MODEL, "", PAYLOAD, RequestContext()) == b"newcomer"
    assert fleet.finds == [MODEL]


# --- versions joined to replicas -----------------------------------------------------


async def test_a_request_for_a_version_goes_only_to_replicas_with_that_version_ready(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    only_one, both, only_two = StandInReplica("only_one"), StandInReplica("both"), StandInReplica("only_two")
    fleet = StandInFleet({only_one: {MODEL: {"1"}}, both: {MODEL: {"1", "2"}}, only_two: {MODEL: {"2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    answers = Counter([await dispatcher.send(MODEL, "2", PAYLOAD, RequestContext()) for _ in range(100)])
    assert set(answers) == {b"both", b"only_two"}
    assert only_one.received == []


async def test_each_weighted_version_choice_is_served_by_a_replica_with_that_version_ready(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    only_one, both, only_two = StandInReplica("only_one"), StandInReplica("both"), StandInReplica("only_two")
    fleet = StandInFleet({only_one: {MODEL: {"1"}}, both: {MODEL: {"1", "2"}}, only_two: {MODEL: {"2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: {"weights": {"1": 50, "2": 50}}})
    for _ in range(200):
        version = dispatcher.decide(MODEL, "", RequestContext()).version
        await dispatcher.send(MODEL, version, with_version(PAYLOAD, version), RequestContext())

    def versions_received(replica: StandInReplica) -> set[str]:
        return {pb.ModelInferRequest.FromString(payload).model_version for payload in replica.received}

    assert versions_received(only_one) == {"1"}
    assert versions_received(only_two) == {"2"}
    assert versions_received(both) == {"1", "2"}


async def test_a_weighted_version_that_no_replica_has_ready_is_skipped(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: {"weights": {"1": 50, "3": 50}}})
    decisions = [dispatcher.decide(MODEL, "", RequestContext()) for _ in range(50)]
    assert {(d.version, d.reason, d.skipped) for d in decisions} == {("1", Reason.WEIGHTED, ("3",))}
    assert sample(metrics, "turnout_gateway_route_skipped_versions_total", model=MODEL, version="3") == 50


async def test_a_model_without_a_policy_is_left_to_the_sidecars_newest_version(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    dispatcher = make_dispatcher(StandInFleet({StandInReplica("a"): {MODEL: {"1", "2"}}}), balancer, metrics)
    decision = dispatcher.decide(MODEL, "", RequestContext())
    assert (decision.version, decision.reason) == ("", Reason.DEFAULT)


async def test_a_version_nobody_knows_is_counted_as_other(balancer: Balancer, metrics: GatewayMetrics) -> None:
    dispatcher = make_dispatcher(StandInFleet({StandInReplica("a"): {MODEL: {"1"}}}), balancer, metrics)
    dispatcher.decide(MODEL, "1", RequestContext())
    dispatcher.decide(MODEL, "98765", RequestContext())
    routes = "turnout_gateway_route_decisions_total"
    assert sample(metrics, routes, model=MODEL, version="1", reason="explicit") == 1
    assert sample(metrics, routes, model=MODEL, version="other", reason="explicit") == 1
    assert sample(metrics, routes, model=MODEL, version="98765", reason="explicit") is None


# --- sequences -----------------------------------------------------------------------


def ranked(sequence_id: int, *replicas: StandInReplica) -> list[StandInReplica]:
    """`replicas` in the rendezvous order of sequence `sequence_id` of MODEL."""
    key = placement_key(MODEL, SequenceFlags(sequence_id, False, False))
    return in_rendezvous_order(key, list(replicas))  # type: ignore[arg-type]


def sequence_payload(sequence_id: int, *, start: bool = False, end: bool = False) -> bytes:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.parameters["sequence_id"].int64_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    return request.SerializeToString()


async def infer(dispatcher: Dispatcher, sequence_id: int, *, start: bool = False, end: bool = False) -> bytes:
    """One request of a sequence as `gateway.core` sends it: the decision's version set in
    the payload, then `send`."""
    context = in_sequence(sequence_id, start=start, end=end)
    version = dispatcher.decide(MODEL, "", context).version
    payload = sequence_payload(sequence_id, start=start, end=end)
    return await dispatcher.send(MODEL, version, with_version(payload, version) if version else payload, context)


async def test_a_start_goes_to_the_first_replica_of_its_rendezvous_order_whatever_the_loads(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    firsts = set()
    for sequence_id in range(1, 21):
        first = ranked(sequence_id, a, b)[0]
        firsts.add(first)
        with contextlib.ExitStack() as stack:
            busy(balancer, stack, first, 5)
            assert (
                await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id, start=True)) == first.name.encode()
            )
            assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id)) == first.name.encode()
    assert firsts == {a, b}  # the order spreads sequences over replicas
    await let_background_tasks_run()


def test_the_rendezvous_order_moves_only_the_sequences_of_a_replica_that_left() -> None:
    replicas = [StandInReplica(name) for name in "abcd"]
    before = {i: ranked(i, *replicas)[0] for i in range(200)}
    after = {i: ranked(i, *replicas[:3])[0] for i in range(200)}
    moved = {i for i in before if before[i] is not after[i]}
    assert moved == {i for i in before if before[i] is replicas[3]} and moved
    assert ranked(7, *replicas) == ranked(7, *reversed(replicas))  # the order of discovery does not matter
    assert placement_key(MODEL, SequenceFlags(7, True, False)) != placement_key(MODEL, SequenceFlags("7", True, False))


async def test_another_gateway_finds_the_replica_and_version_of_a_start_it_never_saw(
    rng: random.Random, metrics: GatewayMetrics
) -> None:
    replicas = [SequenceHoldingReplica(name) for name in "abc"]
    fleet = StandInFleet({replica: {MODEL: {"1", "2"}} for replica in replicas})
    policy = {MODEL: {"weights": {"1": 50, "2": 50}}}
    gateways = [
        make_dispatcher(fleet, Balancer(random.Random(seed), metrics), metrics, policy) for seed in (1, 2)
    ]  # two gateways, differently seeded: only the sequence id decides
    for sequence_id in range(1, 41):
        assert await infer(gateways[0], sequence_id, start=True)
    holders = {
        sequence_id: [r for r in replicas for v, i in r.held if i == sequence_id] for sequence_id in range(1, 41)
    }
    versions = {v for r in replicas for v, _ in r.held}
    assert versions == {"1", "2"} and all(len(h) == 1 for h in holders.values())
    for replica in replicas:
        replica.received.clear()
    for sequence_id in range(1, 41):
        (holder,) = holders[sequence_id]
        assert await infer(gateways[1], sequence_id) == holder.name.encode()
        assert await infer(gateways[sequence_id % 2], sequence_id, end=True) == holder.name.encode()
    assert sum(len(r.received) for r in replicas) == 80  # each found at the first try
    assert not any(r.held for r in replicas)
    await let_background_tasks_run()


async def test_a_replica_that_joined_after_the_start_refuses_and_the_holder_answers(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b, newcomer = (SequenceHoldingReplica(name) for name in ("a", "b", "newcomer"))
    sequence_id = next(i for i in range(1, 100) if ranked(i, a, b, newcomer)[0] is newcomer)
    (holder,) = ranked(sequence_id, a, b)[:1]
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    assert await infer(make_dispatcher(fleet, balancer, metrics), sequence_id, start=True) == holder.name.encode()
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}, newcomer: {MODEL: {"1"}}})
    other_gateway = make_dispatcher(fleet, balancer, metrics)
    assert await infer(other_gateway, sequence_id) == holder.name.encode()
    assert len(newcomer.received) == 1  # it refused; the holder answered
    assert await infer(other_gateway, sequence_id) == holder.name.encode()
    assert len(newcomer.received) == 1  # the gateway pinned what it found
    await let_background_tasks_run()


async def test_a_sequence_no_replica_holds_gets_tritons_answer(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    with pytest.raises(TurnoutError) as info:
        await infer(dispatcher, 7)
    assert info.value.status is Status.INVALID_ARG
    assert info.value.message == (
        f"inference request for sequence 7 to model '{MODEL}' must specify the START flag on the first request of "
        "the sequence"
    )
    assert len(a.received) == len(b.received) == 1  # each asked once


async def test_a_sequence_whose_holder_cannot_be_reached_fails_clearly_on_a_gateway_without_its_pin(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    holder, survivor = ranked(7, a, b)
    await infer(make_dispatcher(fleet, balancer, metrics), 7, start=True)
    holder.go_down()
    with pytest.raises(TurnoutError) as info:
        await infer(make_dispatcher(fleet, balancer, metrics), 7)
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == (
        f"sequence 7 of model '{MODEL}' is held by no replica that could be reached ({holder.address} could not be);"
        " start the sequence again"
    )
    assert len(survivor.received) == 1
    # A new sequence starts on the survivor.
    new_id = next(i for i in range(8, 100) if ranked(i, a, b)[0] is holder)
    assert await infer(make_dispatcher(fleet, balancer, metrics), new_id, start=True) == survivor.name.encode()


async def test_a_stale_pin_is_dropped_and_the_order_followed(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    first, second = ranked(7, a, b)
    one, other = make_dispatcher(fleet, balancer, metrics), make_dispatcher(fleet, balancer, metrics)
    first.go_down()
    assert await infer(one, 7, start=True) == second.name.encode()  # `one` pins it to `second`
    first.come_back()
    await let_background_tasks_run()
    assert await infer(other, 7, end=True) == second.name.encode()
    assert await infer(other, 7, start=True) == first.name.encode()  # started again, elsewhere
    assert await infer(one, 7) == first.name.encode()  # the pin on `second` was refused, then dropped
    assert await infer(one, 7) == first.name.encode()
    await let_background_tasks_run()


async def test_a_pinned_sequence_its_replica_let_go_gets_tritons_answer_from_it(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a = SequenceHoldingReplica("a")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}}), balancer, metrics)
    await infer(dispatcher, 7, start=True)
    a.held.clear()  # as a sidecar releases a sequence idle for too long
    with pytest.raises(TurnoutError) as info:
        await infer(dispatcher, 7)
    assert info.value.status is Status.INVALID_ARG and info.value.cause is Cause.UNKNOWN_SEQUENCE
    assert len(a.received) == 2  # asked once, through its pin
    await let_background_tasks_run()


async def test_later_requests_of_a_sequence_keep_the_version_of_its_start(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a = SequenceHoldingReplica("a")
    fleet = StandInFleet({a: {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: {"weights": {"1": 50, "2": 50}}})
    context = in_sequence(7, start=True)
    await dispatcher.send(MODEL, "2", with_version(sequence_payload(7, start=True), "2"), context)
    decision = dispatcher.decide(MODEL, "", in_sequence(7))
    assert (decision.version, decision.reason) == ("", Reason.SEQUENCE)  # `send` finds it
    for _ in range(5):
        await dispatcher.send(MODEL, "", sequence_payload(7), in_sequence(7))
    assert {pb.ModelInferRequest.FromString(r).model_version for r in a.received} == {"2"}
    await let_background_tasks_run()
    assert [request.version for request in a.config_requests] == ["2"]


async def test_a_sequence_start_without_a_policy_is_routed_to_the_newest_ready_version(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"9", "10"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    decision = dispatcher.decide(MODEL, "", in_sequence(7, start=True))
    assert decision.version == "10"


async def test_a_weighted_sequence_start_is_chosen_by_its_id_alike_on_every_gateway(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"1", "2"}}})
    policy = {MODEL: {"weights": {"1": 30, "2": 70}}}
    one, other = make_dispatcher(fleet, balancer, metrics, policy), make_dispatcher(fleet, balancer, metrics, policy)
    other._chooser = type(other._chooser)(random.Random(99))
    chosen = [one.decide(MODEL, "", in_sequence(i, start=True)) for i in range(1, 401)]
    assert chosen == [other.decide(MODEL, "", in_sequence(i, start=True)) for i in range(1, 401)]
    share = sum(d.version == "2" for d in chosen) / len(chosen)
    assert 0.6 < share < 0.8 and {d.reason for d in chosen} == {Reason.WEIGHTED}
    # A sticky key, where the policy has one, decides as for any request of its user.
    sticky = {MODEL: {"weights": {"1": 30, "2": 70}, "sticky_header": "x-user"}}
    dispatcher = make_dispatcher(fleet, balancer, metrics, sticky)
    context = RequestContext(headers={"x-user": "ann"}, sequence=SequenceFlags(5, True, False))
    plain = dispatcher.decide(MODEL, "", RequestContext(headers={"x-user": "ann"}))
    assert dispatcher.decide(MODEL, "", context).version == plain.version


async def test_a_sequence_start_is_never_shadowed(balancer: Balancer, metrics: GatewayMetrics) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"1", "2"}}})
    policy = {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}}
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: policy})
    assert dispatcher.decide(MODEL, "", RequestContext()).shadow == "2"
    decision = dispatcher.decide(MODEL, "", in_sequence(7, start=True))
    assert (decision.version, decision.shadow) == ("1", "")


async def test_a_pinned_replica_that_cannot_be_reached_fails_the_request_without_moving_it(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    holder, other = ranked(7, a, b)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    await infer(dispatcher, 7, start=True)
    holder.go_down()
    with pytest.raises(TurnoutError) as info:
        await infer(dispatcher, 7)
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == (
        f"sequence 7 of model '{MODEL}' was started on replica {holder.address}, which could not be reached;"
        " start the sequence again"
    )
    assert isinstance(info.value.__cause__, SidecarUnreachable)
    assert len(other.received) == 1 and not other.held  # asked, in case it started again there; it refused
    assert balancer.ejected_count() == 1
    await let_background_tasks_run()


async def test_a_pinned_replica_that_left_the_fleet_fails_the_request(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    holder, other = ranked(7, a, b)
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    await infer(dispatcher, 7, start=True)
    fleet.remove(holder)
    with pytest.raises(TurnoutError) as info:
        await infer(dispatcher, 7)
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == (
        f"sequence 7 of model '{MODEL}' was started on replica {holder.address}, which no longer serves it;"
        " start the sequence again"
    )
    assert len(holder.received) == 1 and len(other.received) == 1
    await let_background_tasks_run()


async def test_a_sequence_started_again_through_another_gateway_after_its_replica_died_is_found(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    holder, survivor = ranked(7, a, b)
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    one, other = make_dispatcher(fleet, balancer, metrics), make_dispatcher(fleet, balancer, metrics)
    await infer(one, 7, start=True)  # `one` pins it to `holder`
    holder.go_down()
    assert await infer(other, 7, start=True) == survivor.name.encode()  # the client starts it again
    # `one`'s pin cannot be followed; the sequence's order finds it, and `one` pins it anew.
    assert await infer(one, 7) == survivor.name.encode()
    assert await infer(one, 7, end=True) == survivor.name.encode()
    await let_background_tasks_run()


async def test_end_goes_to_the_holder_and_a_late_request_then_gets_tritons_answer(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = SequenceHoldingReplica("a"), SequenceHoldingReplica("b")
    holder, _ = ranked(7, a, b)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    await infer(dispatcher, 7, start=True)
    assert await infer(dispatcher, 7, end=True) == holder.name.encode()
    with pytest.raises(TurnoutError) as info:
        await infer(dispatcher, 7)
    assert info.value.status is Status.INVALID_ARG and info.value.cause is Cause.UNKNOWN_SEQUENCE
    await let_background_tasks_run()


async def test_a_start_that_fails_over_pins_the_replica_that_answered(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    down, up = StandInReplica("down"), StandInReplica("up")
    sequence_id = next(i for i in range(1, 100) if ranked(i, down, up)[0] is down)
    down.go_down()
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}}), balancer, metrics)
    assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id, start=True)) == b"up"
    down.come_back()
    await let_background_tasks_run()
    assert balancer.ejected_count() == 0
    assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id)) == b"up"
    assert len(down.received) == 1


async def test_a_sequence_of_one_request_leaves_no_pin(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True, end=True))
    await let_background_tasks_run()
    assert a.config_requests == b.config_requests == []  # no pin, so no idle time to learn


# --- shadows -------------------------------------------------------------------------


async def test_a_shadow_goes_to_a_replica_of_its_version_with_the_version_set(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    old, candidate = StandInReplica("old"), StandInReplica("candidate")
    fleet = StandInFleet({old: {MODEL: {"1"}}, candidate: {MODEL: {"2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    assert await dispatcher.send_shadow(MODEL, "2", PAYLOAD) == b"candidate"
    (sent,) = candidate.received
    assert pb.ModelInferRequest.FromString(sent).model_version == "2"
    assert old.received == []


async def test_a_shadow_that_cannot_be_sent_neither_fails_over_nor_ejects(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    down, other = StandInReplica("down", reachable=False), StandInReplica("other")
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"2"}}, other: {MODEL: {"1"}}}), balancer, metrics)
    with pytest.raises(SidecarUnreachable):
        await dispatcher.send_shadow(MODEL, "2", PAYLOAD)
    assert other.received == []
    assert balancer.ejected_count() == 0


async def test_a_shadow_for_a_model_nobody_serves_is_not_found(balancer: Balancer, metrics: GatewayMetrics) -> None:
    dispatcher = make_dispatcher(StandInFleet({}), balancer, metrics)
    with pytest.raises(TurnoutError) as info:
        await dispatcher.send_shadow(MODEL, "2", PAYLOAD)
    assert info.value.status is Status.NOT_FOUND
    assert info.value.message == f"no replica serves '{MODEL}' version 2"


@pytest.mark.parametrize("version", ["1", "7" * 200])
def test_with_version_sets_the_version_over_any_earlier_one(version: str) -> None:
    original = pb.ModelInferRequest(model_name=MODEL, model_version="3", id="r1")
    updated = pb.ModelInferRequest.FromString(with_version(original.SerializeToString(), version))
    assert updated.model_version == version
    assert (updated.model_name, updated.id) == (MODEL, "r1")


# --- deadlines and pin lifetimes on a fake clock -------------------------------------

M = TypeVar("M", bound=Message)


class SlowStandInReplica(StandInReplica):
    """A stand-in whose every try takes `takes` seconds of `clock`: time passes between
    failover tries with nobody waiting."""

    def __init__(
        self, name: str, clock: FakeClock, takes: float, *, reachable: bool = True, journal: list[str] | None = None
    ) -> None:
        super().__init__(name, reachable=reachable, journal=journal)
        self._clock = clock
        self._takes = takes

    async def infer(
        self, encoded: bytes, traceparent: str = "", responses: Callable[[bytes], None] | None = None
    ) -> bytes:
        self._clock.advance(self._takes)
        return await super().infer(encoded, traceparent, responses)


class SequenceStandInReplica(StandInReplica):
    """A stand-in whose model config sets max_sequence_idle_microseconds to `idle_us`."""

    def __init__(self, name: str, idle_us: int) -> None:
        super().__init__(name)
        self.idle_us = idle_us

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float | None = None) -> M:
        answer = await super().call(method, request, response_type, timeout)
        assert isinstance(answer, pb.ModelConfigResponse)
        answer.config.sequence_batching.max_sequence_idle_microseconds = self.idle_us
        return answer


DEFAULT_PIN_SECS = DEFAULT_IDLE_SECS + PIN_GRACE_SECS


async def start_behind(dispatcher: Dispatcher, sequence_id: int, *replicas: StandInReplica) -> StandInReplica:
    """Start sequence `sequence_id` on version 1 while the replica its order ranks first
    is down, so that it is pinned to the second; the first is back (and readmitted) after.
    Returns the first: a later request that does not follow the pin goes there."""
    first, second = ranked(sequence_id, *replicas)[:2]
    first.go_down()
    assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id, start=True)) == second.name.encode()
    first.come_back()
    await let_background_tasks_run()
    return first


async def follows_pin(dispatcher: Dispatcher, sequence_id: int, first: StandInReplica) -> bool:
    """Whether a later request of the sequence followed its pin (else it went to `first`)."""
    return await dispatcher.send(MODEL, "", PAYLOAD, in_sequence(sequence_id)) != first.name.encode()


@pytest.mark.parametrize("takes", [1.0, 2.0], ids=["reaches-the-deadline", "passes-the-deadline"])
async def test_a_deadline_that_passes_during_a_try_stops_failover(
    balancer: Balancer, metrics: GatewayMetrics, takes: float
) -> None:
    clock = FakeClock()
    down = SlowStandInReplica("down", clock, takes, reachable=False)
    up = StandInReplica("up")
    fleet = StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, clock=clock)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)  # so `down` is tried first
        with pytest.raises(SidecarUnreachable) as info:
            await dispatcher.send(MODEL, "", PAYLOAD, RequestContext(deadline=clock.now + 1.0))
    assert info.value.message == down.unreachable_message
    assert len(down.received) == 1 and up.received == []
    assert balancer.ejected_count() == 1
    assert failovers(metrics, "exhausted") == 1
    assert failovers(metrics, "retried") is None


async def test_a_deadline_still_ahead_after_a_try_lets_the_next_replica_be_tried(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    down = SlowStandInReplica("down", clock, 0.999, reachable=False)
    up = StandInReplica("up")
    fleet = StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, clock=clock)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)
        assert await dispatcher.send(MODEL, "", PAYLOAD, RequestContext(deadline=clock.now + 1.0)) == b"up"
    assert len(down.received) == 1
    assert failovers(metrics, "retried") == 1
    assert failovers(metrics, "exhausted") is None


async def test_without_a_client_deadline_failover_stops_once_the_default_budget_is_spent(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    journal: list[str] = []
    pool = [
        SlowStandInReplica(str(n), clock, 0.4 * DEFAULT_BUDGET_SECS, reachable=False, journal=journal) for n in range(4)
    ]
    dispatcher = make_dispatcher(
        StandInFleet({replica: {MODEL: {"1"}} for replica in pool}), balancer, metrics, clock=clock
    )
    with pytest.raises(SidecarUnreachable):
        await dispatcher.send(MODEL, "", PAYLOAD, RequestContext())
    # One budget for the whole request: the third try ends past it, so the fourth replica is never tried.
    assert len(journal) == 3
    assert failovers(metrics, "retried") == 2
    assert failovers(metrics, "exhausted") == 1


async def test_a_sequence_pin_is_gone_once_idle_for_the_idle_time_and_grace(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    a, b = StandInReplica("a"), StandInReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1", "2"}}, b: {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, clock=clock)
    first = await start_behind(dispatcher, 7, a, b)
    clock.advance(DEFAULT_PIN_SECS)
    # With the pin gone the request follows the sequence's order, as on any other gateway.
    assert not await follows_pin(dispatcher, 7, first)


async def test_a_request_just_before_its_pin_expires_still_follows_it(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    a, b = StandInReplica("a"), StandInReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1", "2"}}, b: {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, clock=clock)
    first = await start_behind(dispatcher, 7, a, b)
    clock.advance(DEFAULT_PIN_SECS - 0.001)
    assert await follows_pin(dispatcher, 7, first)
    pinned = b if first is a else a
    assert pb.ModelInferRequest.FromString(pinned.received[-1]).model_version == "1"  # the START's version


async def test_each_request_of_a_sequence_keeps_its_pin_alive(balancer: Balancer, metrics: GatewayMetrics) -> None:
    clock = FakeClock()
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    first = await start_behind(dispatcher, 7, a, b)
    for _ in range(4):  # twice the pin's lifetime in all, never idle for as long as it
        clock.advance(0.5 * DEFAULT_PIN_SECS)
        assert await follows_pin(dispatcher, 7, first)
    clock.advance(DEFAULT_PIN_SECS)
    assert not await follows_pin(dispatcher, 7, first)


@pytest.mark.parametrize("idle_us", [200_000, 10_000_000], ids=["shorter-than-default", "longer-than-default"])
async def test_pins_last_the_idle_time_learned_from_the_model_config_plus_grace(
    balancer: Balancer, metrics: GatewayMetrics, idle_us: int
) -> None:
    clock = FakeClock()
    a, b = SequenceStandInReplica("a", idle_us), SequenceStandInReplica("b", idle_us)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    await start_behind(dispatcher, 7, a, b)  # the first START asks for the config
    assert a.config_requests + b.config_requests == [pb.ModelConfigRequest(name=MODEL, version="1")]
    started = clock.now
    first_8 = await start_behind(dispatcher, 8, a, b)
    first_9 = await start_behind(dispatcher, 9, a, b)
    assert len(a.config_requests + b.config_requests) == 1  # learned once
    lifetime = idle_us / 1e6 + PIN_GRACE_SECS
    clock.now = started + lifetime - 0.001
    assert await follows_pin(dispatcher, 8, first_8)
    clock.now = started + lifetime
    assert not await follows_pin(dispatcher, 9, first_9)


async def test_the_idle_time_is_learned_again_after_a_load_or_unload(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    a, b = SequenceStandInReplica("a", 10_000_000), SequenceStandInReplica("b", 10_000_000)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    await start_behind(dispatcher, 7, a, b)
    a.idle_us = b.idle_us = 200_000  # the model was reloaded with a shorter idle time
    dispatcher.models_changed()
    await start_behind(dispatcher, 8, a, b)
    assert len(a.config_requests + b.config_requests) == 2
    first = await start_behind(dispatcher, 9, a, b)
    clock.advance(0.2 + PIN_GRACE_SECS)
    assert not await follows_pin(dispatcher, 9, first)


# --- experiments across models -------------------------------------------------------

EXPERIMENT = {"weights": {"a:1": 50, "b:2": 50}, "shadow": {"version": "c:1"}}


async def test_an_experiments_arms_are_ready_as_their_models_are(balancer: Balancer, metrics: GatewayMetrics) -> None:
    fleet = StandInFleet({StandInReplica("x"): {"a": {"1"}, "b": {"1"}}})  # b has no version 2
    dispatcher = make_dispatcher(fleet, balancer, metrics, {"exp": EXPERIMENT})
    decisions = {dispatcher.decide("exp", "", RequestContext()) for _ in range(20)}
    assert {(d.model, d.version, d.arm, d.skipped) for d in decisions} == {("a", "1", "a:1", ("b:2",))}
    experiments = dispatcher.experiments
    assert experiments.ready_arms("exp") == frozenset({"a:1"})
    # The first weighted arm that is ready stands for the called name, or the one asked for.
    assert experiments.front("exp", "") == ("a", "1")
    assert experiments.front("exp", "b:2") == ("b", "2")
    assert experiments.front("a", "") is None  # no experiment
    with pytest.raises(TurnoutError) as info:
        experiments.front("exp", "9")
    assert info.value.status is Status.NOT_FOUND
    assert info.value.message == "Request for unknown model: 'exp' version 9 is not found"
    index = experiments.in_index([pb.RepositoryIndexResponse.ModelIndex(name="other", version="1", state="READY")])
    assert [(e.name, e.version, e.state) for e in index] == [
        ("other", "1", "READY"),
        ("exp", "a:1", "READY"),
        ("exp", "b:2", "UNAVAILABLE"),
    ]
    routes = "turnout_gateway_route_decisions_total"
    assert sample(metrics, routes, model="exp", version="a:1", reason="weighted") == 20


async def test_a_called_name_that_is_a_model_too_keeps_its_own_versions(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("x"): {"a": {"1", "2"}, "b": {"2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {"a": {"weights": {"1": 50, "b:2": 50}}})
    experiments = dispatcher.experiments
    assert experiments.front("a", "") == ("a", "1")
    assert experiments.front("a", "b:2") == ("b", "2")
    assert experiments.front("a", "2") is None  # a's own version 2 answers itself
    own = [pb.RepositoryIndexResponse.ModelIndex(name="a", version=v, state="READY") for v in ("1", "2")]
    assert [(e.name, e.version) for e in experiments.in_index(own)] == [("a", "1"), ("a", "2"), ("a", "b:2")]
    explicit = dispatcher.decide("a", "2", RequestContext())
    assert (explicit.model, explicit.version, explicit.reason) == ("", "2", Reason.EXPLICIT)


async def test_a_sequence_through_an_experiment_keeps_its_arm_and_replica(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    x, y = StandInReplica("x"), StandInReplica("y")
    fleet = StandInFleet({x: {"a": {"1"}}, y: {"a": {"1"}, "b": {"2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {"exp": EXPERIMENT})
    start = dispatcher.decide("exp", "", in_sequence(7, start=True))
    assert start.shadow == "" and start.arm in ("a:1", "b:2")
    first = await dispatcher.send("exp", start.version, PAYLOAD, in_sequence(7, start=True), start.model)
    # The answer names the called model and the arm.
    assert first.endswith(relabelled(b"-", "exp", start.arm)[1:])
    served = x if first.startswith(b"x") else y
    for _ in range(10):
        later = dispatcher.decide("exp", "", in_sequence(7))
        assert (later.version, later.model, later.reason) == ("", "", Reason.SEQUENCE)
        assert await dispatcher.send("exp", "", PAYLOAD, in_sequence(7)) == first
    # Its later requests reach the arm's model and version (gateway.core aims the START itself).
    sent = [pb.ModelInferRequest.FromString(each) for each in served.received[1:]]
    assert {(request.model_name, request.model_version) for request in sent} == {(start.model, start.version)}
    routes = "turnout_gateway_route_decisions_total"
    assert sample(metrics, routes, model="exp", version=start.arm, reason="sequence") == 10
    await let_background_tasks_run()
    # The idle time is asked of the model that serves the sequence.
    assert [request.name for request in served.config_requests] == [start.model]


async def test_a_later_request_another_gateway_started_finds_its_arm(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    """Two dispatchers stand for two gateways: the second never saw the START, and asks
    the replicas of the arm a START would get, in the sequence's order, first."""
    x, y = SequenceHoldingReplica("x"), SequenceHoldingReplica("y")
    fleet = StandInFleet({x: {"a": {"1"}, "b": {"2"}}, y: {"a": {"1"}, "b": {"2"}}})
    first_gateway = make_dispatcher(fleet, balancer, metrics, {"exp": EXPERIMENT})
    second_gateway = make_dispatcher(fleet, balancer, metrics, {"exp": EXPERIMENT})
    for sequence_id in range(1, 9):
        start = first_gateway.decide("exp", "", in_sequence(sequence_id, start=True))
        # As gateway.core sends a START to an arm: the arm's model and version set in the payload.
        payload = with_model(with_version(sequence_payload(sequence_id, start=True), start.version), start.model)
        started = await first_gateway.send(
            "exp", start.version, payload, in_sequence(sequence_id, start=True), start.model
        )
        later = sequence_payload(sequence_id)
        assert await second_gateway.send("exp", "", later, in_sequence(sequence_id)) == started
    assert {version for replica in (x, y) for version, _ in replica.held} == {"1", "2"}  # both arms took some
    await let_background_tasks_run()


async def test_a_shadow_to_another_models_arm_names_that_model(balancer: Balancer, metrics: GatewayMetrics) -> None:
    candidate = StandInReplica("candidate")
    dispatcher = make_dispatcher(StandInFleet({candidate: {"c": {"1"}}}), balancer, metrics)
    assert await dispatcher.send_shadow("exp", "c:1", PAYLOAD) == b"candidate"
    (sent,) = candidate.received
    assert (pb.ModelInferRequest.FromString(sent).model_name, pb.ModelInferRequest.FromString(sent).model_version) == (
        "c",
        "1",
    )


class StreamingReplica(StandInReplica):
    """A replica serving a decoupled model: two responses before its last."""

    async def infer(
        self, encoded: bytes, traceparent: str = "", responses: Callable[[bytes], None] | None = None
    ) -> bytes:
        if responses is not None:
            for _ in range(2):
                responses(pb.ModelInferResponse(model_name="b", model_version="2").SerializeToString())
        return await super().infer(encoded, traceparent, responses)


async def test_every_response_of_a_decoupled_arm_answers_under_the_called_name(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    dispatcher = make_dispatcher(
        StandInFleet({StreamingReplica("y"): {"b": {"2"}}}), balancer, metrics, {"exp": {"weights": {"b:2": 100}}}
    )
    parts: list[bytes] = []
    context = RequestContext(responses=parts.append)
    decision = dispatcher.decide("exp", "", context)
    await dispatcher.send("exp", decision.version, PAYLOAD, context, decision.model)
    answers = [pb.ModelInferResponse.FromString(part) for part in parts]
    assert [(a.model_name, a.model_version) for a in answers] == [("exp", "b:2")] * 2


def test_relabelled_names_the_called_model_and_the_arm() -> None:
    answer = pb.ModelInferResponse(model_name="a", model_version="1", id="r").SerializeToString()
    back = pb.ModelInferResponse.FromString(relabelled(answer, "exp", "a:1"))
    assert (back.model_name, back.model_version, back.id) == ("exp", "a:1", "r")
    assert relabelled(b"", "exp", "a:1") == b""  # a decoupled model's final flag alone stays empty
