"""scripts/gpu-check dry-runs on a machine without a GPU: it builds its repository and
stops cleanly with status 2 and one line saying why nothing was checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_stops_cleanly_without_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: run scripts/gpu-check itself")
    done = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_check", "--seconds=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpu-check: built 5 models" in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("gpu-check: no GPU to check: ")
