"""gateway.registry in process: StaticRegistry learns which sidecar owns each model from
their repository indexes, shares one index round among concurrent misses, rate limits
misses with its injected clock, and relearns after loads and unloads; its watch polls
each sidecar's readiness into the FleetHealth readiness reads, and reads the indexes
again when one comes back; framework_of_load picks the sidecar for a model no index lists."""

from __future__ import annotations

import asyncio

import pytest

from gateway.readiness import unready_reasons
from gateway.registry import READY_POLL_SECS, StaticRegistry, framework_of_load
from protos import grpc_service_pb2 as pb
from protos.status import Status, TurnoutError
from tests.unit.fake_clock import FakeClock
from tests.unit.virtual_loop import virtual_time


class SidecarStandIn:
    """Stands in for a sidecar across the network (a gateway.upstream.SidecarClient): its
    RepositoryIndex lists `models` as (name, version, state), counting the calls.

    The listing is taken when the call arrives; with `gate` set the answer then waits for
    the gate, as an answer still on the wire would. With `failure` set the call raises it."""

    def __init__(self, framework: str, address: str, models: list[tuple[str, str, str]] | None = None) -> None:
        self.framework = framework
        self.address = address
        self.models = list(models or [])
        self.index_calls = 0
        self.gate: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self.ready: bool | None = True  # its ServerReady answer; None: it does not answer

    def __repr__(self) -> str:
        return f"SidecarStandIn({self.framework!r}, {self.address!r})"

    async def readiness(self) -> bool | None:
        return self.ready

    async def repository_index(self) -> pb.RepositoryIndexResponse:
        self.index_calls += 1
        listing = pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(name=n, version=v, state=s) for n, v, s in self.models]
        )
        failure = self.failure
        if self.gate is not None:
            await self.gate.wait()
        if failure is not None:
            raise failure
        return listing


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def onnx() -> SidecarStandIn:
    return SidecarStandIn("onnxruntime", "127.0.0.1:9001", [("simple", "1", "READY"), ("simple", "2", "READY")])


@pytest.fixture
def torch() -> SidecarStandIn:
    return SidecarStandIn("pytorch", "127.0.0.1:9002", [("torchy", "1", "READY"), ("later", "1", "UNAVAILABLE")])


async def let_tasks_run() -> None:
    """Give every runnable task its turn, so each reaches the await it blocks on."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- ownership ---------------------------------------------------------------------


async def test_each_model_belongs_to_the_sidecar_whose_index_lists_it(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    await registry.refresh()

    assert registry.owner("simple") is onnx
    assert registry.owner("torchy") is torch
    assert registry.owner("later") is torch  # listed but not loaded: still its owner
    assert registry.owner("nope") is None
    assert registry.replicas("simple", "2") == (onnx,)
    assert registry.replicas("nope", "") == ()
    assert registry.peers(torch) == (torch,)
    assert list(registry.sidecars) == [onnx, torch]


async def test_ready_versions_are_the_owners_ready_ones_and_unknown_without_any(onnx, torch, clock) -> None:
    onnx.models.append(("simple", "3", "UNAVAILABLE"))
    registry = StaticRegistry([onnx, torch], clock=clock)
    await registry.refresh()

    assert registry.ready_versions("simple") == frozenset({"1", "2"})
    assert registry.ready_versions("torchy") == frozenset({"1"})
    assert registry.ready_versions("later") is None
    assert registry.ready_versions("nope") is None


async def test_a_name_two_sidecars_list_belongs_to_the_first_in_configuration_order(clock) -> None:
    first = SidecarStandIn("onnxruntime", "127.0.0.1:9001", [("shared", "1", "UNAVAILABLE")])
    second = SidecarStandIn("pytorch", "127.0.0.1:9002", [("shared", "1", "READY"), ("shared", "2", "READY")])
    registry = StaticRegistry([first, second], clock=clock)
    await registry.refresh()

    assert registry.owner("shared") is first
    # The other sidecar's READY versions are not the owner's: they are not advertised.
    assert registry.ready_versions("shared") is None


async def test_owner_never_asks_the_sidecars(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    assert registry.owner("simple") is None
    assert onnx.index_calls == 0


async def test_find_answers_a_known_model_without_another_index_round(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    await registry.refresh()
    clock.advance(3600)
    assert await registry.find("simple") is onnx
    assert onnx.index_calls == 1


async def test_the_first_lookup_of_a_fresh_registry_asks_the_sidecars_at_once(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    assert await registry.find("simple") is onnx
    assert onnx.index_calls == 1


# --- refresh coalescing ------------------------------------------------------------


async def test_many_concurrent_lookups_of_an_unknown_model_share_one_index_round(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    onnx.gate = torch.gate = asyncio.Event()
    lookups = [asyncio.ensure_future(registry.find("torchy")) for _ in range(50)]
    await let_tasks_run()
    assert (onnx.index_calls, torch.index_calls) == (1, 1)
    assert not any(lookup.done() for lookup in lookups)

    onnx.gate.set()
    owners = await asyncio.gather(*lookups)

    assert owners == [torch] * 50
    assert (onnx.index_calls, torch.index_calls) == (1, 1)


async def test_concurrent_lookups_of_different_unknown_models_share_one_index_round(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    onnx.gate = torch.gate = asyncio.Event()
    lookups = [asyncio.ensure_future(registry.find(name)) for name in ("simple", "torchy", "nope") * 10]
    await let_tasks_run()
    onnx.gate.set()
    owners = await asyncio.gather(*lookups)

    assert owners == [onnx, torch, None] * 10
    assert (onnx.index_calls, torch.index_calls) == (1, 1)


async def test_an_explicit_refresh_during_a_lookups_round_waits_for_it_then_reads_again(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.gate = asyncio.Event()
    lookup = asyncio.ensure_future(registry.find("simple"))
    refresh = asyncio.ensure_future(registry.refresh())
    await let_tasks_run()
    onnx.gate.set()
    await asyncio.gather(lookup, refresh)

    assert lookup.result() is onnx
    assert onnx.index_calls == 2  # the lookup's round may predate the caller's load


async def test_concurrent_explicit_refreshes_after_a_round_share_the_next_one(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.gate = asyncio.Event()
    lookup = asyncio.ensure_future(registry.find("simple"))
    await let_tasks_run()
    refreshes = [asyncio.ensure_future(registry.refresh()) for _ in range(5)]
    await let_tasks_run()
    onnx.gate.set()
    await asyncio.gather(lookup, *refreshes)

    assert onnx.index_calls == 2


async def test_a_cancelled_lookup_does_not_cancel_the_round_the_others_wait_on(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.gate = asyncio.Event()
    gone = asyncio.ensure_future(registry.find("simple"))
    staying = asyncio.ensure_future(registry.find("simple"))
    await let_tasks_run()
    gone.cancel()
    await let_tasks_run()
    onnx.gate.set()

    assert await staying is onnx
    assert gone.cancelled()
    assert onnx.index_calls == 1


async def test_a_round_that_failed_is_not_reused_by_the_next_refresh(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.failure = RuntimeError("a bug, not a sidecar's answer")
    with pytest.raises(RuntimeError):
        await registry.refresh()

    onnx.failure = None
    await registry.refresh()

    assert onnx.index_calls == 2
    assert registry.owner("simple") is onnx


async def test_a_refresh_after_a_cancelled_lookup_asks_the_sidecars_again(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.gate = asyncio.Event()
    lookup = asyncio.ensure_future(registry.find("fresh"))
    await let_tasks_run()
    lookup.cancel()  # a client's deadline passed while the gateway asked the sidecars
    await let_tasks_run()
    onnx.gate.set()
    await let_tasks_run()

    onnx.models.append(("fresh", "1", "READY"))  # then a load made it
    await registry.refresh()

    assert onnx.index_calls == 2
    assert registry.owner("fresh") is onnx


async def test_a_refresh_after_a_load_does_not_reuse_a_round_that_began_before_the_load(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    onnx.gate = asyncio.Event()
    miss = asyncio.ensure_future(registry.find("fresh"))  # a request for it, before the load
    await let_tasks_run()

    onnx.models.append(("fresh", "1", "READY"))  # the load completes on the sidecar
    after_load = asyncio.ensure_future(registry.refresh())
    await let_tasks_run()
    onnx.gate.set()
    await asyncio.gather(miss, after_load)

    assert registry.owner("fresh") is onnx


# --- rate limit on misses ----------------------------------------------------------


async def test_an_unknown_model_within_the_minimum_interval_does_not_refresh_again(onnx, clock) -> None:
    registry = StaticRegistry([onnx], min_refresh_interval=1.0, clock=clock)
    assert await registry.find("fresh") is None
    onnx.models.append(("fresh", "1", "READY"))

    clock.advance(0.5)
    assert await registry.find("fresh") is None
    clock.advance(0.49)
    assert await registry.find("other") is None
    assert onnx.index_calls == 1


async def test_an_unknown_model_once_the_minimum_interval_has_passed_refreshes(onnx, clock) -> None:
    registry = StaticRegistry([onnx], min_refresh_interval=1.0, clock=clock)
    assert await registry.find("fresh") is None
    onnx.models.append(("fresh", "1", "READY"))

    clock.advance(1.0)
    assert await registry.find("fresh") is onnx
    assert onnx.index_calls == 2


async def test_the_interval_counts_from_the_latest_round_of_any_kind(onnx, clock) -> None:
    registry = StaticRegistry([onnx], min_refresh_interval=1.0, clock=clock)
    await registry.refresh()
    clock.advance(0.9)
    await registry.refresh()  # after a load, say
    clock.advance(0.9)
    assert await registry.find("nope") is None
    assert onnx.index_calls == 2
    clock.advance(0.1)
    assert await registry.find("nope") is None
    assert onnx.index_calls == 3


async def test_a_miss_within_the_interval_still_joins_a_round_in_flight(onnx, clock) -> None:
    registry = StaticRegistry([onnx], min_refresh_interval=1.0, clock=clock)
    await registry.refresh()
    clock.advance(0.1)
    onnx.models.append(("fresh", "1", "READY"))
    onnx.gate = asyncio.Event()
    after_load = asyncio.ensure_future(registry.refresh())
    await let_tasks_run()

    miss = asyncio.ensure_future(registry.find("fresh"))
    await let_tasks_run()
    assert not miss.done()  # it waits for the round rather than answering from the old one
    onnx.gate.set()

    assert await miss is onnx
    await after_load
    assert onnx.index_calls == 2


async def test_a_refresh_is_never_rate_limited(onnx, clock) -> None:
    registry = StaticRegistry([onnx], min_refresh_interval=60.0, clock=clock)
    for _ in range(3):
        await registry.refresh()
    assert onnx.index_calls == 3


# --- after loads and unloads -------------------------------------------------------


async def test_a_refresh_after_a_load_learns_the_new_model_and_its_ready_version(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    await registry.refresh()
    assert registry.ready_versions("later") is None

    torch.models = [("torchy", "1", "READY"), ("later", "1", "READY")]
    onnx.models.append(("uploaded", "1", "READY"))
    await registry.refresh()

    assert registry.ready_versions("later") == frozenset({"1"})
    assert registry.owner("uploaded") is onnx
    assert registry.ready_versions("uploaded") == frozenset({"1"})


async def test_a_refresh_after_an_unload_keeps_the_owner_but_not_the_ready_version(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    await registry.refresh()

    onnx.models = [("simple", "1", "UNAVAILABLE"), ("simple", "2", "READY")]
    await registry.refresh()
    assert registry.owner("simple") is onnx
    assert registry.ready_versions("simple") == frozenset({"2"})

    onnx.models = [("simple", "1", "UNAVAILABLE"), ("simple", "2", "UNAVAILABLE")]
    await registry.refresh()
    assert registry.owner("simple") is onnx
    assert registry.ready_versions("simple") is None


async def test_a_model_no_index_lists_any_more_has_no_owner(onnx, clock) -> None:
    registry = StaticRegistry([onnx], clock=clock)
    await registry.refresh()
    onnx.models = []  # its folder was removed from the repository
    await registry.refresh()
    assert registry.owner("simple") is None


async def test_a_sidecar_that_does_not_answer_keeps_the_models_it_owned(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    await registry.refresh()

    onnx.failure = TurnoutError(Status.UNAVAILABLE, "failed to connect to all addresses")
    torch.models = [("torchy", "1", "READY"), ("newer", "1", "READY")]
    await registry.refresh()

    assert registry.owner("simple") is onnx
    assert registry.owner("newer") is torch  # the others' changes still count


# --- placement and framework_of_load -----------------------------------------------


async def test_a_load_goes_to_the_owner_first(onnx, torch, clock) -> None:
    registry = StaticRegistry([onnx, torch], clock=clock)
    await registry.refresh()
    # The owner wins over a file that names another framework.
    assert registry.placement("torchy", {"file:1/model.onnx": b"..."}) is torch


def test_a_load_of_an_unlisted_model_goes_to_the_framework_its_parameters_name(onnx, torch) -> None:
    registry = StaticRegistry([onnx, torch])
    assert registry.placement("fresh", {"config": '{"backend": "pytorch"}'}) is torch
    assert registry.placement("fresh", {"file:1/model.onnx": b"..."}) is onnx


def test_a_load_naming_no_framework_goes_to_the_first_sidecar(onnx, torch) -> None:
    registry = StaticRegistry([torch, onnx])
    assert registry.placement("fresh", {}) is torch
    assert registry.placement("fresh", {"file:1/model.plan": b"..."}) is torch  # no tensorrt sidecar
    assert StaticRegistry([]).placement("fresh", {}) is None


@pytest.mark.parametrize(
    ("parameters", "framework"),
    [
        ({"config": '{"platform": "onnxruntime_onnx"}'}, "onnxruntime"),
        ({"config": '{"backend": "pytorch"}'}, "pytorch"),
        ({"config": '{"platform": "tensorrt_plan", "backend": "pytorch"}'}, "tensorrt"),
        ({"config": '{"platform": "custom", "backend": "onnxruntime"}'}, "onnxruntime"),
        ({"config": '{"platform": "ensemble"}'}, "ensemble"),
        ({"config": '{"platform": "onnxruntime_onnx"}', "file:1/model.pt": b"..."}, "onnxruntime"),
        ({"config": '{"max_batch_size": 8}', "file:1/model.pt": b"..."}, "pytorch"),
        ({"config": "not json", "file:2/model.plan": b"..."}, "tensorrt"),
        ({"config": '["a", "list"]', "file:1/model.pt2": b"..."}, "pytorch"),
        ({"config": b'{"platform": "onnxruntime_onnx"}'}, None),
        ({"file:1/weights.bin": b"...", "file:1/model.onnx": b"..."}, "onnxruntime"),
        ({"file:1/weights.bin": b"..."}, None),
        ({"model.onnx": b"..."}, None),
        ({}, None),
    ],
)
def test_framework_of_load_reads_the_config_override_then_uploaded_files(parameters, framework) -> None:
    assert framework_of_load(parameters) == framework


# --- readiness -----------------------------------------------------------------------


@virtual_time
async def test_the_watch_polls_each_sidecars_readiness(onnx, torch) -> None:
    registry = StaticRegistry([onnx, torch])
    assert not registry.health.synced
    watch = asyncio.ensure_future(registry.watch())
    try:
        assert await registry.wait_first(1.0)

        def reasons(strict: bool = True) -> list[str]:
            return unready_reasons(registry.health, strict=strict, need_replica=False)

        assert reasons() == []
        await asyncio.sleep(READY_POLL_SECS / 2)  # from here, each step ends between two polls
        torch.ready = False  # a model failed to load there
        await asyncio.sleep(READY_POLL_SECS)
        assert reasons() == ["the pytorch sidecar at 127.0.0.1:9002 is not ready"]
        assert reasons(strict=False) == []
        torch.ready = None  # killed; `turnout up` restarts it
        await asyncio.sleep(READY_POLL_SECS)
        assert reasons() == ["the pytorch sidecar at 127.0.0.1:9002 does not answer"]
        calls = torch.index_calls
        torch.ready = True
        await asyncio.sleep(READY_POLL_SECS)
        assert reasons() == []
        assert torch.index_calls == calls + 1  # its models read again after the restart
    finally:
        watch.cancel()


async def test_no_sidecar_at_all_is_synced_and_ready() -> None:
    registry = StaticRegistry([])
    assert await registry.wait_first(0.0)
    assert unready_reasons(registry.health, strict=True, need_replica=False) == []
