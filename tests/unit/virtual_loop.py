"""An asyncio event loop on virtual time, for fast deterministic tests of timing logic:
when no callback is ready it jumps straight to its next timer instead of sleeping, so a
test of a one-second timeout takes microseconds and always sees the same interleaving."""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")

# Threads (asyncio.to_thread) wake the loop through its self-pipe, a real event; with no
# timer left to jump to, that is all the loop can wait for, so it waits this long for real.
_THREAD_WAIT_S = 5.0
# A periodic task (a reaper) keeps a stuck test jumping from timer to timer forever; no
# test here needs this much virtual time, so passing it means the test is stuck.
HORIZON_NS = 60 * 10**9


class _JumpingSelector(selectors.DefaultSelector):
    """Answers real events when there are any; otherwise moves the loop's virtual
    time forward by the whole timeout and reports that nothing happened."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            ready = super().select(_THREAD_WAIT_S)
            if not ready:
                raise RuntimeError("deadlock: no timer is scheduled and nothing woke the loop")
            return ready
        self._loop.now_ns += max(1, round(timeout * 1e9))  # at least 1 ns, so the loop always advances
        if self._loop.now_ns > HORIZON_NS:
            raise RuntimeError(f"stuck: virtual time passed {HORIZON_NS / 1e9:g} s")
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock starts at 0 and moves only by jumps to timers."""

    def __init__(self) -> None:
        self.now_ns = 0  # integer nanoseconds, so the clock seam reads exact values
        super().__init__(_JumpingSelector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self.now_ns / 1e9


def virtual_ns() -> int:
    """The running VirtualTimeLoop's time in nanoseconds: the `clock` to hand to code under test."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "virtual_ns() runs on a VirtualTimeLoop only"
    return loop.now_ns


def virtual_us() -> int:
    return virtual_ns() // 1000


def virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an `async def` test on a fresh VirtualTimeLoop of its own (to pytest it is a
    plain test); tasks it leaves behind are cancelled when it ends."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return run
