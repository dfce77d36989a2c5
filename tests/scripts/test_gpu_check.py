"""scripts/gpu-check dry-runs on a machine without a GPU: it builds its repository and
stops cleanly with status 2 and one line saying why nothing was checked. Its gateway
workers' part needs no GPU, and runs here as it would there, smaller."""

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


def test_the_gateway_workers_part_measures_each_count_over_both_protocols() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_check", "--workers-only", "--workers=1,2", "--clients=1", "--seconds=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.split("sidecar CPU us/req\n", 1)[1].split()
    rows = [table[at : at + 5] for at in range(0, len(table), 5)]
    assert [(workers, protocol) for workers, protocol, *_ in rows] == [
        ("1", "grpc"),
        ("1", "http"),
        ("2", "grpc"),
        ("2", "http"),
    ]
    assert all(float(rate) > 0 and float(gateway) > 0 and float(sidecar) > 0 for _, _, rate, gateway, sidecar in rows)
