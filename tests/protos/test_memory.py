"""protos.memory.keep_freed_memory: large buffers written again and again stop costing page
faults once glibc keeps freed memory, and settings of glibc's own environment win."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's"
)

# What a request with a 4 MiB tensor does to memory: fresh buffers, written, then freed.
_FAULTS = """
import resource, sys
from protos.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
source = bytes(range(256)) * 16384
for _ in range(3):
    b"".join([source, b"x"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    copy = b"".join([source, b"x"])
    other = bytearray(source)
    del copy, other
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40)
"""


def _faults(mode: str, env: dict[str, str] | None = None) -> tuple[bool, float]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    environment.update(env or {})
    result = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], cwd=ROOT, env=environment, capture_output=True, text=True, check=True
    )
    kept, faults = result.stdout.split()
    return kept == "True", float(faults)


def test_freed_buffers_are_reused_without_page_faults() -> None:
    kept, faults = _faults("keep")
    default_kept, default_faults = _faults("default")
    assert kept and not default_kept
    assert default_faults > 1000  # two 4 MiB buffers: about 2 048 fresh pages each time
    assert faults < default_faults / 10


def test_glibc_settings_from_the_environment_win() -> None:
    kept, _ = _faults("keep", {"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert not kept
