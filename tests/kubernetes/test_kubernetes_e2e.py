"""The Kubernetes pods as local processes: a real Consul agent, the ONNX Runtime sidecar and
the gateway started with their containers' command and environment from overlays/pvc
(ports and addresses remapped to free loopback ones, as a pod's would be its own), then
every probe asked as the kubelet would: the gateway's HTTP paths, the sidecar's gRPC
health services."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.ready import GATEWAY_READY, SIDECAR_READY
from tests.fleet.fleet_harness import Consul, Process, consul_agent, free_port, running, spawn, wait_until
from tests.harness import write_repository
from tests.kubernetes.manifests import Container, build, containers

BIN = Path(sys.executable).parent
POD_IP = "127.0.0.1"  # the downward API's status.podIP, here


@pytest.fixture(scope="module")
def consul() -> Iterator[Consul]:
    with consul_agent() as agent:
        yield agent


def _container(deployment: str) -> Container:
    (found,) = (c for c in containers(build("pvc")) if c.deployment == deployment)
    return found


def _start(container: Container, environment: dict[str, str], ready: str) -> Process:
    """The container's command, run here with exactly its TURNOUT_* environment."""
    argv = container.argv()
    assert argv[0] == "turnout"
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("TURNOUT_")]:
            patch.delenv(key)
        for key, value in environment.items():
            if key.startswith("TURNOUT_"):
                patch.setenv(key, value)
        return spawn([str(BIN / "turnout"), *argv[1:]], ready)


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def _grpc_health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=3).status)


def test_the_pods_probes_answer_on_a_running_fleet(consul: Consul, tmp_path: Path) -> None:
    sidecar = _container("sidecar-onnxruntime")
    sidecar_env = sidecar.environment() | {
        "TURNOUT_SIDECAR_CONSUL": consul.http,
        "TURNOUT_SIDECAR_HOST": POD_IP,
        "TURNOUT_SIDECAR_ADVERTISE_ADDRESS": POD_IP,
        "TURNOUT_SIDECAR_PORT": str(free_port()),
        "TURNOUT_SIDECAR_LANE_PORT": str(free_port()),
        "TURNOUT_SIDECAR_METRICS_PORT": str(free_port()),
        "TURNOUT_SIDECAR_MODEL_REPOSITORY": str(write_repository(tmp_path / "models", ("simple", "linear"))),
        "TURNOUT_SIDECAR_EXIT_TIMEOUT_SECS": "3",
    }
    gateway = _container("gateway")
    routing = tmp_path / "routing.yaml"
    (routing_data,) = (c["data"] for c in build("pvc") if c["metadata"]["name"].startswith("turnout-routing"))
    routing.write_text(routing_data["routing.yaml"])
    gateway_env = gateway.environment() | {
        "TURNOUT_GATEWAY_CONSUL": consul.http,
        "TURNOUT_GATEWAY_HOST": POD_IP,
        "TURNOUT_GATEWAY_HTTP_PORT": str(free_port()),
        "TURNOUT_GATEWAY_GRPC_PORT": "0",
        "TURNOUT_GATEWAY_METRICS_PORT": "0",
        "TURNOUT_GATEWAY_ROUTING": str(routing),
        "TURNOUT_GATEWAY_EXIT_TIMEOUT_SECS": "3",
    }
    with running(_start(sidecar, sidecar_env, SIDECAR_READY)):
        grpc_address = f"{POD_IP}:{sidecar_env['TURNOUT_SIDECAR_PORT']}"
        # Registered under the pod's address, as gateways and Consul's check reach it.
        wait_until(lambda: consul.passing(), 15, "the sidecar's registration to pass")
        (entry,) = consul.passing()
        assert entry["Service"]["Address"] == POD_IP
        assert entry["Service"]["Port"] == int(sidecar_env["TURNOUT_SIDECAR_PORT"])
        for kind in ("readiness", "liveness"):
            service = sidecar.spec[f"{kind}Probe"]["grpc"].get("service", "")
            assert _grpc_health(grpc_address, service) == health_pb2.HealthCheckResponse.SERVING, kind

        with running(_start(gateway, gateway_env, GATEWAY_READY)) as (gateway_process,):
            http = gateway_process.fields["http"]
            for kind in ("liveness", "readiness"):
                path = gateway.spec[f"{kind}Probe"]["httpGet"]["path"]
                # Ready once discovery has synced and every listed model has a replica.
                wait_until(lambda path=path: _http_status(f"http://{http}{path}") == 200, 30, f"{kind} {path}")
            # A path the gateway does not serve fails: the probe check is not vacuous.
            assert _http_status(f"http://{http}/v2/health/alive") != 200
            # And the pods serve: a request through the gateway to the registered sidecar.
            client = httpclient.InferenceServerClient(http)
            data = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(data)
            np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * data)
            client.close()
