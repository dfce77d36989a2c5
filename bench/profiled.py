"""Run a module as `python -m MODULE ...` would, with cProfile switched on and off by SIGUSR1.

`python -m bench.profiled OUT MODULE [ARGS...]`: the first SIGUSR1 starts a profile of the
main thread (where the event loop runs), the next one stops it and writes it to OUT.N
(N counting from 0), and so on, so one process yields one profile per measured window.
bench.calls uses it to count exactly what each request costs in Python calls.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


class _Windows:
    def __init__(self, out: str) -> None:
        self._out = out
        self._profile: cProfile.Profile | None = None
        self._written = 0

    def toggle(self, _signal: int, _frame: FrameType | None) -> None:
        if self._profile is None:
            self._profile = cProfile.Profile()
            self._profile.enable()
            return
        self._profile.disable()
        self._profile.dump_stats(f"{self._out}.{self._written}")
        self._written += 1
        self._profile = None


def main() -> None:
    out, module, *arguments = sys.argv[1:]
    signal.signal(signal.SIGUSR1, _Windows(out).toggle)
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
