"""Every container of every overlay runs a command and environment the real `turnout` CLI
accepts, and its ports, probes, NetworkPolicy, stop timing, model repository, Consul
access and GPUs agree with what those flags parse to; a renamed flag fails here, not at
`kubectl apply`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.routing.policy_sources import read_routing_file
from sidecars.server import FLEET_HEALTH_SERVICE
from tests.kubernetes.manifests import (
    OVERLAYS,
    build,
    by_component,
    containers,
    image_name,
    labels_match,
    of_kind,
    pod_annotations,
    pod_labels,
)

# --- the containers against the real CLI ------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_command_and_environment_the_cli_accepts(overlay: str, tmp_path: Path) -> None:
    for container in containers(build(overlay)):
        params, problems = container.parse(tmp_path)
        assert problems == [], container.name
        assert params, container.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_ports_and_probes_are_the_ones_it_opens(overlay: str, tmp_path: Path) -> None:
    (gateway,) = by_component(overlay, "gateway")
    params, _ = gateway.parse(tmp_path)
    assert gateway.argv()[:2] == ["turnout", "gateway"]
    assert params["host"] == "0.0.0.0"
    assert {p["name"]: p["containerPort"] for p in gateway.spec["ports"]} == {
        "http": params["http_port"],
        "grpc": params["grpc_port"],
        "metrics": params["metrics_port"],
    }
    probes = {kind: gateway.spec[f"{kind}Probe"]["httpGet"] for kind in ("liveness", "readiness")}
    assert probes["liveness"]["path"] == "/v2/health/live"
    assert probes["readiness"]["path"] == "/v2/health/ready"
    for probe in probes.values():
        assert gateway.port(probe["port"]) == params["http_port"]
        assert probe.get("scheme", "HTTP") == ("HTTPS" if params["http_ssl_certfile"] else "HTTP")
    assert params["consul"], "gateways find the sidecars in Consul"
    # The routing file is the turnout-routing ConfigMap, mounted where --routing points.
    routing = Path(params["routing"])
    assert gateway.mounts()[str(Path(gateway.environment()["TURNOUT_GATEWAY_ROUTING"]).parent)]["configMap"]
    assert read_routing_file(str(routing))
    (service,) = of_kind(build(overlay), "Service").values()
    assert {p["name"]: gateway.port(p["targetPort"]) for p in service["spec"]["ports"]} == {
        "http": params["http_port"],
        "grpc": params["grpc_port"],
        "metrics": params["metrics_port"],
    }
    assert labels_match({"matchLabels": service["spec"]["selector"]}, pod_labels(overlay, "gateway"))
    annotations = pod_annotations(overlay, "gateway")
    assert int(annotations["prometheus.io/port"]) == params["metrics_port"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecars_register_their_pod_ip_and_probe_the_ports_they_open(overlay: str, tmp_path: Path) -> None:
    sidecars = by_component(overlay, "sidecar")
    assert sidecars
    for sidecar in sidecars:
        params, _ = sidecar.parse(tmp_path)
        assert sidecar.argv()[:2] == ["turnout", "sidecar"], sidecar.name
        assert sidecar.deployment == f"sidecar-{params['framework']}"
        assert params["host"] == "0.0.0.0" and params["lane"] == "tcp"
        assert {p["name"]: p["containerPort"] for p in sidecar.spec["ports"]} == {
            "grpc": params["port"],
            "lane": params["lane_port"],
            "metrics": params["metrics_port"],
        }
        assert params["consul"], "a sidecar registers itself in Consul"
        # The downward API's pod IP: what gateways and Consul's check reach.
        (advertise,) = (v for v in sidecar.spec["env"] if v["name"] == "TURNOUT_SIDECAR_ADVERTISE_ADDRESS")
        assert advertise["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        ready, live = sidecar.spec["readinessProbe"]["grpc"], sidecar.spec["livenessProbe"]["grpc"]
        assert sidecar.port(ready["port"]) == sidecar.port(live["port"]) == params["port"]
        assert ready.get("service", "") == ""  # every model loaded is READY
        assert live["service"] == FLEET_HEALTH_SERVICE  # alive and not stopping
        assert int(pod_annotations(overlay, sidecar.deployment)["prometheus.io/port"]) == params["metrics_port"]
        assert pod_labels(overlay, sidecar.deployment)["framework"] == params["framework"]
        assert pod_labels(overlay, sidecar.deployment)["device"] == params["device"].rstrip("0123456789")
    # One sidecar lists the model folders no framework serves, as in compose.
    reporting = [s.deployment for s in sidecars if s.parse(tmp_path)[0]["report_unassigned_models"]]
    assert reporting == ["sidecar-onnxruntime"]


def _peer(peer: dict[str, Any], gateway_labels: dict[str, str]) -> str:
    """Who a NetworkPolicy peer lets in: `gateway`, `consul` (agents: some namespace's
    labelled pods, or addresses outside the cluster), or `other`."""
    if set(peer) == {"podSelector"} and labels_match(peer["podSelector"], gateway_labels):
        return "gateway"
    if set(peer) == {"ipBlock"}:
        return "consul"
    if peer.get("podSelector", {}).get("matchLabels") and peer.get("namespaceSelector", {}).get("matchLabels"):
        return "consul"
    return "other"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_gateways_and_consul_reach_the_sidecars_grpc_and_lane(overlay: str, tmp_path: Path) -> None:
    (policy,) = of_kind(build(overlay), "NetworkPolicy").values()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    gateway_labels = pod_labels(overlay, "gateway")
    for sidecar in by_component(overlay, "sidecar"):
        assert labels_match(policy["spec"]["podSelector"], pod_labels(overlay, sidecar.deployment))
        params, _ = sidecar.parse(tmp_path)
        private = {params["port"], params["lane_port"]}
        gateways_reach: set[int] = set()
        for rule in policy["spec"]["ingress"]:
            ports = {sidecar.port(p["port"]) for p in rule["ports"]}
            for peer in rule["from"]:
                who = _peer(peer, gateway_labels)
                if who == "gateway":
                    gateways_reach |= ports
                elif who == "consul":  # its gRPC health check, nothing else
                    assert ports & private <= {params["port"]}, (sidecar.name, rule)
                else:
                    assert not ports & private, (sidecar.name, rule)
        assert gateways_reach >= private | {params["metrics_port"]}, sidecar.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecars_on_pod_addresses_take_mutual_tls_or_the_network_policy_as_their_gate(
    overlay: str, tmp_path: Path
) -> None:
    # A sidecar on 0.0.0.0 without mutual TLS refuses to start unless told the network is
    # its gate; the NetworkPolicy that makes that true is checked above.
    assert of_kind(build(overlay), "NetworkPolicy")
    for sidecar in by_component(overlay, "sidecar"):
        params, _ = sidecar.parse(tmp_path)
        assert params["host"] == "0.0.0.0", sidecar.name
        assert params["grpc_use_ssl_mutual"] or params["allow_unauthenticated_network"], sidecar.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_the_drain(overlay: str, tmp_path: Path) -> None:
    for container in containers(build(overlay)):
        params, _ = container.parse(tmp_path)
        grace = container.pod["terminationGracePeriodSeconds"]
        pause = 0
        if "lifecycle" in container.spec:
            command = container.spec["lifecycle"]["preStop"]["exec"]["command"]
            assert command[0] == "sleep", container.name
            pause = int(command[1])
        exit_timeout = params["exit_timeout_secs"]
        # A gateway leaves the Service's endpoints while it pauses, then drains; a sidecar
        # deregisters from Consul (a 5 s call at most) before it drains.
        if container.argv()[1] == "gateway":
            assert pause >= 5, "kube-proxy needs a moment to take the gateway out"
        else:
            assert pause == 0, "SIGTERM deregisters first; a pause would keep a leaving sidecar in rotation"
        assert pause + exit_timeout + 5 <= grace <= pause + exit_timeout + 30, container.name


# --- repositories, Consul, GPUs ------------------------------------------------------------


def test_each_repository_overlay_serves_its_source(tmp_path: Path) -> None:
    for overlay, expected in {"pvc": "/models", "s3": "s3://", "gcs": "gs://"}.items():
        for sidecar in by_component(overlay, "sidecar"):
            (repository,) = sidecar.parse(tmp_path)[0]["model_repositories"]
            assert repository.startswith(expected), (overlay, sidecar.name)
            environment = sidecar.environment()
            if overlay == "pvc":
                volume = sidecar.mounts()["/models"]
                assert volume["persistentVolumeClaim"]["readOnly"] is True
                assert volume["persistentVolumeClaim"]["claimName"] in of_kind(build(overlay), "PersistentVolumeClaim")
            if overlay == "s3":
                assert {"secretRef": {"name": "turnout-s3"}} in sidecar.spec["envFrom"]
            if overlay == "gcs":
                credentials = Path(environment["GOOGLE_APPLICATION_CREDENTIALS"])
                assert "secret" in sidecar.mounts()[str(credentials.parent)]


def test_an_existing_consul_is_reached_over_https_with_tokens_and_a_ca_from_secrets(tmp_path: Path) -> None:
    for container in containers(build("existing-consul")):
        params, _ = container.parse(tmp_path)
        assert params["consul"].startswith("https://")
        mounts = container.mounts()
        prefix = "TURNOUT_GATEWAY" if container.argv()[1] == "gateway" else "TURNOUT_SIDECAR"
        environment = container.environment()
        token = mounts[str(Path(environment[f"{prefix}_CONSUL_TOKEN_FILE"]).parent)]["secret"]["secretName"]
        authority = mounts[str(Path(environment[f"{prefix}_CONSUL_CA_CERT"]).parent)]["secret"]["secretName"]
        side = "gateway" if prefix == "TURNOUT_GATEWAY" else "sidecar"
        assert token == f"turnout-consul-{side}-token", "each side has a token of its own policy"
        assert authority == "turnout-consul-ca"


def test_gpu_sidecars_hold_one_gpu_each_and_cpu_overlays_none(tmp_path: Path) -> None:
    gpu_images = {
        "sidecar-onnxruntime": "turnout/onnxruntime-gpu",
        "sidecar-pytorch": "turnout/pytorch-gpu",
        "sidecar-tensorrt": "turnout/tensorrt",
    }
    for overlay in OVERLAYS:
        on_gpu = {}
        for container in containers(build(overlay)):
            limits = container.spec["resources"]["limits"]
            if "nvidia.com/gpu" in limits:
                assert limits["nvidia.com/gpu"] == 1
                assert container.parse(tmp_path)[0]["device"] == "gpu"
                on_gpu[container.deployment] = image_name(container.spec["image"])
        if overlay in ("gpu", "production"):
            assert on_gpu == gpu_images
        else:
            assert on_gpu == {}, overlay
