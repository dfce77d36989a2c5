"""gateway.fleet in process: several replicas' repository indexes and statistics combined
into one answer (the fleet as one Triton), and repository calls made on every replica."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.fleet import combine_indexes, combine_statistics, on_replicas
from protos import grpc_service_pb2 as pb
from protos.status import Status, TurnoutError

ModelIndex = pb.RepositoryIndexResponse.ModelIndex


def index(*entries: tuple[str, str, str, str]) -> list[ModelIndex]:
    """One replica's RepositoryIndex entries, as `answer.models` holds them: (name, version, state, reason)."""
    answer = pb.RepositoryIndexResponse(
        models=[ModelIndex(name=n, version=v, state=s, reason=r) for n, v, s, r in entries]
    )
    return list(answer.models)


def rows(models: list[ModelIndex]) -> list[tuple[str, str, str, str]]:
    return [(m.name, m.version, m.state, m.reason) for m in models]


# --- combine_indexes ---------------------------------------------------------------


def test_a_model_ready_on_every_replica_is_ready_once() -> None:
    replica = index(("simple", "1", "READY", ""), ("simple", "2", "READY", ""))
    combined = combine_indexes([("onnxruntime", replica), ("onnxruntime", list(replica))])
    assert rows(combined) == [("simple", "1", "READY", ""), ("simple", "2", "READY", "")]


def test_a_model_ready_on_one_of_two_replicas_takes_the_other_state_and_says_how_many_are_ready() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("simple", "1", "READY", ""))),
            ("onnxruntime", index(("simple", "1", "UNAVAILABLE", "unloaded"))),
        ]
    )
    assert rows(combined) == [("simple", "1", "UNAVAILABLE", "1 of 2 replicas READY: unloaded")]


def test_a_replica_ahead_of_the_others_does_not_make_the_model_ready() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("simple", "1", "UNAVAILABLE", "unloaded"))),
            ("onnxruntime", index(("simple", "1", "READY", ""))),
        ]
    )
    assert rows(combined) == [("simple", "1", "UNAVAILABLE", "1 of 2 replicas READY: unloaded")]


def test_the_first_state_other_than_ready_in_replica_order_is_the_one_shown() -> None:
    combined = combine_indexes(
        [
            ("pytorch", index(("torchy", "3", "READY", ""))),
            ("pytorch", index(("torchy", "3", "LOADING", ""))),
            ("pytorch", index(("torchy", "3", "UNAVAILABLE", "failed to load 'torchy' version 3: bad file"))),
        ]
    )
    # LOADING has no reason of its own, so the count stands alone.
    assert rows(combined) == [("torchy", "3", "LOADING", "1 of 3 replicas READY")]


def test_no_replica_ready_still_counts_zero_of_them() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("simple", "1", "UNAVAILABLE", "unloaded"))),
            ("onnxruntime", index(("simple", "1", "LOADING", ""))),
        ]
    )
    assert rows(combined) == [("simple", "1", "UNAVAILABLE", "0 of 2 replicas READY: unloaded")]


def test_replicas_that_agree_on_a_state_other_than_ready_pass_it_on_as_one_triton_would() -> None:
    unloaded = ("simple", "1", "UNAVAILABLE", "unloaded")
    combined = combine_indexes([("onnxruntime", index(unloaded)), ("onnxruntime", index(unloaded))])
    assert rows(combined) == [unloaded]


def test_a_folder_every_framework_lists_without_a_version_is_listed_once() -> None:
    # Each sidecar that reports unassigned folders lists a `python` model alike.
    refused = ("tokenizer", "", "UNAVAILABLE", "unable to find backend library for backend 'python': ...")
    combined = combine_indexes(
        [
            ("onnxruntime", index(refused, ("simple", "1", "READY", ""))),
            ("pytorch", index(refused, ("simple", "1", "READY", ""))),
        ]
    )
    assert rows(combined) == [refused, ("simple", "1", "READY", ""), ("simple", "1", "READY", "")]


def test_each_version_is_combined_on_its_own() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("simple", "1", "READY", ""), ("simple", "2", "READY", ""))),
            ("onnxruntime", index(("simple", "1", "READY", ""), ("simple", "2", "UNAVAILABLE", "unloaded"))),
        ]
    )
    assert rows(combined) == [
        ("simple", "1", "READY", ""),
        ("simple", "2", "UNAVAILABLE", "1 of 2 replicas READY: unloaded"),
    ]


def test_a_model_only_some_replicas_list_is_combined_over_those_that_list_it() -> None:
    # The docstring's rule: READY when every replica *that lists it* has it READY.
    combined = combine_indexes(
        [
            ("onnxruntime", index(("simple", "1", "READY", ""))),
            ("onnxruntime", index(("simple", "1", "READY", ""), ("fresh", "1", "READY", ""))),
            ("onnxruntime", index(("simple", "1", "READY", ""), ("fresh", "1", "UNAVAILABLE", "unloaded"))),
        ]
    )
    assert rows(combined) == [
        ("simple", "1", "READY", ""),
        ("fresh", "1", "UNAVAILABLE", "1 of 2 replicas READY: unloaded"),
    ]


def test_entries_keep_the_order_they_were_first_seen_in() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("b", "1", "READY", ""), ("a", "1", "READY", ""))),
            ("onnxruntime", index(("c", "1", "READY", ""), ("a", "1", "READY", ""), ("b", "1", "READY", ""))),
        ]
    )
    assert [m.name for m in combined] == ["b", "a", "c"]


def test_sidecars_of_different_frameworks_are_not_replicas_so_a_shared_name_shows_twice() -> None:
    combined = combine_indexes(
        [
            ("onnxruntime", index(("shared", "1", "READY", ""))),
            ("pytorch", index(("shared", "1", "UNAVAILABLE", "unloaded"))),
        ]
    )
    assert rows(combined) == [("shared", "1", "READY", ""), ("shared", "1", "UNAVAILABLE", "unloaded")]


def test_no_answers_combine_to_an_empty_index() -> None:
    assert combine_indexes([]) == []


# --- combine_statistics ------------------------------------------------------------

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")


def random_stats(rng: random.Random, name: str, version: str, batch_sizes: list[int]) -> pb.ModelStatistics:
    stats = pb.ModelStatistics(
        name=name,
        version=version,
        last_inference=rng.randrange(1, 10**12),
        inference_count=rng.randrange(10**6),
        execution_count=rng.randrange(10**6),
    )
    for field in _DURATIONS:
        duration = getattr(stats.inference_stats, field)
        duration.count = rng.randrange(10**6)
        duration.ns = rng.randrange(10**12)
    for size in batch_sizes:
        batch = stats.batch_stats.add(batch_size=size)
        for field in _BATCH_DURATIONS:
            getattr(batch, field).count = rng.randrange(10**6)
            getattr(batch, field).ns = rng.randrange(10**12)
    return stats


def test_every_counter_of_a_model_version_is_the_sum_over_replicas(rng: random.Random) -> None:
    answers = [
        pb.ModelStatisticsResponse(model_stats=[random_stats(rng, "simple", "1", rng.sample([1, 2, 4, 8], 3))])
        for _ in range(4)
    ]
    combined = combine_statistics(answers)

    assert len(combined.model_stats) == 1
    (total,) = combined.model_stats
    parts = [a.model_stats[0] for a in answers]
    assert (total.name, total.version) == ("simple", "1")
    assert total.inference_count == sum(p.inference_count for p in parts)
    assert total.execution_count == sum(p.execution_count for p in parts)
    assert total.last_inference == max(p.last_inference for p in parts)
    for field in _DURATIONS:
        assert getattr(total.inference_stats, field).count == sum(
            getattr(p.inference_stats, field).count for p in parts
        )
        assert getattr(total.inference_stats, field).ns == sum(getattr(p.inference_stats, field).ns for p in parts)
    sizes = sorted({b.batch_size for p in parts for b in p.batch_stats})
    assert [b.batch_size for b in total.batch_stats] == sizes
    for batch in total.batch_stats:
        same_size = [b for p in parts for b in p.batch_stats if b.batch_size == batch.batch_size]
        for field in _BATCH_DURATIONS:
            assert getattr(batch, field).count == sum(getattr(b, field).count for b in same_size)
            assert getattr(batch, field).ns == sum(getattr(b, field).ns for b in same_size)


def test_batch_statistics_add_up_per_batch_size_and_come_out_sorted() -> None:
    first = pb.ModelStatistics(name="simple", version="1")
    first.batch_stats.add(batch_size=4).compute_infer.CopyFrom(pb.StatisticDuration(count=1, ns=40))
    first.batch_stats.add(batch_size=1).compute_infer.CopyFrom(pb.StatisticDuration(count=2, ns=10))
    second = pb.ModelStatistics(name="simple", version="1")
    second.batch_stats.add(batch_size=2).compute_infer.CopyFrom(pb.StatisticDuration(count=3, ns=60))
    second.batch_stats.add(batch_size=4).compute_infer.CopyFrom(pb.StatisticDuration(count=5, ns=200))

    combined = combine_statistics(
        [pb.ModelStatisticsResponse(model_stats=[first]), pb.ModelStatisticsResponse(model_stats=[second])]
    )

    batches = [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in combined.model_stats[0].batch_stats]
    assert batches == [(1, 2, 10), (2, 3, 60), (4, 6, 240)]


def test_versions_and_models_stay_apart_and_keep_first_seen_order() -> None:
    def stats(name: str, version: str, count: int) -> pb.ModelStatistics:
        return pb.ModelStatistics(name=name, version=version, inference_count=count)

    combined = combine_statistics(
        [
            pb.ModelStatisticsResponse(model_stats=[stats("simple", "2", 1), stats("simple", "1", 10)]),
            pb.ModelStatisticsResponse(model_stats=[stats("simple", "1", 100), stats("torchy", "1", 1000)]),
            pb.ModelStatisticsResponse(model_stats=[stats("simple", "2", 10000)]),
        ]
    )

    totals = [(s.name, s.version, s.inference_count) for s in combined.model_stats]
    assert totals == [("simple", "2", 10001), ("simple", "1", 110), ("torchy", "1", 1000)]


def test_a_model_on_only_one_replica_comes_through_whole(rng: random.Random) -> None:
    only_here = random_stats(rng, "fresh", "1", [1, 8])
    combined = combine_statistics(
        [
            pb.ModelStatisticsResponse(model_stats=[random_stats(rng, "simple", "1", [1])]),
            pb.ModelStatisticsResponse(model_stats=[only_here]),
        ]
    )
    assert combined.model_stats[1] == only_here


def test_combining_leaves_the_replicas_answers_as_they_were(rng: random.Random) -> None:
    answers = [pb.ModelStatisticsResponse(model_stats=[random_stats(rng, "simple", "1", [2, 1])]) for _ in range(3)]
    before = [a.SerializeToString(deterministic=True) for a in answers]
    combine_statistics(answers)
    assert [a.SerializeToString(deterministic=True) for a in answers] == before


def test_no_answers_combine_to_empty_statistics() -> None:
    assert combine_statistics([]) == pb.ModelStatisticsResponse()


# --- on_replicas -------------------------------------------------------------------


class ReplicaStandIn:
    """Stands in for one sidecar replica across the network: answers repository calls,
    after `gate` opens when one is given, failing with `failure` when one is given."""

    def __init__(self, address: str, failure: TurnoutError | None = None, gate: asyncio.Event | None = None) -> None:
        self.address = address
        self.failure = failure
        self.gate = gate
        self.calls: list[tuple[str, object]] = []
        self.answered = False

    async def call(self, method: str, request: object, response_type: type) -> object:
        self.calls.append((method, request))
        if self.gate is not None:
            await self.gate.wait()
        self.answered = True
        if self.failure is not None:
            raise self.failure
        return response_type()


async def test_a_repository_call_goes_to_every_replica() -> None:
    replicas = [ReplicaStandIn("10.0.0.1:8001"), ReplicaStandIn("10.0.0.2:8001")]
    request = pb.RepositoryModelLoadRequest(model_name="simple")
    await on_replicas(replicas, "RepositoryModelLoad", request)
    assert [r.calls for r in replicas] == [[("RepositoryModelLoad", request)]] * 2


async def test_the_first_failure_in_replica_order_is_raised_once_every_replica_has_answered() -> None:
    gate = asyncio.Event()
    slow_failure = TurnoutError(Status.INTERNAL, "failed to load 'simple' on the first replica")
    fast_failure = TurnoutError(Status.INTERNAL, "failed to load 'simple' on the third replica")
    replicas = [
        ReplicaStandIn("10.0.0.1:8001", slow_failure, gate),
        ReplicaStandIn("10.0.0.2:8001", gate=gate),
        ReplicaStandIn("10.0.0.3:8001", fast_failure),
    ]
    call = asyncio.ensure_future(
        on_replicas(replicas, "RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="simple"))
    )
    for _ in range(3):
        await asyncio.sleep(0)
    # The third replica failed at once, but the others are still answering.
    assert replicas[2].answered and not call.done()

    gate.set()
    with pytest.raises(TurnoutError) as raised:
        await call
    assert raised.value is slow_failure
    assert all(r.answered for r in replicas)
