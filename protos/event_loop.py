"""Which event loop a turnout process runs on: `--event-loop auto|asyncio|uvloop`.

auto takes uvloop where it is installed (an optional dependency: it has no wheels for
every platform) and asyncio's own loop elsewhere. The gateway and the sidecars share it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for asyncio.Runner; None means asyncio's default loop. Raises
    ImportError when uvloop is asked for by name and is not installed (the CLI checks first)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """asyncio.run on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
