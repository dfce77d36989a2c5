"""SequenceBatcher's slots, backlog, idle reaper and batch formation on virtual time: a
START binds a sequence to a free slot and its later requests (and its implicit state)
stay there, END frees the slot, a sequence that finds every slot taken waits in the
backlog, max_sequence_idle_microseconds releases an idle sequence's slot, Triton's texts
for requests that break the sequence rules, and the direct and oldest strategies (oldest
forms batches by the dynamic batcher's rules, counting a request's queue delay from when
it could first run: its arrival, or when its sequence's previous request finished or its
backlogged sequence got a slot)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from protos.statistics import VersionStatistics
from protos.status import Cause, Status, TurnoutError
from protos.validation import Signature
from sidecars.runtime import Tensors
from sidecars.sequence import SequenceBatcher
from sidecars.sequence_config import SequenceTensors
from tests.unit.sidecars.model_stand_in import Call, RecordingInstance, infer_request, model_config, until_us
from tests.unit.virtual_loop import virtual_ns, virtual_time

MODEL = """
name: "accumulate"
max_batch_size: {max_batch_size}
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }}]
sequence_batching {{
  max_sequence_idle_microseconds: 5000
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }}] }},
    {{ name: "END" control [{{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }}] }},
    {{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }}] }}
  ]
  state [{{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [1] }}]
  {strategy}
}}
"""


def accumulate(inputs: Tensors) -> dict[str, np.ndarray]:
    """A running sum per sequence, kept in the implicit state."""
    total = inputs["STATE_IN"] + inputs["INPUT"]
    return {"OUTPUT": total, "STATE_OUT": total}


@dataclass(frozen=True)
class Row:
    """What the model saw in one batch row that READY marked as a real request."""

    sequence: int
    value: int
    start: bool = False
    end: bool = False


class Model:
    """A SequenceBatcher over recording instances (one per `runs_for_us` entry)."""

    def __init__(
        self, strategy: str = "direct { }", *, max_batch_size: int = 2, runs_for_us: tuple[int, ...] = (0,)
    ) -> None:
        config = model_config(MODEL.format(max_batch_size=max_batch_size, strategy=strategy))
        self.signature = Signature(config)
        self.instances = [RecordingInstance(accumulate, us) for us in runs_for_us]
        tensors = SequenceTensors(config, Path("no-initial-state-files"))
        self.batcher = SequenceBatcher(config, self.instances, VersionStatistics(), tensors, clock=virtual_ns)

    def send(
        self, sequence: int, value: int, *, start: bool = False, end: bool = False, timeout_us: int | None = None
    ) -> Call:
        sequence_flags = (sequence, start, end)
        request = infer_request(self.signature, "INPUT", [[value]], sequence=sequence_flags, timeout_us=timeout_us)
        return Call.start(self.batcher.submit(request))

    def batches(self, instance: int = 0) -> list[tuple[int, list[Row | None]]]:
        """Each batch an instance ran: (virtual µs, its rows in order, None for a filler row)."""
        formed = []
        for run in self.instances[instance].runs:
            rows: list[Row | None] = []
            for position, ready in enumerate(run.inputs["READY"][:, 0].tolist()):
                if not ready:
                    rows.append(None)
                    continue
                flags = {name: bool(run.inputs[name][position, 0]) for name in ("START", "END")}
                sequence, value = int(run.inputs["CORRID"][position, 0]), int(run.inputs["INPUT"][position, 0])
                rows.append(Row(sequence, value, start=flags["START"], end=flags["END"]))
            formed.append((run.at_us, rows))
        return formed


async def output_of(call: Call) -> int:
    return int((await call.result()).outputs["OUTPUT"][0, 0])


# -- slots -------------------------------------------------------------------------------


@virtual_time
async def test_a_start_binds_a_free_slot_and_the_sequences_later_requests_use_the_same_slot() -> None:
    model = Model()
    first = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    later = [model.send(22, 20)]
    await until_us(200)
    later.append(model.send(11, 2))
    assert [await output_of(call) for call in first + later] == [1, 10, 30, 3]  # each slot keeps its own state
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 10, start=True)]),
        (100, [None, Row(22, 20)]),  # slot 0 has nothing to run: a filler row keeps 22 in slot 1
        (200, [Row(11, 2)]),  # rows up to the highest busy slot only
    ]


@virtual_time
async def test_end_releases_the_slot_for_the_next_sequence_which_starts_from_the_initial_state() -> None:
    model = Model()
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    calls.append(model.send(11, 2, end=True))
    await until_us(200)
    calls.append(model.send(33, 5, start=True))
    assert [await output_of(call) for call in calls] == [1, 10, 3, 5]
    assert model.batches()[-1] == (200, [Row(33, 5, start=True)])  # slot 0 again, the lowest free one
    with pytest.raises(TurnoutError, match="must specify the START flag"):
        await model.send(11, 3).result()  # its sequence is over


@virtual_time
async def test_a_sequence_that_finds_every_slot_taken_waits_in_the_backlog_until_one_frees() -> None:
    model = Model()
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    waiting = [model.send(33, 5, start=True), model.send(33, 6)]
    await until_us(1000)
    assert waiting[0].done_us is None
    assert model.batcher.pending == 2
    calls.append(model.send(11, 2, end=True))
    assert [await output_of(call) for call in calls + waiting] == [1, 10, 3, 5, 11]
    assert model.batches()[1:] == [
        (1000, [Row(11, 2, end=True)]),
        (1000, [Row(33, 5, start=True)]),  # 11's slot, with 33's state from the start
        (1000, [Row(33, 6)]),
    ]


@virtual_time
async def test_a_backlogged_sequence_fails_when_its_requests_timeout_passes_before_a_slot_frees() -> None:
    model = Model(max_batch_size=1)
    running = model.send(11, 1, start=True)
    waiting = model.send(22, 10, start=True, timeout_us=3000)
    error = await waiting.error()
    assert (error.status, error.message) == (
        Status.UNAVAILABLE,
        "timeout of the corresponding sequence has been expired",
    )
    assert waiting.done_us == 3000
    await running.result()


# -- the idle reaper ---------------------------------------------------------------------


@virtual_time
async def test_an_idle_sequence_loses_its_slot_to_the_backlog_after_max_sequence_idle() -> None:
    model = Model()
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    waiting = model.send(33, 5, start=True)
    for at_us in (2000, 4000, 6000):  # 22 keeps its slot by not idling
        await until_us(at_us)
        calls.append(model.send(22, 1))
    assert await output_of(waiting) == 5
    assert waiting.done_us is not None
    assert 5000 <= waiting.done_us <= 6000  # the reaper looks at least once a millisecond
    assert [await output_of(call) for call in calls] == [1, 10, 11, 12, 13]
    started = [(at_us, rows) for at_us, rows in model.batches() if Row(33, 5, start=True) in rows]
    assert [rows.index(Row(33, 5, start=True)) for _, rows in started] == [0]  # in 11's slot
    error = await model.send(11, 2).error()
    assert error.status is Status.INVALID_ARG
    assert "must specify the START flag on the first request of the sequence" in error.message


@virtual_time
async def test_idle_time_counts_from_the_last_requests_arrival() -> None:
    model = Model(max_batch_size=1, runs_for_us=(3000,))
    running = model.send(11, 1, start=True)  # arrives at 0, runs until 3000
    await until_us(100)
    waiting = model.send(22, 10, start=True)
    await asyncio.gather(running.result(), waiting.result())
    assert waiting.done_us is not None
    assert waiting.done_us <= 6000 + 3000  # reaped within a reaper tick of 5000, then a 3000 run


# -- Triton's texts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "rows", "status", "text"),
    [
        (
            42,
            1,
            Status.INVALID_ARG,
            "inference request for sequence 42 to model 'accumulate' must specify the START flag on the first "
            "request of the sequence",
        ),
        (
            0,
            1,
            Status.INVALID_ARG,
            "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID",
        ),
        (
            42,
            2,
            Status.INVALID_ARG,
            "inference request to model 'accumulate' must specify batch-size 1 due to requirements of sequence batcher",
        ),
    ],
    ids=["unknown-sequence-without-start", "no-correlation-id", "batch-of-two"],
)
@virtual_time
async def test_a_request_that_breaks_the_sequence_rules_fails_with_tritons_text(
    sequence: int, rows: int, status: Status, text: str
) -> None:
    model = Model()
    request = infer_request(model.signature, "INPUT", [[1]] * rows, sequence=(sequence, False, False))
    with pytest.raises(TurnoutError) as failure:
        await model.batcher.submit(request)
    assert (failure.value.status, failure.value.message) == (status, text)
    # Only a later request of a sequence this replica does not hold says so to the gateway.
    assert (failure.value.cause is Cause.UNKNOWN_SEQUENCE) == (sequence != 0 and rows == 1)
    assert model.batches() == []


# -- the direct strategy ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("utilization", "first_run_us"), [(0.5, 1000), (0.0, 0)], ids=["waits-for-utilization", "no-minimum"]
)
@virtual_time
async def test_direct_waits_up_to_the_queue_delay_for_the_minimum_slot_utilization(
    utilization: float, first_run_us: int
) -> None:
    strategy = f"direct {{ max_queue_delay_microseconds: 1000 minimum_slot_utilization: {utilization} }}"
    model = Model(strategy, max_batch_size=4)
    calls = [model.send(11, 1, start=True)]  # 1 of 4 slots ready
    await until_us(2000)
    calls += [model.send(22, 10, start=True), model.send(33, 20, start=True)]  # 2 of 4: runs at once
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [
        (first_run_us, [Row(11, 1, start=True)]),
        (2000, [None, Row(22, 10, start=True), Row(33, 20, start=True)]),
    ]


@virtual_time
async def test_direct_runs_a_new_sequences_start_in_the_same_batch_as_continuing_sequences() -> None:
    model = Model()
    calls = [model.send(11, 1, start=True)]
    await until_us(100)
    calls += [model.send(11, 2), model.send(22, 10, start=True)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(0, [Row(11, 1, start=True)]), (100, [Row(11, 2), Row(22, 10, start=True)])]


@virtual_time
async def test_direct_spreads_sequences_over_instances_lowest_slot_first() -> None:
    model = Model(max_batch_size=2, runs_for_us=(0, 0))
    calls = [model.send(sequence, sequence, start=True) for sequence in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches(0) == [(0, [Row(1, 1, start=True), Row(3, 3, start=True)])]
    assert model.batches(1) == [(0, [Row(2, 2, start=True)])]


# -- an instance-group update -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 1 }"])
@virtual_time
async def test_an_added_instance_gives_its_slots_to_the_backlog_first(strategy: str) -> None:
    model = Model(strategy, max_batch_size=1)
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]  # 22 waits for a slot
    await until_us(100)
    assert calls[1].done_us is None
    added = RecordingInstance(accumulate, 0)
    model.instances.append(added)
    await model.batcher.update_instances([added], [])
    calls.append(model.send(22, 20))
    assert [await output_of(call) for call in calls] == [1, 10, 30]
    assert model.batches(1) == [(100, [Row(22, 10, start=True)]), (100, [Row(22, 20)])]
    assert model.batcher.instance_count == 2


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 2 }"])
@virtual_time
async def test_a_removed_instance_keeps_its_sequences_until_they_end_then_closes(strategy: str) -> None:
    model = Model(strategy, max_batch_size=2, runs_for_us=(0, 0))
    kept, leaving = model.instances
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]  # 11 on `kept`, 22 on `leaving`
    await until_us(100)
    await model.batcher.update_instances([], [leaving])
    assert model.batcher.instance_count == 1
    calls += [model.send(22, 20), model.send(33, 5, start=True)]  # 22 stays; 33 starts on `kept`
    await until_us(200)
    assert not leaving.closed  # 22 still holds its slot there
    calls.append(model.send(22, 30, end=True))
    assert [await output_of(call) for call in calls] == [1, 10, 30, 5, 60]
    await until_us(300)
    assert leaving.closed and not kept.closed
    assert [row for _, rows in model.batches(1) for row in rows if row] == [
        Row(22, 10, start=True),
        Row(22, 20),
        Row(22, 30, end=True),
    ]
    waiting = model.send(44, 1, start=True)
    await until_us(400)
    assert waiting.done_us is None  # `kept`'s two slots hold 11 and 33, and `leaving`'s are gone
    assert await output_of(model.send(11, 2, end=True)) == 3
    assert await output_of(waiting) == 1  # in 11's slot
    await model.batcher.close()
    assert kept.closed


@virtual_time
async def test_a_removed_instance_without_sequences_closes_at_once() -> None:
    model = Model(max_batch_size=2, runs_for_us=(0, 0))
    kept, leaving = model.instances
    await model.send(11, 1, start=True).result()  # on `kept`
    await model.batcher.update_instances([], [leaving])
    await until_us(10)
    assert leaving.closed and not kept.closed


# -- the oldest strategy ---------------------------------------------------------------------


@virtual_time
async def test_oldest_runs_a_lone_request_after_the_queue_delay_without_filler_rows() -> None:
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 1000 }"
    model = Model(strategy, max_batch_size=4)
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    calls.append(model.send(22, 20))
    await until_us(3000)
    calls.append(model.send(11, 2))
    await until_us(3010)
    calls.append(model.send(22, 30))  # with 11's request, a preferred size: at once
    assert [await output_of(call) for call in calls] == [1, 10, 30, 3, 60]
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 10, start=True)]),
        (1100, [Row(22, 20)]),
        (3010, [Row(11, 2), Row(22, 30)]),
    ]


@virtual_time
async def test_oldest_batches_the_oldest_requests_first_whatever_their_slots() -> None:
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] }"
    model = Model(strategy, max_batch_size=2, runs_for_us=(500,))
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]  # slots 0 and 1
    await until_us(600)
    calls.append(model.send(33, 5, start=True))  # keeps the instance busy until 1100
    await until_us(700)
    calls.append(model.send(22, 20))
    await until_us(800)
    calls.append(model.send(11, 2))
    assert [await output_of(call) for call in calls] == [1, 10, 5, 30, 3]
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 10, start=True)]),
        (600, [Row(33, 5, start=True)]),
        (1100, [Row(22, 20), Row(11, 2)]),  # 22's request is older, though 11 holds the lower slot
    ]


@virtual_time
async def test_oldest_runs_a_start_and_a_continuing_request_together_as_a_preferred_size() -> None:
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 1000 }"
    model = Model(strategy, max_batch_size=4)
    calls = [model.send(11, 1, start=True)]
    await until_us(2000)
    calls += [model.send(11, 2), model.send(22, 10, start=True)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [(1000, [Row(11, 1, start=True)]), (2000, [Row(11, 2), Row(22, 10, start=True)])]


@virtual_time
async def test_oldest_without_a_queue_delay_cuts_a_batch_back_to_the_largest_preferred_size() -> None:
    model = Model("oldest { max_candidate_sequences: 4 preferred_batch_size: [2] }", max_batch_size=4)
    calls = [model.send(sequence, sequence, start=True) for sequence in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [
        (0, [Row(1, 1, start=True), Row(2, 2, start=True)]),
        (0, [Row(3, 3, start=True)]),
    ]


@virtual_time
async def test_oldest_runs_a_preferred_size_at_once_even_with_more_sequences_waiting() -> None:
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 1000 }"
    model = Model(strategy, max_batch_size=4)
    calls = [model.send(sequence, sequence, start=True) for sequence in (1, 2, 3)]
    await asyncio.gather(*(call.result() for call in calls))
    assert model.batches() == [
        (0, [Row(1, 1, start=True), Row(2, 2, start=True)]),
        (1000, [Row(3, 3, start=True)]),
    ]


@virtual_time
async def test_oldest_counts_a_backlogged_sequences_delay_from_when_it_gets_a_slot() -> None:
    strategy = "oldest { max_candidate_sequences: 2 preferred_batch_size: [2] max_queue_delay_microseconds: 1000 }"
    model = Model(strategy, max_batch_size=2)
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]
    await until_us(100)
    calls.append(model.send(33, 5, start=True))  # both slots taken: the backlog
    await until_us(3000)
    calls.append(model.send(11, 2, end=True))  # alone: runs after its delay, and frees its slot
    await until_us(4500)
    calls.append(model.send(22, 20))
    assert [await output_of(call) for call in calls] == [1, 10, 5, 3, 30]
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 10, start=True)]),
        (4000, [Row(11, 2, end=True)]),
        # 33 arrived at 100 but could run only from 4000: within its delay, 22's request joins.
        (4500, [Row(33, 5, start=True), Row(22, 20)]),
    ]  # as Triton 2.51 did in tests/e2e/test_e2e_batching.py's oldest_backlog scenario


@virtual_time
async def test_oldest_counts_the_delay_of_a_sequences_next_request_from_when_the_previous_one_finished() -> None:
    strategy = "oldest { max_candidate_sequences: 4 preferred_batch_size: [2] max_queue_delay_microseconds: 1000 }"
    model = Model(strategy, max_batch_size=4, runs_for_us=(3000,))
    calls = [model.send(11, 1, start=True), model.send(22, 10, start=True)]  # run 0 to 3000
    await until_us(100)
    calls.append(model.send(11, 2))  # queued behind its sequence's running request
    await until_us(3500)
    calls.append(model.send(22, 20))
    assert [await output_of(call) for call in calls] == [1, 10, 3, 30]
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 10, start=True)]),
        (3500, [Row(11, 2), Row(22, 20)]),  # 11's request has waited since 3000, not 100
    ]  # Triton 2.51 (seconds for ms) ran the same two batches, the second at 3.5 s


@virtual_time
async def test_oldest_grows_a_batch_waiting_for_a_busy_instance_past_the_preferred_size() -> None:
    strategy = "oldest { max_candidate_sequences: 8 preferred_batch_size: [2] max_queue_delay_microseconds: 10000 }"
    model = Model(strategy, max_batch_size=8, runs_for_us=(3000,))
    calls = [model.send(11, 1, start=True), model.send(22, 2, start=True)]
    for at_us, sequence in ((300, 33), (400, 44), (500, 55)):
        await until_us(at_us)
        calls.append(model.send(sequence, sequence, start=True))
    await asyncio.gather(*(call.result() for call in calls))
    # [33, 44] is formed at 400, a preferred size; 55 joins it while the instance is busy.
    # Triton 2.51 (seconds for ms) ran [11, 22], then [33, 44, 55] at 3 s.
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 2, start=True)]),
        (3000, [Row(33, 33, start=True), Row(44, 44, start=True), Row(55, 55, start=True)]),
    ]


@virtual_time
async def test_oldest_merges_the_batches_waiting_behind_the_one_its_instance_starts_once_their_delay_passed() -> None:
    strategy = "oldest { max_candidate_sequences: 8 preferred_batch_size: [2] max_queue_delay_microseconds: 500 }"
    model = Model(strategy, max_batch_size=8, runs_for_us=(3000,))
    calls = [model.send(11, 1, start=True), model.send(22, 2, start=True)]
    for at_us, sequences in ((100, (33, 44)), (200, (55,)), (300, (66,)), (1400, (77,)), (1500, (88,))):
        await until_us(at_us)
        calls += [model.send(sequence, sequence, start=True) for sequence in sequences]
    await asyncio.gather(*(call.result() for call in calls))
    # [33, 44, 55] (full) and [66, 77, 88] wait; the second's delay has passed at 3000.
    # Triton 2.51 (seconds for ms) ran [11, 22], then all six at 3 s.
    assert model.batches() == [
        (0, [Row(11, 1, start=True), Row(22, 2, start=True)]),
        (3000, [Row(n, n, start=True) for n in (33, 44, 55, 66, 77, 88)]),
    ]


# -- close -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        "direct { }",
        "oldest { max_candidate_sequences: 1 preferred_batch_size: [1] max_queue_delay_microseconds: 100000 }",
    ],
    ids=["direct", "oldest"],
)
@virtual_time
async def test_close_runs_what_is_queued_and_fails_backlogged_sequences(strategy: str) -> None:
    model = Model(strategy, max_batch_size=1)
    running = model.send(11, 1, start=True)
    waiting = model.send(22, 10, start=True)
    await until_us(10)
    await model.batcher.close()
    assert await output_of(running) == 1
    error = await waiting.error()
    assert (error.status, error.message) == (Status.UNAVAILABLE, "Server exiting")
    refused = await model.send(33, 1, start=True).error()
    assert refused.message == "Server is stopping, scheduler for model has stopped accepting new inference requests"
    assert all(instance.closed for instance in model.instances)
    assert model.batches() == [(0, [Row(11, 1, start=True)])]


@virtual_time
async def test_oldest_close_runs_a_request_still_within_its_queue_delay_at_once() -> None:
    strategy = "oldest { max_candidate_sequences: 2 preferred_batch_size: [2] max_queue_delay_microseconds: 100000 }"
    model = Model(strategy, max_batch_size=2)
    waiting = model.send(11, 1, start=True)
    await until_us(10)
    await model.batcher.close()
    assert await output_of(waiting) == 1
    assert model.batches() == [(10, [Row(11, 1, start=True)])]
