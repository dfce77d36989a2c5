"""glibc's malloc, told to keep the memory of large tensors for the next request.

By default glibc serves every allocation over 128 KiB with a fresh mmap and hands it back
to the kernel when freed (its threshold adapts, but the trim of the heap's top undoes
it), so every large tensor a request carries is written into new pages, each a page
fault. Measured here, a 1 MiB request through the gateway and the ONNX Runtime sidecar
cost each process about 4.5 ms of CPU that way, against about 2.5 ms with the thresholds
below (bench/README.md). The price is memory: each process keeps up to TRIM_THRESHOLD
of freed memory instead of returning it.

Only glibc has these settings; elsewhere (macOS, musl) nothing changes. Settings the
environment gives glibc itself (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
GLIBC_TUNABLES) are left to win.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # allocations up to this come from the heap: glibc's largest on 64-bit
TRIM_THRESHOLD = 64 * 1024 * 1024  # free memory at the heap's top kept up to this much

_OWN_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Set both thresholds where glibc's malloc runs this process; True if they were set."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _OWN_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
