"""The compose topology as local processes on loopback: a real Consul agent, then the CPU
sidecars and the gateway, each started with its compose service's own command and
environment (addresses and ports remapped to free loopback ones, certificates made by
scripts/make-dev-certs), serving tritonclient, with mutual TLS between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protos.ready import GATEWAY_READY, SIDECAR_READY
from tests.compose.compose_spec import COMPOSE_DIR, Mounts, load_compose, service_argv, service_environment
from tests.fleet.fleet_harness import Consul, Process, consul_agent, free_port, running, spawn, wait_until
from tests.harness import ROOT

COMPOSE = load_compose()
CPU_SIDECARS = sorted(
    name for name, s in COMPOSE["services"].items() if name.startswith("sidecar-") and not s.get("profiles")
)
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the compose files mount at /etc/turnout/certs, made as their README says."""
    folder = tmp_path_factory.mktemp("certs")
    subprocess.run([str(ROOT / "scripts" / "make-dev-certs"), str(folder)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def consul(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consul]:
    # As compose's Consul: its checks present consul.pem to the mutual TLS sidecars.
    check_certs = (str(certs / "ca.pem"), str(certs / "consul.pem"), str(certs / "consul.key"))
    with consul_agent(config_dir=tmp_path_factory.mktemp("consul"), check_certs=check_certs) as agent:
        yield agent


def _local(argv: list[str]) -> list[str]:
    """A container's command run here: `turnout` and `python` from this environment."""
    program = {"turnout": str(BIN / "turnout"), "python": sys.executable}.get(argv[0], argv[0])
    return [program, *argv[1:]]


def _environment(name: str, consul: Consul, certs: Path, **remapped: str) -> dict[str, str]:
    service = COMPOSE["services"][name]
    mounts = Mounts.of(service)
    environment = {k: mounts.host_path(v) for k, v in service_environment(service).items()}
    mounted = str(COMPOSE_DIR / "certs")
    environment = {k: v.replace(mounted, str(certs), 1) for k, v in environment.items()}
    prefix = "TURNOUT_GATEWAY" if name == "gateway" else "TURNOUT_SIDECAR"
    environment[f"{prefix}_CONSUL"] = consul.http
    environment[f"{prefix}_HOST"] = "127.0.0.1"
    environment[f"{prefix}_EXIT_TIMEOUT_SECS"] = "3"
    environment.update({f"{prefix}_{k.upper()}": v for k, v in remapped.items()})
    return environment


def _start(name: str, environment: dict[str, str], ready: str) -> Process:
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("TURNOUT_")]:
            patch.delenv(key)
        for key, value in environment.items():
            patch.setenv(key, value)
        return spawn(_local(service_argv(COMPOSE["services"][name])), ready)


def _healthcheck(name: str, environment: dict[str, str]) -> int:
    test = COMPOSE["services"][name]["healthcheck"]["test"]
    assert test[0] == "CMD", "turnout services check without a shell"
    env = {**os.environ, **environment}
    return subprocess.run(_local(test[1:]), env=env, timeout=30, check=False).returncode


def _infer_linear(client: Any, module: Any, headers: dict[str, str] | None = None) -> tuple[str, np.ndarray]:
    data = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    infer_input = module.InferInput("INPUT0", list(data.shape), "FP32")
    infer_input.set_data_from_numpy(data)
    result = client.infer("linear", [infer_input], headers=headers)
    return str(
        result.get_response()["model_version"] if module is httpclient else result.get_response().model_version
    ), result.as_numpy("OUTPUT0")


def test_compose_topology_serves_tritonclient(consul: Consul, certs: Path) -> None:
    sidecar_env = {
        name: _environment(
            name, consul, certs, port=str(free_port()), lane_port=str(free_port()), metrics_port=str(free_port())
        )
        for name in CPU_SIDECARS
    }
    sidecars = [_start(name, sidecar_env[name], SIDECAR_READY) for name in CPU_SIDECARS]
    with running(*sidecars):
        for name in CPU_SIDECARS:  # the compose health check, as Docker would run it
            assert _healthcheck(name, sidecar_env[name]) == 0, name
        gateway_env = _environment("gateway", consul, certs, http_port="0", grpc_port="0", metrics_port="0")
        gateway = _start("gateway", gateway_env, GATEWAY_READY)
        with running(gateway):
            http = httpclient.InferenceServerClient(gateway.fields["http"])
            grpc = grpcclient.InferenceServerClient(gateway.fields["grpc"])
            wait_until(lambda: http.is_model_ready("simple") and http.is_model_ready("linear"), 30, "models ready")
            assert (
                _healthcheck(
                    "gateway", {**gateway_env, "TURNOUT_GATEWAY_HTTP_PORT": gateway.fields["http"].rsplit(":", 1)[1]}
                )
                == 0
            )

            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [
                grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            np.testing.assert_array_equal(grpc.infer("simple", inputs).as_numpy("OUTPUT0"), a + 1)

            # The mounted routing file (compose/routing.yaml) is in force: sticky users keep a version.
            versions = {_infer_linear(http, httpclient, {"x-user": "ada"})[0] for _ in range(5)}
            assert len(versions) == 1 and versions <= {"1", "2"}

            # The documented live change: a policy written under the gateway's KV prefix.
            prefix = gateway_env["TURNOUT_GATEWAY_ROUTING_KV_PREFIX"]
            consul.put(f"/v1/kv/{prefix}linear", json.dumps({"weights": {"2": 100}}).encode())
            try:
                wait_until(lambda: _infer_linear(grpc, grpcclient)[0] == "2", 15, "the KV weights to apply")
                _, output = _infer_linear(grpc, grpcclient)
                np.testing.assert_allclose(output, [[2.0, 4.0, 6.0, 8.0]])
            finally:
                consul.delete(f"/v1/kv/{prefix}linear")
            http.close()
            grpc.close()
        # The sidecars answer only holders of a certificate the CA signed: not a plain client.
        plain = grpcclient.InferenceServerClient(sidecars[0].fields["grpc"])
        with plain, pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
