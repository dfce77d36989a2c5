"""Child processes that must not outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A `preexec_fn`: on Linux the child gets SIGKILL when the thread that started it
    ends (the parent process dying included). Elsewhere there is no such call, and the
    parent's own shutdown stops its children."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
