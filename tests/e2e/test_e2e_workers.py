"""--gateway-workers: several gateway processes serve the same ports. Connections spread
over the workers, and what a client changes through one worker (shared-memory regions,
log and trace settings, model loads and unloads) holds in all; ensemble statistics and
the metrics port add up over the workers; a worker's death stops the gateway."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.e2e.simple_requests import simple_arrays
from tests.harness import Server, eventually, free_port, live_children, make_models, turnout_up, write_repository

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="--gateway-workers shares ports with SO_REUSEPORT")

WORKERS = 2
CLIENTS = 24  # connections; all on one worker by chance: one in 2**23
INT16 = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
# gRPC channels to one address share a connection unless each keeps its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _workers(server: Server) -> list[int]:
    return [
        pid
        for pid in live_children(server.process.pid)
        if b"gateway.workers" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_workers"), ("simple", "linear"))
    pair = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    make_models().write_ensemble(
        repo, "twice", INT16, [("OUT", "INT32", [16])], [("simple", -1, pair, {"OUTPUT0": "OUT"})]
    )
    flags = ("--gateway-workers=2", "--allow-client-shm=true", "--model-control-mode=explicit")
    with turnout_up(repo, *flags, "--load-model=simple", "--load-model=linear", "--load-model=twice") as running:
        yield running


def _infer_http(url: str, model: str = "simple") -> None:
    with httpclient.InferenceServerClient(url) as client:
        a, b = simple_arrays()
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(model, inputs)
        expected = ("OUTPUT0", a + b) if model == "simple" else ("OUT", a + b)
        np.testing.assert_array_equal(result.as_numpy(expected[0]), expected[1])


def _connections_per_worker(server: Server, port: int) -> list[int]:
    """Established connections to `port` each worker holds, from /proc."""
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established.add(fields[9])  # the socket's inode
    counts = []
    for pid in _workers(server):
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}") if os.path.islink(f"/proc/{pid}/fd/{fd}") else ""
            if match := re.fullmatch(r"socket:\[(\d+)\]", link):
                inodes.add(match.group(1))
        counts.append(len(inodes & established))
    return counts


def test_the_gateway_runs_its_workers(server: Server) -> None:
    assert len(_workers(server)) == WORKERS
    assert "workers=2" in server.output()


def test_connections_spread_over_the_workers_and_each_answers(server: Server) -> None:
    # Each client holds a connection of its own open between calls, so /proc shows it.
    http = [httpx.Client(base_url=f"http://{server.http}") for _ in range(CLIENTS)]
    grpc = [grpcclient.InferenceServerClient(server.grpc, channel_args=OWN_CONNECTION) for _ in range(CLIENTS)]
    try:
        a, b = simple_arrays()
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.flatten().tolist()},
            ]
        }
        for client in http:
            answer = client.post("/v2/models/simple/infer", json=body).json()
            assert {o["name"]: o["data"] for o in answer["outputs"]}["OUTPUT1"] == (a - b).flatten().tolist()
        for client in grpc:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
        for port in (int(server.http.rsplit(":", 1)[1]), int(server.grpc.rsplit(":", 1)[1])):
            counts = _connections_per_worker(server, port)
            assert len(counts) == WORKERS and all(counts) and sum(counts) >= CLIENTS, (port, counts)
    finally:
        for client in http:
            client.close()
        for channel in grpc:
            channel.close()


def test_a_region_registered_through_one_worker_serves_through_every_worker(server: Server) -> None:
    key = f"/turnout_workers_{os.getpid()}"
    region = shm.create_shared_memory_region("workers_in", key, 128)
    try:
        a, b = simple_arrays()
        shm.set_shared_memory_region(region, [a, b])
        with httpclient.InferenceServerClient(server.http) as first:
            first.register_system_shared_memory("workers_in", key, 128)
        for _ in range(CLIENTS):  # new connections: every worker is asked
            with httpclient.InferenceServerClient(server.http) as client:
                assert [r["name"] for r in client.get_system_shared_memory_status()] == ["workers_in"]
                inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_shared_memory("workers_in", 64)
                inputs[1].set_shared_memory("workers_in", 64, offset=64)
                np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
        with grpcclient.InferenceServerClient(server.grpc) as first:
            first.unregister_system_shared_memory("workers_in")
        for _ in range(CLIENTS):
            with grpcclient.InferenceServerClient(server.grpc, channel_args=OWN_CONNECTION) as client:
                assert not client.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(region)


def test_log_and_trace_settings_hold_in_every_worker(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as first:
        first.update_log_settings({"log_verbose_level": 1})
        first.update_trace_settings(settings={"trace_rate": "7"})
    try:
        for _ in range(CLIENTS):
            with httpclient.InferenceServerClient(server.http) as client:
                assert client.get_log_settings()["log_verbose_level"] == 1
                assert client.get_trace_settings()["trace_rate"] == "7"
    finally:
        with httpclient.InferenceServerClient(server.http) as first:
            first.update_log_settings({"log_verbose_level": 0})
            first.update_trace_settings(settings={"trace_rate": "1000"})


def test_a_refused_change_changes_no_worker(server: Server) -> None:
    with (
        httpclient.InferenceServerClient(server.http) as first,
        pytest.raises(Exception, match="Unable to open shared memory region"),
    ):
        first.register_system_shared_memory("nowhere", "/turnout_no_such_region", 64)
    for _ in range(CLIENTS):
        with httpclient.InferenceServerClient(server.http) as client:
            assert client.get_system_shared_memory_status() == []


def test_an_ensemble_held_through_one_worker_comes_back_through_any(server: Server) -> None:
    # Unloading `simple` unloads `twice` (its step); whichever worker loads `simple` again
    # loads `twice` with it, as Triton's dependency graph does.
    for _ in range(4):  # each time on a fresh connection, so on either worker
        with httpclient.InferenceServerClient(server.http) as client:
            client.unload_model("simple")
            assert not client.is_model_ready("twice")
        with httpclient.InferenceServerClient(server.http) as client:
            client.load_model("simple")
            assert client.is_model_ready("twice")
    for _ in range(CLIENTS):
        _infer_http(server.http, "twice")


def test_unload_and_load_through_one_worker_hold_in_every_worker(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as first:
        first.unload_model("linear")
    try:
        for _ in range(CLIENTS):
            with grpcclient.InferenceServerClient(server.grpc, channel_args=OWN_CONNECTION) as client:
                assert not client.is_model_ready("linear")
    finally:
        with grpcclient.InferenceServerClient(server.grpc) as first:
            first.load_model("linear")
    for _ in range(CLIENTS):
        with grpcclient.InferenceServerClient(server.grpc, channel_args=OWN_CONNECTION) as client:
            assert client.is_model_ready("linear")


def _sample(text: str, family: str, model: str) -> float:
    pattern = rf'^{family}{{[^}}]*model="{model}"[^}}]*}} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, text, re.MULTILINE))


def test_ensemble_statistics_and_metrics_add_up_over_the_workers(server: Server) -> None:
    def success(model: str) -> int:
        with httpclient.InferenceServerClient(server.http) as client:
            stats = client.get_inference_statistics(model)["model_stats"]
        return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)

    metrics_url = f"http://{server.metrics}/metrics"
    before = httpx.get(metrics_url).text
    ensemble_before, simple_before = success("twice"), success("simple")
    sent = CLIENTS
    for _ in range(sent):  # new connections: both workers run the ensemble
        _infer_http(server.http, "twice")
    assert success("twice") - ensemble_before == sent
    assert success("simple") - simple_before == sent  # the ensemble's steps, counted by the sidecar once
    after = httpx.get(metrics_url).text
    for family in ("nv_inference_request_success", "turnout_gateway_requests_total"):
        assert _sample(after, family, "twice") - _sample(before, family, "twice") == sent, family
    assert (
        _sample(after, "nv_inference_request_success", "simple")
        - _sample(before, "nv_inference_request_success", "simple")
        == sent
    )
    # One family per name, and the replicas a worker knows are not doubled.
    declared = re.findall(r"^# TYPE (\S+)", after, re.MULTILINE)
    assert len(declared) == len(set(declared))


def test_a_worker_that_dies_stops_the_gateway(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    with turnout_up(repo, "--gateway-workers=2") as running:
        workers = _workers(running)
        os.kill(workers[0], signal.SIGKILL)
        assert eventually(lambda: not running.alive(), timeout=30)
        assert running.process.returncode == 1
        assert "gateway worker 0 exited" in running.output()
        assert eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers[1:]), timeout=30)


@pytest.mark.parametrize(("flag", "what"), [("--http-port", "HTTP"), ("--metrics-port", "metrics")])
def test_a_taken_port_is_refused_in_the_one_gateways_words(flag: str, what: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port(), flag: port}
        command = [sys.executable, "-m", "turnout", "gateway", "--sidecar=onnxruntime=127.0.0.1:1", "--host=127.0.0.1"]
        command += [f"{name}={value}" for name, value in ports.items()]
        done = subprocess.run([*command, "--gateway-workers=2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"cannot serve {what} on 127.0.0.1:{port} ({flag}): Address already in use" in done.stderr
