"""`make run` on a fresh clone needs Python and nothing else: scripts/fresh-clone-check
clones HEAD, runs `make run` with consul, docker-compose, apt and dpkg replaced by
stand-ins that fail, and serves the README's client snippet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.harness import ROOT


def test_make_run_serves_a_fresh_clone_with_python_alone() -> None:
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("needs git and make (apt install git make)")
    done = subprocess.run(
        [str(ROOT / "scripts" / "fresh-clone-check")],
        cwd=ROOT,
        env=dict(os.environ, CLIENT_PYTHON=sys.executable, PYTHON=_base_python()),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served the README's client snippet" in done.stdout


def _base_python() -> str:
    """The interpreter the test environment was made from (what `make run` would find)."""
    return str(getattr(sys, "_base_executable", sys.executable))
