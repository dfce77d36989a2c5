"""A sidecar that `turnout up` restarts comes back on the same metrics port, so the
gateway's /metrics keeps showing its Triton families without being told anything."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from tests.harness import live_children, pid_alive, turnout_up, write_repository


def _sample(metrics: str, name: str, model: str) -> float | None:
    """The value of `name{model=...}` on the gateway's /metrics, None when absent."""
    text = httpx.get(f"http://{metrics}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rpartition(" ")[2])
    return None


def _infer(address: str) -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(address) as client:
        client.infer("simple", inputs)


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)  # polling another process's state: there is no event to wait on
    raise AssertionError(f"timed out waiting for {what}")


def test_a_restarted_sidecar_is_scraped_again(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    with turnout_up(repo) as server:
        for _ in range(3):
            _infer(server.grpc)
        # Only a scrape of the sidecar's own /metrics (not the statistics fallback) has
        # the pending count, so its presence says the metrics port is being read.
        assert _sample(server.metrics, "nv_inference_pending_request_count", "simple") == 0
        assert _sample(server.metrics, "nv_inference_request_success", "simple") == 3
        (sidecar,) = live_children(server.process.pid)
        os.kill(sidecar, signal.SIGKILL)
        _wait(lambda: not pid_alive(sidecar), 10, "the sidecar to die")
        _wait(lambda: [p for p in live_children(server.process.pid) if p != sidecar], 30, "a restarted sidecar")
        _wait(lambda: "sidecar ready on" in server.output().rsplit("died", 1)[-1], 60, "the restart's ready line")
        _infer(server.grpc)
        # A new process: its counters start over, the gateway reads them on the old port,
        # and keeps what the old process counted (the fleet view never goes down).
        assert _sample(server.metrics, "nv_inference_request_success", "simple") == 3 + 1, server.output()
        assert _sample(server.metrics, "nv_inference_pending_request_count", "simple") == 0
