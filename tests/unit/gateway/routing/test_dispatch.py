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
from gateway.routing.dispatch import DEFAULT_BUDGET_SECS, Dispatcher, with_version
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.replicas import Balancer
from gateway.routing.sequences import DEFAULT_IDLE_SECS, PIN_GRACE_SECS
from gateway.routing.versions import Reason, parse_policy
from gateway.upstream import SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import Status, TurnoutError, invalid_arg
from tests.unit.fake_clock import FakeClock
from tests.unit.gateway.routing.replica_stand_in import StandInReplica, let_background_tasks_run

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


async def test_a_started_sequence_stays_on_its_replica_even_when_another_is_less_loaded(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True)) == b"a"
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 5)
        answers = {await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7)) for _ in range(20)}
    assert answers == {b"a"}
    assert b.received == []
    await let_background_tasks_run()


async def test_later_requests_of_a_sequence_keep_the_version_of_its_start(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a = StandInReplica("a")
    fleet = StandInFleet({a: {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: {"weights": {"1": 50, "2": 50}}})
    await dispatcher.send(MODEL, "2", PAYLOAD, in_sequence(7, start=True))
    decisions = {dispatcher.decide(MODEL, "", in_sequence(7)) for _ in range(20)}
    assert {(d.version, d.reason) for d in decisions} == {("2", Reason.SEQUENCE)}
    await let_background_tasks_run()
    assert [request.version for request in a.config_requests] == ["2"]


async def test_a_sequence_start_without_a_policy_is_routed_to_the_newest_ready_version(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"9", "10"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    decision = dispatcher.decide(MODEL, "", in_sequence(7, start=True))
    assert decision.version == "10"


async def test_a_sequence_start_is_never_shadowed(balancer: Balancer, metrics: GatewayMetrics) -> None:
    fleet = StandInFleet({StandInReplica("a"): {MODEL: {"1", "2"}}})
    policy = {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}}
    dispatcher = make_dispatcher(fleet, balancer, metrics, {MODEL: policy})
    assert dispatcher.decide(MODEL, "", RequestContext()).shadow == "2"
    decision = dispatcher.decide(MODEL, "", in_sequence(7, start=True))
    assert (decision.version, decision.shadow) == ("1", "")


async def test_a_pinned_replica_that_cannot_be_reached_fails_the_request_without_failover(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True))
    a.go_down()
    with pytest.raises(TurnoutError) as info:
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7))
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == (
        f"sequence 7 of model '{MODEL}' was started on replica {a.address}, which could not be reached;"
        " start the sequence again"
    )
    assert isinstance(info.value.__cause__, SidecarUnreachable)
    assert b.received == []
    assert balancer.ejected_count() == 1


async def test_a_pinned_replica_that_left_the_fleet_fails_the_request(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True))
    fleet.remove(a)
    with pytest.raises(TurnoutError) as info:
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7))
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == (
        f"sequence 7 of model '{MODEL}' was started on replica {a.address}, which no longer serves it;"
        " start the sequence again"
    )
    assert len(a.received) == 1 and b.received == []


async def test_end_goes_to_the_pinned_replica_and_clears_the_pin(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True))
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, end=True)) == b"a"
        assert dispatcher.decide(MODEL, "1", in_sequence(7)).reason is not Reason.SEQUENCE
        # Unpinned, a late request of the ended sequence is routed like any other.
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7)) == b"b"


async def test_a_start_that_fails_over_pins_the_replica_that_answered(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    down, up = StandInReplica("down", reachable=False), StandInReplica("up")
    dispatcher = make_dispatcher(StandInFleet({down: {MODEL: {"1"}}, up: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True)) == b"up"
    down.come_back()
    await let_background_tasks_run()
    assert balancer.ejected_count() == 0
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, up, 3)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7)) == b"up"
    assert len(down.received) == 1


async def test_a_sequence_of_one_request_leaves_no_pin(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True, end=True))
    assert dispatcher.decide(MODEL, "1", in_sequence(7)).reason is not Reason.SEQUENCE
    assert a.config_requests == []


async def test_pins_are_kept_per_model_and_sequence(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b = StandInReplica("a"), StandInReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1"}, "other": {"1"}}, b: {MODEL: {"1"}, "other": {"1"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics)
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7, start=True))
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 1)
        await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(8, start=True))
        await dispatcher.send("other", "1", PAYLOAD, in_sequence(7, start=True))
    # Each request below would go to the other replica if its pin were not found.
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(7)) == b"a"
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(8)) == b"b"
        assert await dispatcher.send("other", "1", PAYLOAD, in_sequence(7)) == b"b"
    await let_background_tasks_run()


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


async def start_sequence(
    dispatcher: Dispatcher, balancer: Balancer, on: StandInReplica, other: StandInReplica, sequence_id: int
) -> None:
    """Start sequence `sequence_id` on version 1 of replica `on`, with `other` busier, and
    let the idle-time lookup that a START may begin run to its end."""
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, other, 1)
        assert await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id, start=True)) == on.name.encode()
    await let_background_tasks_run()


async def send_with_pinned_replica_busier(
    dispatcher: Dispatcher, balancer: Balancer, pinned: StandInReplica, sequence_id: int
) -> bytes:
    """A later request of the sequence, sent while its pinned replica is the busier one:
    the answer says whether the pin was followed."""
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, pinned, 1)
        return await dispatcher.send(MODEL, "1", PAYLOAD, in_sequence(sequence_id))


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
    await start_sequence(dispatcher, balancer, a, b, 7)
    clock.advance(DEFAULT_PIN_SECS)
    # With the pin gone the request is routed like any other (to the less loaded
    # replica), not refused; it pins nothing, since it is no START.
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 7) == b"b"
    assert await send_with_pinned_replica_busier(dispatcher, balancer, b, 7) == b"a"
    decision = dispatcher.decide(MODEL, "", in_sequence(7))
    assert (decision.version, decision.reason) == ("2", Reason.DEFAULT)


async def test_a_request_just_before_its_pin_expires_still_follows_it(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    a, b = StandInReplica("a"), StandInReplica("b")
    fleet = StandInFleet({a: {MODEL: {"1", "2"}}, b: {MODEL: {"1", "2"}}})
    dispatcher = make_dispatcher(fleet, balancer, metrics, clock=clock)
    await start_sequence(dispatcher, balancer, a, b, 7)
    clock.advance(DEFAULT_PIN_SECS - 0.001)
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 7) == b"a"
    decision = dispatcher.decide(MODEL, "", in_sequence(7))
    assert (decision.version, decision.reason) == ("1", Reason.SEQUENCE)


async def test_each_request_of_a_sequence_keeps_its_pin_alive(balancer: Balancer, metrics: GatewayMetrics) -> None:
    clock = FakeClock()
    a, b = StandInReplica("a"), StandInReplica("b")
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    await start_sequence(dispatcher, balancer, a, b, 7)
    for _ in range(4):  # twice the pin's lifetime in all, never idle for as long as it
        clock.advance(0.5 * DEFAULT_PIN_SECS)
        assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 7) == b"a"
    clock.advance(DEFAULT_PIN_SECS)
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 7) == b"b"


@pytest.mark.parametrize("idle_us", [200_000, 10_000_000], ids=["shorter-than-default", "longer-than-default"])
async def test_pins_last_the_idle_time_learned_from_the_model_config_plus_grace(
    balancer: Balancer, metrics: GatewayMetrics, idle_us: int
) -> None:
    clock = FakeClock()
    a, b = SequenceStandInReplica("a", idle_us), SequenceStandInReplica("b", idle_us)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    await start_sequence(dispatcher, balancer, a, b, 7)  # the first START asks for the config
    assert a.config_requests == [pb.ModelConfigRequest(name=MODEL, version="1")]
    started = clock.now
    await start_sequence(dispatcher, balancer, a, b, 8)
    await start_sequence(dispatcher, balancer, a, b, 9)
    assert len(a.config_requests) == 1 and b.config_requests == []  # learned once
    lifetime = idle_us / 1e6 + PIN_GRACE_SECS
    clock.now = started + lifetime - 0.001
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 8) == b"a"
    clock.now = started + lifetime
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 9) == b"b"


async def test_the_idle_time_is_learned_again_after_a_load_or_unload(
    balancer: Balancer, metrics: GatewayMetrics
) -> None:
    clock = FakeClock()
    a, b = SequenceStandInReplica("a", 10_000_000), SequenceStandInReplica("b", 10_000_000)
    dispatcher = make_dispatcher(StandInFleet({a: {MODEL: {"1"}}, b: {MODEL: {"1"}}}), balancer, metrics, clock=clock)
    await start_sequence(dispatcher, balancer, a, b, 7)
    a.idle_us = b.idle_us = 200_000  # the model was reloaded with a shorter idle time
    dispatcher.models_changed()
    await start_sequence(dispatcher, balancer, a, b, 8)
    assert len(a.config_requests) == 2
    await start_sequence(dispatcher, balancer, a, b, 9)
    clock.advance(0.2 + PIN_GRACE_SECS)
    assert await send_with_pinned_replica_busier(dispatcher, balancer, a, 9) == b"b"
