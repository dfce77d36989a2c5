"""Where a ThreadedInstance runs its model: on its thread, or inline on the event loop
when the model runs faster than a hand-off to the thread costs."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from sidecars.runtime import INLINE_BELOW_NS, RUN_WINDOW, THREAD_ABOVE_NS, Tensors, ThreadedInstance


class Timed(ThreadedInstance):
    """Runs as long as `takes` says (seconds, one entry per run, the last one repeated)."""

    def __init__(self, takes: list[float]) -> None:
        super().__init__("timed")
        self.takes = takes
        self.threads: list[int] = []

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        took = self.takes.pop(0) if len(self.takes) > 1 else self.takes[0]
        if took:
            time.sleep(took)
        return {}


async def _runs(instance: Timed, count: int) -> list[bool]:
    """For each of `count` runs, whether it ran inline (on the event loop's thread)."""
    loop_thread = threading.get_ident()
    for _ in range(count):
        await instance.execute({})
    return [thread == loop_thread for thread in instance.threads[-count:]]


def test_a_fast_model_runs_inline_after_one_window_on_its_thread() -> None:
    instance = Timed([0.0])
    inline = asyncio.run(_runs(instance, RUN_WINDOW + 10))
    instance.close()
    assert inline == [False] * RUN_WINDOW + [True] * 10


def test_a_slow_model_stays_on_its_thread() -> None:
    instance = Timed([2 * INLINE_BELOW_NS / 1e9])
    inline = asyncio.run(_runs(instance, 2 * RUN_WINDOW + 2))
    instance.close()
    assert not any(inline)


def test_runs_slowed_by_waits_on_the_thread_do_not_keep_a_fast_model_there() -> None:
    # Most runs on the thread look slow (as when they wait for the GIL); the fastest decides.
    slow = 3 * INLINE_BELOW_NS / 1e9
    instance = Timed([slow] * (RUN_WINDOW - 1) + [0.0])
    inline = asyncio.run(_runs(instance, RUN_WINDOW + 1))
    instance.close()
    assert inline[-1]


def test_a_model_that_slows_down_inline_moves_back_to_its_thread() -> None:
    # Fast for a window (then inline); slow from then on: after a window of slow runs, back on the thread.
    instance = Timed([0.0] * RUN_WINDOW + [2 * THREAD_ABOVE_NS / 1e9])
    inline = asyncio.run(_runs(instance, 3 * RUN_WINDOW + 1))
    instance.close()
    assert inline[RUN_WINDOW : 2 * RUN_WINDOW] == [True] * RUN_WINDOW
    assert not any(inline[2 * RUN_WINDOW :])


def test_a_window_of_somewhat_slower_runs_keeps_an_inline_model_inline() -> None:
    # Every run of a window twice the inline limit (a busy host): still inline, where
    # a model measured that slow on its thread would have stayed there.
    instance = Timed([0.0] * RUN_WINDOW + [2 * INLINE_BELOW_NS / 1e9] * RUN_WINDOW + [0.0])
    inline = asyncio.run(_runs(instance, 3 * RUN_WINDOW))
    instance.close()
    assert all(inline[RUN_WINDOW:])


def test_one_slow_inline_run_does_not_move_a_fast_model() -> None:
    slow = 100 * INLINE_BELOW_NS / 1e9  # a run that waited for the GIL
    instance = Timed([0.0] * (RUN_WINDOW + 5) + [slow] + [0.0])
    inline = asyncio.run(_runs(instance, 3 * RUN_WINDOW))
    instance.close()
    assert all(inline[RUN_WINDOW:])
