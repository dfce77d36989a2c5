"""DynamicBatcher's batch formation and timing on virtual time: max_batch_size, preferred
sizes, max_queue_delay_microseconds, the bounded queue, queue policies (REJECT, DELAY,
per-request timeouts), priority levels, shapes that cannot share a batch, batches that
wait for a busy instance (and grow, and merge), ordering, cancellation, failures and
close. Each test drives the batcher in process through its `clock` seam. Where a test
says "Triton 2.51 ran ...", the same scenario, scaled to seconds, was run on Triton 2.51
with a python-backend model under the same dynamic_batching section and one instance."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from protos.statistics import VersionStatistics
from protos.status import Status
from protos.validation import Signature, ValidRequest
from sidecars.batcher import BackendFailure, DynamicBatcher
from sidecars.runtime import RUN_WINDOW, Tensors, ThreadedInstance
from tests.unit.sidecars.model_stand_in import Call, RecordingInstance, infer_request, model_config, until_us
from tests.unit.virtual_loop import virtual_ns, virtual_time, virtual_us

MODEL = """
name: "doubler"
max_batch_size: {max_batch_size}
input [{{ name: "INPUT0" data_type: TYPE_INT32 dims: [-1] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [-1] }}]
"""


def double(inputs: Tensors) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"] * 2}


class Model:
    """A DynamicBatcher over recording instances (one per `runs_for_us` entry), and a
    client whose requests fill every element with the request's number."""

    def __init__(
        self,
        batching: str | None,
        *,
        max_batch_size: int = 8,
        runs_for_us: tuple[int, ...] = (0,),
        fails_with: str = "",
        instances: list[RecordingInstance] | None = None,
    ) -> None:
        text = MODEL.format(max_batch_size=max_batch_size)
        if batching is not None:
            text += f"dynamic_batching {{ {batching} }}"
        config = model_config(text)
        self.signature = Signature(config)
        self.instances = instances or [RecordingInstance(double, us, fails_with) for us in runs_for_us]
        self.batcher = DynamicBatcher(config, self.instances, VersionStatistics(), clock=virtual_ns)

    def send(
        self,
        number: int,
        *,
        rows: int = 1,
        length: int = 1,
        request_id: str = "",
        priority: int = 0,
        timeout_us: int | None = None,
    ) -> Call:
        values = [[number] * length for _ in range(rows)]
        request = infer_request(
            self.signature, "INPUT0", values, request_id=request_id, priority=priority, timeout_us=timeout_us
        )
        return Call.start(self.batcher.submit(request))

    def batches(self) -> list[tuple[int, list[int]]]:
        """Every batch any instance ran, by time: (virtual µs, the request number of each row)."""
        runs = sorted((run for instance in self.instances for run in instance.runs), key=lambda run: run.at_us)
        return [(run.at_us, run.inputs["INPUT0"][:, 0].tolist()) for run in runs]


async def outputs_of(call: Call) -> list[list[int]]:
    return (await call.result()).outputs["OUTPUT0"].tolist()  # type: ignore[no-any-return]


# -- the queue delay -----------------------------------------------------------------------


@virtual_time
async def test_a_lone_request_waits_exactly_the_queue_delay_then_runs() -> None:
    model = Model("max_queue_delay_microseconds: 1000")
    await until_us(250)
    call = model.send(7)
    result = await call.result()
    assert model.batches() == [(1250, [7])]
    assert result.queue_ns == 1_000_000
    assert result.outputs["OUTPUT0"].tolist() == [[14]]


@virtual_time
async def test_requests_arriving_within_the_delay_join_one_batch_and_each_gets_its_own_rows_back() -> None:
    model = Model("max_queue_delay_microseconds: 1000")
    first = model.send(1)
    await until_us(300)
    second = model.send(2, rows=2)
    await until_us(600)
    third = model.send(3)
    assert await outputs_of(first) == [[2]]
    assert await outputs_of(second) == [[4], [4]]
    assert await outputs_of(third) == [[6]]
    assert model.batches() == [(1000, [1, 2, 2, 3])]


@virtual_time
async def test_a_request_arriving_after_the_delay_starts_the_next_batch() -> None:
    model = Model("max_queue_delay_microseconds: 1000")
    first = model.send(1)
    await until_us(1500)
    second = model.send(2)
    await asyncio.gather(first.result(), second.result())
    assert model.batches() == [(1000, [1]), (2500, [2])]


@virtual_time
async def test_without_a_queue_delay_what_is_queued_runs_at_once() -> None:
    model = Model("")
    calls = [model.send(n) for n in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2, 3])]


@virtual_time
async def test_without_dynamic_batching_every_request_runs_alone() -> None:
    model = Model(None)
    calls = [model.send(n) for n in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1]), (0, [2]), (0, [3])]


# -- batch sizes ---------------------------------------------------------------------------


@virtual_time
async def test_max_batch_size_caps_a_batch() -> None:
    model = Model("", max_batch_size=4)
    calls = [model.send(n) for n in range(1, 11)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2, 3, 4]), (0, [5, 6, 7, 8]), (0, [9, 10])]


@virtual_time
async def test_a_request_whose_rows_do_not_fit_waits_for_the_next_batch() -> None:
    model = Model("", max_batch_size=4)
    calls = [model.send(1, rows=3), model.send(2, rows=3), model.send(3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 1, 1]), (0, [2, 2, 2, 3])]


@virtual_time
async def test_a_queue_that_fills_max_batch_size_runs_at_once_without_waiting_the_delay() -> None:
    model = Model("max_queue_delay_microseconds: 10000", max_batch_size=4)
    calls = [model.send(n) for n in (1, 2, 3, 4, 5)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2, 3, 4]), (10000, [5])]


@virtual_time
async def test_a_queue_that_reaches_a_preferred_size_runs_at_once() -> None:
    model = Model("preferred_batch_size: [2, 4] max_queue_delay_microseconds: 10000")
    first = model.send(1)
    await until_us(100)
    second = model.send(2)
    await until_us(200)
    third = model.send(3)
    await asyncio.gather(first.result(), second.result(), third.result())
    assert model.batches() == [(100, [1, 2]), (10200, [3])]


@virtual_time
async def test_a_batch_is_cut_back_to_the_largest_preferred_size_it_can_form() -> None:
    model = Model("preferred_batch_size: [2, 4]")
    calls = [model.send(n) for n in range(1, 8)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2, 3, 4]), (0, [5, 6]), (0, [7])]


@virtual_time
async def test_a_preferred_size_at_the_head_of_the_queue_runs_at_once_even_with_more_requests_behind_it() -> None:
    model = Model("preferred_batch_size: [2, 4] max_queue_delay_microseconds: 1000")
    calls = [model.send(n) for n in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2]), (1000, [3])]


@virtual_time
async def test_a_queue_beyond_the_largest_preferred_size_runs_what_fits_it_at_once() -> None:
    model = Model("preferred_batch_size: [4] max_queue_delay_microseconds: 1000")
    calls = [model.send(1, rows=3), model.send(2, rows=3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 1, 1]), (1000, [2, 2, 2])]


@virtual_time
async def test_requests_held_back_from_what_fits_the_largest_preferred_size_wait_their_own_whole_delay() -> None:
    model = Model("preferred_batch_size: [4] max_queue_delay_microseconds: 1000")
    first = model.send(1, rows=3)
    await until_us(300)
    second = model.send(2, rows=3)  # 6 rows would pass 4: the first goes now
    await asyncio.gather(first.result(), second.result())
    # Triton 2.51 (seconds for µs): the first at the second's arrival, the second a whole delay later.
    assert model.batches() == [(300, [1, 1, 1]), (1300, [2, 2, 2])]


@pytest.mark.parametrize(
    ("delay_us", "expected"),
    [(1000, [(0, [0, 0]), (5000, [1, 2, 3])]), (10000, [(0, [0, 0]), (5000, [1, 2]), (10100, [3])])],
    ids=["delay-passed", "within-delay"],
)
@virtual_time
async def test_once_the_delay_has_passed_the_whole_pending_batch_goes_not_just_a_preferred_size(
    delay_us: int, expected: list[tuple[int, list[int]]]
) -> None:
    # Priority levels: nothing is formed before the busy instance frees.
    model = Model(
        f"preferred_batch_size: [2] max_queue_delay_microseconds: {delay_us} priority_levels: 2",
        runs_for_us=(5000,),
    )
    calls = [model.send(0), model.send(0)]
    await until_us(100)
    calls += [model.send(n) for n in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    # Triton 2.51, its delay passed, ran [1, 2, 3] together; within the delay, [1, 2] then [3].
    assert model.batches() == expected


# -- batches waiting for a busy instance ------------------------------------------------------


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ("", [(0, [0, 0]), (1000, [1, 2, 3])]),
        ("priority_levels: 2 default_priority_level: 1", [(0, [0, 0]), (1000, [1, 2]), (10500, [3])]),
        ("default_queue_policy { max_queue_size: 8 }", [(0, [0, 0]), (1000, [1, 2]), (10500, [3])]),
    ],
    ids=["formed-ahead", "priority-levels", "queue-policy"],
)
@virtual_time
async def test_a_batch_formed_for_a_busy_instance_keeps_growing_until_the_instance_starts_it(
    levels: str, expected: list[tuple[int, list[int]]]
) -> None:
    model = Model(f"preferred_batch_size: [2] max_queue_delay_microseconds: 10000 {levels}", runs_for_us=(1000,))
    calls = [model.send(0), model.send(0)]
    for at_us, number in ((300, 1), (400, 2), (500, 3)):
        await until_us(at_us)
        calls.append(model.send(number))
    await asyncio.gather(*(call.result() for call in calls))
    # Triton 2.51 ran [1, 2, 3] together, past the preferred size, where it forms batches
    # ahead of a busy instance (no priority levels, no queue policy); with priority levels
    # it ran [1, 2] at once and [3] after its delay. A queue policy turns prefetching off
    # the same way in core (PriorityQueue::SupportPrefetching).
    assert model.batches() == expected


@virtual_time
async def test_an_instance_merges_waiting_batches_whose_delay_has_passed_into_the_one_it_starts() -> None:
    model = Model("preferred_batch_size: [2] max_queue_delay_microseconds: 500", runs_for_us=(3000,))
    calls = [model.send(0), model.send(0)]
    for at_us, numbers in ((100, (1, 2)), (200, (3,)), (300, (4,)), (1400, (5,)), (1500, (6,))):
        await until_us(at_us)
        calls += [model.send(number) for number in numbers]
    await asyncio.gather(*(call.result() for call in calls))
    # [1, 2, 3] and [4] wait as two batches (two per instance at most, so 5 and 6 wait in
    # the queue); [4]'s delay has passed when the instance starts [1, 2, 3], so it joins.
    # Triton 2.51 ran [0, 0], [1, 2, 3, 4], [5, 6].
    assert model.batches() == [(0, [0, 0]), (3000, [1, 2, 3, 4]), (6000, [5, 6])]


class Watched(RecordingInstance):
    """A RecordingInstance that notes, one turn of the loop after its first batch ends,
    how many batches it has started."""

    def __init__(self, runs_for_us: int) -> None:
        super().__init__(double, runs_for_us)
        self.started_a_turn_after_the_first: int | None = None

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        outputs = await super().execute(inputs)
        if len(self.runs) == 1:
            asyncio.get_running_loop().call_soon(self._note)
        return outputs

    def _note(self) -> None:
        self.started_a_turn_after_the_first = len(self.runs)


@virtual_time
async def test_an_instance_that_frees_up_starts_what_is_queued_in_the_same_turn_of_the_loop() -> None:
    # A queue policy keeps [1] in the queue while the instance is busy (no batch formed
    # ahead). The instance asking for work forms its next batch itself, rather than
    # waking the scheduler and waiting a turn for it and another for the offer.
    watched = Watched(1000)
    model = Model("default_queue_policy { max_queue_size: 8 }", instances=[watched])
    first = model.send(0)
    await until_us(500)
    second = model.send(1)
    await asyncio.gather(first.result(), second.result())
    assert model.batches() == [(0, [0]), (1000, [1])]
    assert watched.started_a_turn_after_the_first == 2


# -- the bounded queue -----------------------------------------------------------------------
# A queue delay keeps requests queued here: Triton also moves up to two batches per
# instance out of its queue ahead of a busy instance (prefetching), where neither queue
# limits nor queue timeouts apply any more, so these tests never rely on a busy instance.


@virtual_time
async def test_a_full_queue_fails_with_unavailable_and_tritons_text() -> None:
    model = Model("max_queue_delay_microseconds: 1000 default_queue_policy { max_queue_size: 2 }")
    queued = [model.send(1), model.send(2)]
    refused = model.send(3, request_id="three")
    anonymous = model.send(4)
    await until_us(10)
    assert model.batcher.pending == 2
    for call, prefix in ((refused, "[request id: three]"), (anonymous, "[request id: <id_unknown>]")):
        error = await call.error()
        assert error.status is Status.UNAVAILABLE
        assert error.message == f"{prefix} Exceeds maximum queue size"
    await asyncio.gather(*(call.result() for call in queued))
    assert model.batches() == [(1000, [1, 2])]
    await model.send(5).result()  # room again once the queue drained


@virtual_time
async def test_each_priority_level_has_its_own_queue_limit() -> None:
    model = Model(
        "max_queue_delay_microseconds: 1000 priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { max_queue_size: 1 } }"
    )
    first_level = [model.send(1, priority=1), model.send(2, priority=1)]
    second_level = [model.send(3, priority=2), model.send(4, priority=2)]
    assert (await first_level[1].error()).message == "[request id: <id_unknown>] Exceeds maximum queue size"
    await asyncio.gather(first_level[0].result(), *(call.result() for call in second_level))
    assert model.batches() == [(1000, [1, 3, 4])]


# -- queue policies and timeouts -------------------------------------------------------------


@virtual_time
async def test_a_request_is_rejected_exactly_when_its_queue_timeout_passes() -> None:
    model = Model(
        "max_queue_delay_microseconds: 5000 "
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 }"
    )
    waiting = model.send(1)
    error = await waiting.error()
    assert (error.status, error.message) == (Status.UNAVAILABLE, "Request timeout expired")
    assert waiting.done_us == 1000
    assert model.batcher.pending == 0
    await until_us(10000)
    assert model.batches() == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("timeout_action: DELAY default_timeout_microseconds: 1000", [2, 1]), ("", [1, 2])],
    ids=["delay-after-timeout", "no-timeout"],
)
@virtual_time
async def test_a_request_that_times_out_under_delay_is_served_after_the_requests_that_did_not(
    policy: str, expected: list[int]
) -> None:
    model = Model(f"max_queue_delay_microseconds: 5000 default_queue_policy {{ {policy} }}", max_batch_size=2)
    first = model.send(1)  # under DELAY, times out at 1000 and stays queued
    await until_us(2000)
    second = model.send(2)  # fills the batch: it runs at once
    assert await outputs_of(first) == [[2]]
    assert await outputs_of(second) == [[4]]
    assert model.batches() == [(2000, expected)]


@pytest.mark.parametrize(
    ("policy", "timeout_us", "rejected_at_us"),
    [
        ("allow_timeout_override: true default_timeout_microseconds: 10000", 1000, 1000),
        ("allow_timeout_override: true default_timeout_microseconds: 10000", 50000, 10000),
        ("allow_timeout_override: false default_timeout_microseconds: 10000", 1000, 10000),
        ("allow_timeout_override: true", 1000, None),
    ],
    ids=["shorter-override", "longer-override-ignored", "override-not-allowed", "no-default-timeout"],
)
@virtual_time
async def test_a_requests_own_timeout_applies_only_when_allowed_and_shorter_than_the_default(
    policy: str, timeout_us: int, rejected_at_us: int | None
) -> None:
    model = Model(f"max_queue_delay_microseconds: 20000 default_queue_policy {{ {policy} }}")
    waiting = model.send(1, timeout_us=timeout_us)
    if rejected_at_us is None:
        await waiting.result()
        assert model.batches() == [(20000, [1])]
    else:
        assert (await waiting.error()).message == "Request timeout expired"
        assert waiting.done_us == rejected_at_us


# -- priorities ----------------------------------------------------------------------------


@virtual_time
async def test_higher_priority_levels_run_first_and_unknown_levels_take_the_default() -> None:
    model = Model("priority_levels: 2 default_priority_level: 2", max_batch_size=2)
    # All queued before the batcher looks (Triton's TRITONSERVER_DELAY_SCHEDULER test setup).
    calls = [model.send(n, priority=p) for n, p in ((1, 2), (2, 2), (3, 1), (4, 0), (5, 9), (6, 1))]
    await asyncio.gather(*(call.result() for call in calls))
    # Priority 0 and priorities above priority_levels go to the default level (2).
    assert model.batches() == [(0, [3, 6]), (0, [1, 2]), (0, [4, 5])]


@virtual_time
async def test_a_levels_requests_delayed_by_their_timeout_still_run_before_lower_priority_levels() -> None:
    model = Model(
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 1000 } }",
        max_batch_size=1,
        runs_for_us=(5000,),
    )
    calls = [model.send(n, priority=2) for n in (1, 2, 3)]
    await until_us(10)
    calls += [model.send(4, priority=1), model.send(5, priority=2)]  # 4 is delayed at 1010
    await asyncio.gather(*(call.result() for call in calls))
    # With priority levels nothing is formed ahead of a busy instance: when it frees, level
    # 1's delayed request comes before level 2. Triton 2.51 ran [1], [4], [2], [3], [5].
    assert model.batches() == [(0, [1]), (5000, [4]), (10000, [2]), (15000, [3]), (20000, [5])]


# -- shapes -------------------------------------------------------------------------------


@virtual_time
async def test_requests_whose_shapes_differ_never_share_a_batch() -> None:
    model = Model("max_queue_delay_microseconds: 1000", runs_for_us=(100,))
    lengths = {1: 1, 2: 2, 3: 1, 4: 3, 5: 2, 6: 1}
    calls = {number: model.send(number, length=length) for number, length in lengths.items()}
    for number, call in calls.items():
        assert await outputs_of(call) == [[2 * number] * lengths[number]]
    formed = [run.inputs["INPUT0"] for instance in model.instances for run in instance.runs]
    for batch in formed:
        assert {lengths[number] for number in batch[:, 0].tolist()} == {batch.shape[1]}
    assert sorted(number for batch in formed for number in batch[:, 0].tolist()) == [1, 2, 3, 4, 5, 6]


@virtual_time
async def test_under_preserve_ordering_a_request_of_another_shape_ends_the_batch() -> None:
    model = Model("preserve_ordering: true")
    calls = [model.send(1), model.send(2), model.send(3, length=2), model.send(4)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2]), (0, [3]), (0, [4])]


@virtual_time
async def test_a_request_of_another_shape_ends_the_pending_batch_at_once() -> None:
    model = Model("max_queue_delay_microseconds: 1000")
    calls = [model.send(1), model.send(2, length=2), model.send(3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1]), (0, [2]), (1000, [3])]


@virtual_time
async def test_requests_cut_back_from_a_preferred_batch_stay_ahead_of_later_requests_of_another_shape() -> None:
    model = Model("preferred_batch_size: [2]")
    calls = [model.send(1), model.send(2), model.send(3), model.send(4, length=2), model.send(5)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [1, 2]), (0, [3]), (0, [4]), (0, [5])]


@virtual_time
async def test_a_batch_never_takes_a_request_from_behind_an_older_one_of_another_shape() -> None:
    model = Model("preferred_batch_size: [2]", runs_for_us=(1000,))
    calls = [model.send(0, length=5)]  # keeps the instance busy while the others queue
    for at_us, number, length in ((300, 1, 1), (400, 2, 2), (500, 3, 1), (600, 4, 1)):
        await until_us(at_us)
        calls.append(model.send(number, length=length))
    await asyncio.gather(*(call.result() for call in calls))
    # Triton 2.51 ran [0], [1], [2], [3, 4]: 1 and 3 never share a batch past 2.
    assert model.batches() == [(0, [0]), (1000, [1]), (2000, [2]), (3000, [3, 4])]


# -- instances, ordering, cancellation, failures, close ---------------------------------------


@pytest.mark.parametrize(("preserve_ordering", "second_done_us"), [(True, 5000), (False, 110)])
@virtual_time
async def test_preserve_ordering_holds_a_later_batchs_results_until_earlier_batches_are_answered(
    preserve_ordering: bool, second_done_us: int
) -> None:
    batching = f"preserve_ordering: {str(preserve_ordering).lower()}"
    model = Model(batching, runs_for_us=(5000, 100))
    first = model.send(1)
    await until_us(10)
    second = model.send(2)  # on the second instance, while the first one is busy
    await asyncio.gather(first.result(), second.result())
    assert [run.at_us for run in model.instances[1].runs] == [10]
    assert (first.done_us, second.done_us) == (5000, second_done_us)


@virtual_time
async def test_a_request_cancelled_while_queued_never_reaches_the_instance() -> None:
    model = Model("max_queue_delay_microseconds: 1000")
    calls = [model.send(1), model.send(2), model.send(3)]
    await until_us(10)
    calls[1].task.cancel()
    await asyncio.gather(calls[0].result(), calls[2].result())
    assert model.batches() == [(1000, [1, 3])]
    assert model.batcher.pending == 0


@virtual_time
async def test_a_framework_failure_fails_every_request_of_its_batch_as_internal() -> None:
    model = Model("", fails_with="out of memory")
    calls = [model.send(1), model.send(2)]
    for call in calls:
        error = await call.error()
        assert (error.status, error.message) == (Status.INTERNAL, "out of memory")
    later = model.send(3)  # the worker survived the failure
    assert (await later.error()).message == "out of memory"
    assert model.batches() == [(0, [1, 2]), (0, [3])]


@virtual_time
async def test_close_runs_what_is_queued_then_refuses_new_requests_and_closes_the_instances() -> None:
    model = Model("max_queue_delay_microseconds: 100000")
    calls = [model.send(1), model.send(2)]
    await until_us(10)
    await model.batcher.close()
    assert [await outputs_of(call) for call in calls] == [[[2]], [[4]]]
    assert model.batches() == [(10, [1, 2])]  # closing does not wait out the queue delay
    error = await model.send(3).error()
    assert (error.status, error.message) == (Status.UNAVAILABLE, "Server exiting")
    assert all(instance.closed for instance in model.instances)
    assert virtual_us() == 10


# -- an instance-group update --------------------------------------------------------------


@virtual_time
async def test_an_added_instance_takes_batches_at_once() -> None:
    model = Model(None, runs_for_us=(1000,))
    added = RecordingInstance(double, 1000)
    await model.batcher.update_instances([added], [])
    calls = [model.send(number) for number in (1, 2)]
    assert [await outputs_of(call) for call in calls] == [[[2]], [[4]]]
    assert [len(instance.runs) for instance in (*model.instances, added)] == [1, 1]  # side by side
    assert virtual_us() == 1000
    assert model.batcher.instance_count == 2


@virtual_time
async def test_a_removed_instance_finishes_its_batch_takes_no_other_and_is_closed() -> None:
    busy, idle = RecordingInstance(double, 1000), RecordingInstance(double, 1000)
    model = Model(None, instances=[busy, idle])
    first = model.send(1)
    await until_us(10)  # `busy` or `idle` runs [1]; the other waits
    running = busy if busy.runs else idle
    waiting = idle if running is busy else busy
    update = asyncio.create_task(model.batcher.update_instances([], [running, waiting]))
    await until_us(20)
    assert waiting.closed and not running.closed  # the idle one goes at once
    added = RecordingInstance(double, 1000)
    await model.batcher.update_instances([added], [])
    later = model.send(2)
    assert await outputs_of(first) == [[2]] and await outputs_of(later) == [[4]]
    await update
    assert running.closed
    assert (len(running.runs), len(waiting.runs), len(added.runs)) == (1, 0, 1)
    assert model.batcher.instance_count == 1
    await model.batcher.close()
    assert added.closed


# -- run_now: a request handed straight to an idle instance that runs inline ---------------


class Inline(ThreadedInstance):
    """`double` as a ThreadedInstance, so it runs inline once a window of runs shows it fast."""

    def __init__(self, fails_with: str = "") -> None:
        super().__init__("inline")
        self.fails_with = fails_with
        self.threads: list[int] = []

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        if self.fails_with:
            raise RuntimeError(self.fails_with)
        return double(inputs)


async def _inline_batcher(batching: str | None = None, fails_with: str = "") -> tuple[DynamicBatcher, Inline, Model]:
    """A batcher over one Inline instance, measured fast (inline) by a window of runs."""
    model = Model(batching)
    instance = Inline()
    for _ in range(RUN_WINDOW):
        await instance.execute({"INPUT0": np.zeros((1, 1), np.int32)})
    assert instance.inline
    instance.fails_with = fails_with
    config = model_config(MODEL.format(max_batch_size=8) + (f"dynamic_batching {{ {batching} }}" if batching else ""))
    model.batcher = DynamicBatcher(config, [instance], VersionStatistics())
    await asyncio.sleep(0)  # its worker starts and waits for a batch
    return model.batcher, instance, model


def _request(model: Model, number: int) -> ValidRequest:
    return infer_request(model.signature, "INPUT0", [[number]])


async def test_without_dynamic_batching_a_request_runs_at_once_on_an_idle_inline_instance() -> None:
    batcher, instance, model = await _inline_batcher()
    request = _request(model, 4)
    result = batcher.run_now(request)
    assert result is not None and result.outputs["OUTPUT0"].tolist() == [[8]]
    assert instance.threads[-1] == threading.get_ident()  # on the event loop
    assert request.queued  # a model saw it: a failure now counts as Triton counts it
    assert (result.queue_ns, result.times.size) == (0, 1)
    assert batcher._stats.execution_count == 1 and batcher._stats.inference_count == 1
    await batcher.close()


async def test_run_now_declines_where_the_queue_must_decide_and_changes_nothing() -> None:
    # Dynamic batching: Triton's scheduler may wait for company, so the queue decides.
    batcher, _, model = await _inline_batcher("max_queue_delay_microseconds: 100")
    request = _request(model, 1)
    assert batcher.run_now(request) is None and not request.queued
    await batcher.close()
    # A request already queued goes first.
    batcher, _, model = await _inline_batcher()
    queued = asyncio.ensure_future(batcher.submit(_request(model, 1)))
    await asyncio.sleep(0)
    assert batcher.run_now(_request(model, 2)) is None
    assert (await queued).outputs["OUTPUT0"].tolist() == [[2]]
    assert batcher._stats.execution_count == 1
    await batcher.close()
    # A model not (yet) measured fast runs on its thread, through the queue.
    slow = Model(None)
    unmeasured = Inline()
    batcher = DynamicBatcher(model_config(MODEL.format(max_batch_size=8)), [unmeasured], VersionStatistics())
    await asyncio.sleep(0)
    assert batcher.run_now(_request(slow, 1)) is None
    await batcher.close()
    # Closing: refused by submit, in Triton's words.
    batcher, _, model = await _inline_batcher()
    await batcher.close()
    assert batcher.run_now(_request(model, 1)) is None


async def test_a_failure_at_once_is_the_backends() -> None:
    batcher, _, model = await _inline_batcher(fails_with="out of memory")
    with pytest.raises(BackendFailure) as caught:
        batcher.run_now(_request(model, 1))
    assert (caught.value.status, caught.value.message) == (Status.INTERNAL, "out of memory")
    assert batcher._stats.execution_count == 0
    await batcher.close()
