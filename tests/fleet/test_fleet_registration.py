"""Sidecars register themselves in Consul and leave it on SIGTERM; a gateway watching
Consul starts using a new sidecar within seconds; loads and unloads through the gateway
reach every replica and show in the registration's meta."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from protos.ready import SIDECAR_READY
from tests.fleet.fleet_harness import Consul, free_port, gateway, registered_models, running, sidecar, spawn, wait_until


def _simple_inputs() -> list[grpcclient.InferInput]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def _inferences(address: str, model: str = "simple") -> int:
    """How many inferences a sidecar (spoken to directly: it serves the v2 service) ran."""
    with grpcclient.InferenceServerClient(address) as client:
        stats = client.get_inference_statistics(model).model_stats
    return sum(s.inference_count for s in stats)


def test_registration_meta_and_deregistration(consul: Consul, fleet_repository: Path) -> None:
    service = "reg-meta"
    one = sidecar(consul.http, fleet_repository, f"--consul-service={service}", "--device=cpu")
    with running(one):
        entries = wait_until(lambda: consul.services(service), 15, "the sidecar's registration")
        (entry,) = entries.values()
        host, port = one.fields["grpc"].rsplit(":", 1)
        assert (entry["Address"], entry["Port"]) == (host, int(port))
        assert entry["Meta"]["framework"] == "onnxruntime" and entry["Meta"]["device"] == "cpu"
        assert registered_models(entry) == "linear:1,2;simple:1"
        assert entry["Meta"]["lane"].startswith(host + ":")
        checks = consul.get(f"/v1/health/checks/{service}")
        assert checks and checks[0]["Type"] == "grpc"
        assert wait_until(lambda: consul.passing(service), 15, "a passing health check")
        assert one.stop() == 0
    assert consul.services(service) == {}, one.output()
    assert "deregistered" in one.output()


def test_sidecar_retries_until_consul_answers(consul: Consul, fleet_repository: Path) -> None:
    # Nothing listens on the port yet: the sidecar serves anyway and says it is retrying.
    away = f"127.0.0.1:{free_port()}"
    one = sidecar(away, fleet_repository, "--consul-service=reg-retry")
    with running(one):
        wait_until(lambda: "unreachable (attempt 2)" in one.output(), 15, "a retry log line")
        assert _inferences(one.fields["grpc"]) == 0  # it serves while Consul is away
        assert "retrying in" in one.output()


def test_new_sidecar_is_used_within_seconds(consul: Consul, fleet_repository: Path) -> None:
    service = "reg-join"
    first = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(gw, first), grpcclient.InferenceServerClient(gw.fields["grpc"]) as client:
        wait_until(lambda: consul.passing(service), 15, "the first sidecar")
        client.infer("simple", _simple_inputs())
        second = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
        with running(second):

            def second_served() -> bool:
                for _ in range(10):
                    client.infer("simple", _simple_inputs())
                return _inferences(second.fields["grpc"]) > 0

            wait_until(second_served, 10, "the gateway to route to the new sidecar", interval=0.01)
            # SIGTERM: it deregisters, and the gateway keeps answering from the first.
            assert second.stop() == 0
            for _ in range(20):
                client.infer("simple", _simple_inputs())


def test_load_and_unload_reach_every_replica(consul: Consul, fleet_repository: Path) -> None:
    service = "reg-control"
    flags = (f"--consul-service={service}", "--model-control-mode=explicit", "--load-model=simple")
    replicas = [sidecar(consul.http, fleet_repository, *flags) for _ in range(2)]
    gw = gateway(consul.http, f"--consul-service={service}", "--model-control-mode=explicit")
    with running(gw, *replicas), grpcclient.InferenceServerClient(gw.fields["grpc"]) as client:
        wait_until(lambda: len(consul.passing(service)) == 2, 15, "two passing replicas")
        client.load_model("linear")
        for replica in replicas:
            with grpcclient.InferenceServerClient(replica.fields["grpc"]) as direct:
                assert direct.is_model_ready("linear", "1") and direct.is_model_ready("linear", "2")
        index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
        assert index == {("linear", "1"): "READY", ("linear", "2"): "READY", ("simple", "1"): "READY"}

        def meta_lists_linear() -> bool:
            return all("linear:1,2" in registered_models(e) for e in consul.services(service).values())

        wait_until(meta_lists_linear, 10, "the registrations to list linear")
        client.unload_model("linear")
        for replica in replicas:
            with grpcclient.InferenceServerClient(replica.fields["grpc"]) as direct:
                assert not direct.is_model_ready("linear")
        wait_until(
            lambda: not any("linear" in registered_models(e) for e in consul.services(service).values()),
            10,
            "meta without linear",
        )
        index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
        assert index[("linear", "1")] == "UNAVAILABLE" and index[("simple", "1")] == "READY"


def test_turnout_sidecar_command_takes_consul(consul: Consul, fleet_repository: Path) -> None:
    command = [sys.executable, "-m", "turnout", "sidecar", "--framework=onnxruntime"]
    command += [f"--model-repository={fleet_repository}", f"--consul={consul.http}", "--consul-service=reg-cli"]
    one = spawn(command, SIDECAR_READY)
    with running(one):
        wait_until(lambda: consul.services("reg-cli"), 15, "turnout sidecar's registration")
