"""Faults under `turnout up`: a sidecar killed with SIGKILL is restarted with its models,
on the same address, and the log says how it died; a frozen sidecar (SIGSTOP) fails
requests with a clear error, and serves again once it continues."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import Server, live_children, make_models, onnx_identity_bytes, turnout_up, write_repository


def _sidecar(server: Server) -> int:
    children = live_children(server.process.pid)
    assert len(children) == 1, children
    return children[0]


def _eventually(check: Callable[[], bool], timeout: float = 30.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError("condition never held")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Server]:
    repo = write_repository(tmp_path / "repo", ("simple",))
    with turnout_up(repo) as running:
        yield running


def _serves(server: Server) -> bool:
    a, b = simple_arrays()
    try:
        with httpclient.InferenceServerClient(server.http, network_timeout=5) as client:
            check_simple(client.infer("simple", http_inputs(a, b)), a, b)
    except InferenceServerException:
        return False
    return True


def test_killed_sidecar_is_restarted_with_its_models(up: Server) -> None:
    assert _serves(up)
    first = _sidecar(up)
    os.kill(first, signal.SIGKILL)
    recovery = _eventually(lambda: _serves(up))
    second = _sidecar(up)
    assert second != first
    assert f"(pid {first}) died: killed by SIGKILL" in up.output()
    assert recovery < 20
    # Both protocols, and the model's readiness, are back.
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(up.grpc) as client:
        _eventually(lambda: client.is_model_ready("simple"), timeout=10)
        check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)
    # A second death restarts it again.
    os.kill(second, signal.SIGKILL)
    _eventually(lambda: _serves(up) and _sidecar(up) != second)


def test_frozen_sidecar_fails_clearly_then_recovers(up: Server) -> None:
    sidecar = _sidecar(up)
    a, b = simple_arrays()
    os.kill(sidecar, signal.SIGSTOP)
    try:
        with grpcclient.InferenceServerClient(up.grpc) as client:
            with pytest.raises(InferenceServerException) as caught:
                client.infer("simple", grpc_inputs(a, b), client_timeout=1.0)
            assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    finally:
        os.kill(sidecar, signal.SIGCONT)
    _eventually(lambda: _serves(up), timeout=15)
    assert _sidecar(up) == sidecar  # continued, not restarted


def test_restarting_sidecar_refuses_until_its_models_load(tmp_path: Path) -> None:
    # A warm-up long enough that a restart spends a while loading: until it is done the
    # sidecar must refuse (UNAVAILABLE, which clients retry), never answer NOT_FOUND.
    repo = tmp_path / "repo"
    warmup = (
        'model_warmup [ { name: "zeros" batch_size: 1 count: 400 '
        'inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 512 ] zero_data: true } } } ]'
    )
    make_models().write_mlp(repo, name="mlp_slow_start", max_batch_size=1, extra_config=warmup)
    data = np.ones((1, 512), dtype=np.float32)
    with turnout_up(repo) as server, grpcclient.InferenceServerClient(server.grpc) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 512], "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("mlp_slow_start", [tensor])
        os.kill(_sidecar(server), signal.SIGKILL)
        refusals: list[str] = []
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"never served again; refusals: {sorted(set(refusals))}"
            try:
                client.infer("mlp_slow_start", [tensor], client_timeout=5)
            except InferenceServerException as exc:
                refusals.append(str(exc.status()))
                time.sleep(0.01)
            else:
                break
    assert refusals, "the restart was never observed"
    assert set(refusals) == {"StatusCode.UNAVAILABLE"}, sorted(set(refusals))


def test_restarted_sidecar_loads_again_what_clients_loaded(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("linear", "simple"))
    only_version_2 = (
        '{"name": "linear", "platform": "onnxruntime_onnx", "max_batch_size": 8,'
        ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],'
        ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],'
        ' "version_policy": {"specific": {"versions": [2]}}}'
    )
    with (
        turnout_up(repo, "--model-control-mode=explicit") as server,
        grpcclient.InferenceServerClient(server.grpc) as client,
    ):
        client.load_model("linear", config=only_version_2)
        client.load_model("simple")
        client.unload_model("simple")
        first = _sidecar(server)
        os.kill(first, signal.SIGKILL)
        _eventually(lambda: _restarted(server, first) and _holds(lambda: client.is_model_ready("linear", "2")))
        # Loaded again with its override (version 2 only); the unloaded model stays unloaded.
        assert not client.is_model_ready("linear", "1")
        assert not client.is_model_ready("simple")
        # An unload is remembered too: once the new sidecar answers a load, linear is absent.
        client.unload_model("linear")
        second = _sidecar(server)
        os.kill(second, signal.SIGKILL)
        _eventually(lambda: _restarted(server, second) and _holds(lambda: client.load_model("simple") or True))
        assert not client.is_model_ready("linear", "2")


def test_restarted_sidecar_loads_again_the_files_clients_uploaded(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    config = json.dumps(
        {
            "name": "uploaded",
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )
    values = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(values)
    with (
        turnout_up(repo, "--model-control-mode=explicit") as server,
        grpcclient.InferenceServerClient(server.grpc) as client,
    ):
        client.load_model("uploaded", config=config, files={"file:1/model.onnx": onnx_identity_bytes(tmp_path)})
        first = _sidecar(server)
        os.kill(first, signal.SIGKILL)
        _eventually(lambda: _restarted(server, first) and _holds(lambda: client.is_model_ready("uploaded")))
        # Loaded again from the files the journal kept, with the config it was given.
        np.testing.assert_array_equal(client.infer("uploaded", [tensor]).as_numpy("OUTPUT0"), values)
        assert client.get_model_config("uploaded").config.max_batch_size == 8
        # An unload forgets the files: after the next restart the model stays away.
        client.unload_model("uploaded")
        second = _sidecar(server)
        os.kill(second, signal.SIGKILL)
        _eventually(lambda: _restarted(server, second) and _holds(lambda: client.load_model("simple") or True))
        assert not client.is_model_ready("uploaded")
        assert "could not load 'uploaded' again" not in server.output()


def _restarted(server: Server, before: int) -> bool:
    return live_children(server.process.pid) not in ([], [before])


def _holds(check: Callable[[], object]) -> bool:
    """`check` ran and held; a refusal while the sidecar restarts counts as not yet."""
    try:
        return bool(check())
    except InferenceServerException:
        return False
