"""`python -m bench.slowed_sidecar FACTOR ARGS...`: the sidecar (`python -m sidecars ARGS...`)
for a process that runs FACTOR times slower than it would (valgrind's callgrind runs about
fifty to a hundred times slower). A model's runs are timed to decide whether it runs on
the event loop or on its thread (sidecars.runtime.ThreadedInstance); with the thresholds
scaled by FACTOR, the slowed process decides as it would at full speed, so what
bench.instructions counts is the path the sidecar really takes.
"""

from __future__ import annotations

import runpy
import sys

from sidecars import runtime


def main() -> None:
    factor, *arguments = sys.argv[1:]
    runtime.INLINE_BELOW_NS *= int(factor)
    runtime.THREAD_ABOVE_NS *= int(factor)
    sys.argv = ["sidecars", *arguments]
    runpy.run_module("sidecars", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
