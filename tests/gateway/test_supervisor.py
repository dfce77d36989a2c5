"""`turnout up` owns its sidecars: they stop with it, die with it, and a model that
fails to load stops the start (or not, with --exit-on-error=false), as in Triton."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.harness import ROOT, ServerFailedToStart, live_children, pid_alive, turnout_up, write_repository


def _wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive:
            return []
        time.sleep(0.05)  # polling /proc: there is no event to wait on for another's child
    return [pid for pid in pids if pid_alive(pid)]


def test_sigterm_stops_the_gateway_and_every_sidecar(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    with turnout_up(repo) as server:
        sidecars = live_children(server.process.pid)
        assert sidecars, "turnout up should run its sidecar as a child"
        assert httpx.get(f"http://{server.http}/v2/health/ready").status_code == 200
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
        assert _wait_until_gone(sidecars, timeout=10) == []


def test_sidecars_never_outlive_a_killed_parent(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    with turnout_up(repo) as server:
        sidecars = live_children(server.process.pid)
        assert sidecars
        server.process.kill()
        server.process.wait(timeout=10)
        assert _wait_until_gone(sidecars, timeout=10) == []


def _broken_model(repo: Path) -> None:
    model = repo / "broken" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"this is not an onnx model")
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nplatform: "onnxruntime_onnx"\n')


def test_a_model_that_fails_to_load_stops_the_start(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    _broken_model(repo)
    command = [sys.executable, "-m", "turnout", "up", f"--model-repository={repo}", "--host=127.0.0.1"]
    command += ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0
    assert "TURNOUT_READY" not in finished.stdout
    assert "broken" in finished.stderr


def test_exit_on_error_false_serves_the_rest(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    _broken_model(repo)
    with turnout_up(repo, "--exit-on-error=false", "--strict-readiness=false") as server:
        index = httpx.post(f"http://{server.http}/v2/repository/index").json()
        states = {(entry["name"], entry.get("version")): entry for entry in index}
        assert states[("simple", "1")]["state"] == "READY"
        broken = states[("broken", "1")]
        assert broken["state"] == "UNAVAILABLE"
        assert broken["reason"]
        assert httpx.get(f"http://{server.http}/v2/models/simple/ready").status_code == 200
        assert httpx.get(f"http://{server.http}/v2/models/broken/ready").status_code == 400


def test_strict_readiness_reports_a_failed_model(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    _broken_model(repo)
    with turnout_up(repo, "--exit-on-error=false") as server:
        assert httpx.get(f"http://{server.http}/v2/health/live").status_code == 200
        assert httpx.get(f"http://{server.http}/v2/health/ready").status_code == 400


def test_a_repository_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServerFailedToStart), turnout_up(tmp_path / "missing", start_timeout=60):
        pass


def test_flags_read_the_environment(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ["simple"])
    env = dict(os.environ, TURNOUT_UP_MODEL_CONTROL_MODE="explicit")
    command = [sys.executable, "-m", "turnout", "up", "--help"]
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0
    with turnout_up(repo, env={"TURNOUT_UP_MODEL_CONTROL_MODE": "explicit"}) as server:
        # explicit mode loads nothing unless asked
        assert httpx.get(f"http://{server.http}/v2/models/simple/ready").status_code == 400


def test_models_from_several_repositories(tmp_path: Path) -> None:
    first = write_repository(tmp_path / "first", ["simple", "linear"])
    second = write_repository(tmp_path / "second", ["simple_string", "linear"])
    with turnout_up(first, f"--model-repository={second}", "--exit-on-error=false") as server:
        index = httpx.post(f"http://{server.http}/v2/repository/index").json()
        by_name = {entry["name"]: entry for entry in index}
        assert by_name["simple"]["state"] == "READY"
        assert by_name["simple_string"]["state"] == "READY"
        # A name in two repositories is ambiguous: it does not load, and the index says why.
        assert by_name["linear"]["state"] == "UNAVAILABLE"
        assert "more than one model repository" in by_name["linear"]["reason"]
        assert httpx.get(f"http://{server.http}/v2/models/simple_string/ready").status_code == 200
