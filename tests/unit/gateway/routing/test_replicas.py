"""Replica choice (`gateway.routing.replicas.Balancer`), in process: power of two choices
on outstanding requests drawn from a seeded generator, in-flight tracking, `tried`
exclusion, ejection until a probe finds the replica ready, `forget`, and the
`max_inflight` limit."""

from __future__ import annotations

import contextlib
import random
from collections import Counter

import pytest

from gateway.metrics import GatewayMetrics
from gateway.routing.replicas import QUEUE_FULL, Balancer
from protos.status import Status, TurnoutError
from tests.unit.gateway.routing.replica_stand_in import StandInReplica, let_background_tasks_run

DRAWS = 3000


def replicas(*names: str) -> list[StandInReplica]:
    return [StandInReplica(name) for name in names]


def ejections(metrics: GatewayMetrics, framework: str = "onnxruntime") -> float | None:
    return metrics.registry.get_sample_value("turnout_gateway_replica_ejections_total", {"framework": framework})


def busy(balancer: Balancer, stack: contextlib.ExitStack, replica: StandInReplica, requests: int) -> None:
    """Hold `requests` requests in flight on `replica` until `stack` closes."""
    for _ in range(requests):
        stack.enter_context(balancer.track(replica))


def test_of_two_candidates_the_less_loaded_always_wins(balancer: Balancer) -> None:
    idle, loaded = replicas("idle", "loaded")
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, loaded, 1)
        assert {balancer.choose([idle, loaded]) for _ in range(200)} == {idle}
        assert {balancer.choose([loaded, idle]) for _ in range(200)} == {idle}


def test_the_less_loaded_of_two_random_candidates_wins_so_the_busiest_is_never_chosen(balancer: Balancer) -> None:
    # Loads 0, 1, 2: the pairs {a,b} and {a,c} go to a, {b,c} to b. Always taking the
    # least loaded would send everything to a; a uniform draw would reach c.
    a, b, c = replicas("a", "b", "c")
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, b, 1)
        busy(balancer, stack, c, 2)
        chosen = Counter(balancer.choose([a, b, c]) for _ in range(DRAWS))
    assert chosen[c] == 0
    assert abs(chosen[a] / DRAWS - 2 / 3) < 0.03
    assert abs(chosen[b] / DRAWS - 1 / 3) < 0.03


def test_equally_loaded_replicas_share_the_choices(balancer: Balancer) -> None:
    pool = replicas("a", "b", "c")
    chosen = Counter(balancer.choose(pool) for _ in range(DRAWS))
    for replica in pool:
        assert abs(chosen[replica] / DRAWS - 1 / 3) < 0.03


def test_the_same_seed_gives_the_same_choices(metrics: GatewayMetrics) -> None:
    pool = replicas("a", "b", "c", "d")
    first = Balancer(random.Random(7), metrics)
    second = Balancer(random.Random(7), metrics)
    assert [first.choose(pool) for _ in range(100)] == [second.choose(pool) for _ in range(100)]


def test_a_tracked_request_counts_until_it_finishes(balancer: Balancer) -> None:
    a, b = replicas("a", "b")
    with balancer.track(a):
        assert balancer.choose([a, b]) is b
        with balancer.track(b), balancer.track(b):
            assert balancer.choose([a, b]) is a
    # Both finished: the loads are equal again, so either may be chosen.
    assert {balancer.choose([a, b]) for _ in range(100)} == {a, b}


def test_a_tracked_request_that_raises_is_released(metrics: GatewayMetrics, rng: random.Random) -> None:
    balancer = Balancer(rng, metrics, max_inflight=1)
    (a,) = replicas("a")
    with pytest.raises(RuntimeError, match="the sidecar answered garbage"), balancer.track(a):
        raise RuntimeError("the sidecar answered garbage")
    assert balancer.choose([a]) is a


def test_tried_replicas_are_not_chosen_again(balancer: Balancer) -> None:
    a, b, c = replicas("a", "b", "c")
    assert {balancer.choose([a, b, c], tried=[a]) for _ in range(200)} == {b, c}
    assert {balancer.choose([a, b, c], tried=[a, c]) for _ in range(20)} == {b}
    assert balancer.choose([a, b, c], tried=[a, b, c]) is None
    assert balancer.choose([]) is None


async def test_an_ejected_replica_is_left_out_and_counted(balancer: Balancer, metrics: GatewayMetrics) -> None:
    a, b, c = replicas("a", "b", "c")
    a.go_down()
    balancer.eject(a, a.unreachable_message)
    assert balancer.ejected_count() == 1
    assert ejections(metrics) == 1
    assert {balancer.choose([a, b, c]) for _ in range(200)} == {b, c}


async def test_ejecting_an_ejected_replica_again_changes_nothing(balancer: Balancer, metrics: GatewayMetrics) -> None:
    (a,) = replicas("a")
    a.go_down()
    balancer.eject(a, "first failure")
    balancer.eject(a, "second failure")
    await let_background_tasks_run()
    assert balancer.ejected_count() == 1
    assert ejections(metrics) == 1
    assert a.probes == 1


async def test_an_ejected_replica_returns_once_a_probe_finds_it_ready(balancer: Balancer) -> None:
    a, b = replicas("a", "b")
    a.go_down()
    balancer.eject(a, a.unreachable_message)
    await let_background_tasks_run()
    assert a.probes == 1
    assert balancer.ejected_count() == 1
    assert {balancer.choose([a, b]) for _ in range(50)} == {b}
    a.come_back()
    await let_background_tasks_run()
    assert balancer.ejected_count() == 0
    assert {balancer.choose([a, b]) for _ in range(200)} == {a, b}


async def test_ejected_replicas_are_chosen_when_nothing_else_is_left(balancer: Balancer) -> None:
    a, b, c = replicas("a", "b", "c")
    for replica in (a, b):
        replica.go_down()
        balancer.eject(replica, replica.unreachable_message)
    assert {balancer.choose([a, b]) for _ in range(200)} == {a, b}
    assert balancer.choose([a, b], tried=[a]) is b
    assert balancer.choose([a, b], tried=[a, b]) is None
    # A healthy candidate, even one not yet tried, is preferred to every ejected one.
    assert {balancer.choose([a, b, c]) for _ in range(50)} == {c}


async def test_forgetting_an_ejected_replica_stops_its_probe(balancer: Balancer) -> None:
    (a,) = replicas("a")
    a.go_down()
    balancer.eject(a, a.unreachable_message)
    await let_background_tasks_run()
    balancer.forget(a)
    assert balancer.ejected_count() == 0
    await let_background_tasks_run()
    assert a.probe_cancelled


def test_forgetting_a_replica_drops_its_in_flight_count_for_good(metrics: GatewayMetrics, rng: random.Random) -> None:
    balancer = Balancer(rng, metrics, max_inflight=1)
    (a,) = replicas("a")
    with balancer.track(a):
        balancer.forget(a)
        assert balancer.choose([a]) is a
    # The request that was in flight when `a` was forgotten must not leave a debt behind:
    # one new request fills `a` again.
    with balancer.track(a), pytest.raises(TurnoutError):
        balancer.choose([a])


def test_replicas_at_max_inflight_are_passed_over(metrics: GatewayMetrics, rng: random.Random) -> None:
    balancer = Balancer(rng, metrics, max_inflight=2)
    a, b = replicas("a", "b")
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 2)
        busy(balancer, stack, b, 1)
        assert balancer.choose([a, b]) is b


def test_every_replica_at_max_inflight_is_refused_at_once_with_tritons_queue_full_text(
    metrics: GatewayMetrics, rng: random.Random
) -> None:
    balancer = Balancer(rng, metrics, max_inflight=2)
    a, b = replicas("a", "b")
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 2)
        busy(balancer, stack, b, 2)
        with pytest.raises(TurnoutError) as info:
            balancer.choose([a, b])
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message == QUEUE_FULL == "[request id: <id_unknown>] Exceeds maximum queue size"
    assert balancer.choose([a, b]) in (a, b)


def test_no_max_inflight_means_no_limit(balancer: Balancer) -> None:
    (a,) = replicas("a")
    with contextlib.ExitStack() as stack:
        busy(balancer, stack, a, 100)
        assert balancer.choose([a]) is a


async def test_closing_the_balancer_cancels_every_probe(metrics: GatewayMetrics, rng: random.Random) -> None:
    balancer = Balancer(rng, metrics)
    a, b = replicas("a", "b")
    for replica in (a, b):
        replica.go_down()
        balancer.eject(replica, replica.unreachable_message)
    await let_background_tasks_run()
    await balancer.close()
    assert balancer.ejected_count() == 0
    assert a.probe_cancelled and b.probe_cancelled
