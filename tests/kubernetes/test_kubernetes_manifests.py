"""deploy/kubernetes/ without a cluster: every overlay builds with `kubectl kustomize`, every
object validates against the schemas of the three newest Kubernetes minors that
kubernetes-validate knows (the Prometheus Operator's kinds against models generated from
its CRDs), and every container's command, environment, ports and probes agree with what
the real `turnout` CLI parses."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.routing.policy_sources import read_routing_file
from sidecars.server import FLEET_HEALTH_SERVICE
from tests.harness import ROOT
from tests.kubernetes.manifests import (
    KUBERNETES_DIR,
    OVERLAYS,
    Container,
    build,
    containers,
    documented_secrets,
    image_name,
    of_kind,
)

COMPOSE_DIR = ROOT / "compose"
GUIDE = ROOT / "docs" / "kubernetes.md"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
BUILD_ARGUMENTS = {
    "turnout/onnxruntime-gpu": ["EXTRA=onnxruntime-gpu"],
    "turnout/pytorch": ["TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"],
}
# The kinds the Prometheus Operator adds; no core schema has them.
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}


NO_VALIDATOR = "no {package}: `make setup` installs it with the test extra (`pip install -e '.[test]'`)"


def _newest_minors(count: int = 3) -> list[str]:
    try:
        from kubernetes_validate.utils import all_versions, major_minor
    except ImportError:
        return ["newest"]  # the test skips, saying what to install
    minors = sorted({major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    return minors[-count:]


def _by_component(overlay: str, component: str) -> list[Container]:
    deployments = of_kind(build(overlay), "Deployment")
    return [
        c
        for c in containers(build(overlay))
        if deployments[c.deployment]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


# --- building and schemas -------------------------------------------------------------------


def test_the_overlays_cover_each_repository_source_gpu_consul_and_monitoring() -> None:
    assert {"pvc", "s3", "gcs", "gpu", "existing-consul", "prometheus-operator"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_overlay_builds_the_whole_deployment(overlay: str) -> None:
    objects = build(overlay)
    deployments = of_kind(objects, "Deployment")
    assert {"gateway", "sidecar-onnxruntime", "sidecar-pytorch", "sidecar-ensemble"} <= set(deployments)
    assert set(of_kind(objects, "Service")) == {"gateway"}  # sidecars are found through Consul
    (autoscaler,) = of_kind(objects, "HorizontalPodAutoscaler").values()
    assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert set(of_kind(objects, "NetworkPolicy")) == {"sidecar"}
    budgets = of_kind(objects, "PodDisruptionBudget").values()
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert _labels_match(deployment["spec"]["selector"], labels), name
        covering = [b for b in budgets if _labels_match(b["spec"]["selector"], labels)]
        assert len(covering) == 1, f"{name} has {len(covering)} PodDisruptionBudgets"
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
    assert namespaces == {"turnout"}, "every object lands in the overlay's namespace"


@pytest.mark.parametrize("version", _newest_minors())
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str, version: str) -> None:
    pytest.importorskip("kubernetes_validate", reason=NO_VALIDATOR.format(package="kubernetes-validate"))
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, validate

    problems = []
    for item in build(overlay):
        if item["kind"] in OPERATOR_KINDS:
            continue  # the next test
        try:
            # strict: a field the schema does not know (a typo, a field of another
            # version) fails too.
            validate(item, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{item['kind']}/{item['metadata']['name']}: {where}: {exc.message}")
        except SchemaNotFoundError as exc:
            problems.append(exc.message)
    assert problems == [], f"Kubernetes {version}"


@pytest.mark.parametrize("overlay", ["prometheus-operator", "production"])
def test_prometheus_operator_objects_match_their_crds(overlay: str) -> None:
    """kubernetes-validate has no schema for custom resources. These are checked against the
    Prometheus Operator's own CRD schemas, as generated into pydantic models: parsing
    checks every type and enum, and a round trip that must give the object back unchanged
    catches fields the CRD does not have (pydantic drops those)."""
    operator = NO_VALIDATOR.format(package="cloudcoil-models-prometheus-operator")
    pytest.importorskip("cloudcoil.models.prometheus_operator", reason=operator)
    from cloudcoil.models.prometheus_operator import v1

    models = {"ServiceMonitor": v1.ServiceMonitor, "PodMonitor": v1.PodMonitor}
    assert {i["kind"] for i in build(overlay)} >= OPERATOR_KINDS
    for item in build(overlay):
        if item["kind"] in OPERATOR_KINDS:
            assert item["apiVersion"] == "monitoring.coreos.com/v1"
            parsed = models[item["kind"]].model_validate(item)
            assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == item


def test_an_unknown_field_fails_the_custom_resource_check() -> None:
    operator = NO_VALIDATOR.format(package="cloudcoil-models-prometheus-operator")
    pytest.importorskip("cloudcoil.models.prometheus_operator", reason=operator)
    from cloudcoil.models.prometheus_operator import v1

    (monitor,) = (i for i in build("prometheus-operator") if i["kind"] == "ServiceMonitor")
    wrong = json.loads(json.dumps(monitor))
    wrong["spec"]["endpoints"][0]["metricRelabelling"] = wrong["spec"]["endpoints"][0].pop("metricRelabelings")
    parsed = v1.ServiceMonitor.model_validate(wrong)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") != wrong


def test_a_wrong_field_fails_the_kubernetes_schema() -> None:
    pytest.importorskip("kubernetes_validate", reason=NO_VALIDATOR.format(package="kubernetes-validate"))
    from kubernetes_validate.utils import ValidationError, validate

    deployment = json.loads(json.dumps(of_kind(build("pvc"), "Deployment")["gateway"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/v2"
    with pytest.raises(ValidationError):
        validate(deployment, _newest_minors()[-1], strict=True)


# --- the containers against the real CLI ------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_command_and_environment_the_cli_accepts(overlay: str, tmp_path: Path) -> None:
    for container in containers(build(overlay)):
        params, problems = container.parse(tmp_path)
        assert problems == [], container.name
        assert params, container.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_ports_and_probes_are_the_ones_it_opens(overlay: str, tmp_path: Path) -> None:
    (gateway,) = _by_component(overlay, "gateway")
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
    assert _labels_match({"matchLabels": service["spec"]["selector"]}, _pod_labels(overlay, "gateway"))
    annotations = _pod_annotations(overlay, "gateway")
    assert int(annotations["prometheus.io/port"]) == params["metrics_port"]


def _pod_labels(overlay: str, deployment: str) -> dict[str, str]:
    return dict(of_kind(build(overlay), "Deployment")[deployment]["spec"]["template"]["metadata"]["labels"])


def _pod_annotations(overlay: str, deployment: str) -> dict[str, str]:
    metadata = of_kind(build(overlay), "Deployment")[deployment]["spec"]["template"]["metadata"]
    return dict(metadata.get("annotations", {}))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecars_register_their_pod_ip_and_probe_the_ports_they_open(overlay: str, tmp_path: Path) -> None:
    sidecars = _by_component(overlay, "sidecar")
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
        assert int(_pod_annotations(overlay, sidecar.deployment)["prometheus.io/port"]) == params["metrics_port"]
        assert _pod_labels(overlay, sidecar.deployment)["framework"] == params["framework"]
        assert _pod_labels(overlay, sidecar.deployment)["device"] == params["device"].rstrip("0123456789")
    # One sidecar lists the model folders no framework serves, as in compose.
    reporting = [s.deployment for s in sidecars if s.parse(tmp_path)[0]["report_unassigned_models"]]
    assert reporting == ["sidecar-onnxruntime"]


def _peer(peer: dict[str, Any], gateway_labels: dict[str, str]) -> str:
    """Who a NetworkPolicy peer lets in: `gateway`, `consul` (agents: some namespace's
    labelled pods, or addresses outside the cluster), or `other`."""
    if set(peer) == {"podSelector"} and _labels_match(peer["podSelector"], gateway_labels):
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
    gateway_labels = _pod_labels(overlay, "gateway")
    for sidecar in _by_component(overlay, "sidecar"):
        assert _labels_match(policy["spec"]["podSelector"], _pod_labels(overlay, sidecar.deployment))
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_unprivileged_with_resources(overlay: str) -> None:
    for container in containers(build(overlay)):
        pod_context, context = container.pod["securityContext"], container.spec["securityContext"]
        assert pod_context["runAsNonRoot"] is True and pod_context["runAsUser"] != 0
        assert context["readOnlyRootFilesystem"] is True, container.name
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        assert "emptyDir" in container.mounts()["/tmp"], "the one writable place"
        resources = container.spec["resources"]
        for group in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[group]), (container.name, group)


# --- images, repositories, Consul, GPUs ---------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_built_by_a_dockerfile_in_compose(overlay: str) -> None:
    guide = GUIDE.read_text()
    for container in containers(build(overlay)):
        reference = container.spec["image"]
        name = image_name(reference)
        assert name.startswith("turnout/"), reference
        dockerfile = COMPOSE_DIR / f"{name.removeprefix('turnout/').removesuffix('-gpu')}.Dockerfile"
        assert dockerfile.exists(), f"{container.name}: {reference} has no {dockerfile.name}"
        assert reference.endswith(f":{VERSION}"), f"{reference}: tag the images with the project's version"
        # The guide says how to build it: a GPU image is its Dockerfile with GPU build
        # arguments (PyPI's torch is the CUDA build, so the CPU image names the CPU index).
        (command,) = [line for line in guide.splitlines() if f" -t {name}:" in line]
        assert f"-f compose/{dockerfile.name} " in command, command
        for argument in BUILD_ARGUMENTS.get(name, ()):
            assert f"--build-arg {argument}" in command, command
            assert re.search(rf"^ARG {argument.split('=')[0]}\b", dockerfile.read_text(), re.M), argument


def test_each_repository_overlay_serves_its_source(tmp_path: Path) -> None:
    for overlay, expected in {"pvc": "/models", "s3": "s3://", "gcs": "gs://"}.items():
        for sidecar in _by_component(overlay, "sidecar"):
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


def test_every_secret_the_pods_read_is_in_the_guide() -> None:
    guide = GUIDE.read_text()
    for overlay in OVERLAYS:
        for secret in documented_secrets(build(overlay)):
            assert f"secret generic {secret}" in guide, f"{overlay} reads Secret {secret}: say how to make it"


# --- Prometheus and Grafana ------------------------------------------------------------------


def test_nv_metrics_come_from_sidecars_only() -> None:
    objects = build("prometheus-operator")
    monitors, pod_monitors = of_kind(objects, "ServiceMonitor"), of_kind(objects, "PodMonitor")
    (gateway_monitor,) = monitors.values()
    (service,) = of_kind(objects, "Service").values()
    assert _labels_match(gateway_monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = gateway_monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert {"sourceLabels": ["__name__"], "regex": "nv_.*", "action": "drop"} in endpoint["metricRelabelings"]
    (sidecar_monitor,) = pod_monitors.values()
    (pod_endpoint,) = sidecar_monitor["spec"]["podMetricsEndpoints"]
    assert "metricRelabelings" not in pod_endpoint, "sidecars are the source of nv_*"
    for sidecar in _by_component("prometheus-operator", "sidecar"):
        assert _labels_match(
            sidecar_monitor["spec"]["selector"], _pod_labels("prometheus-operator", sidecar.deployment)
        )
        sidecar.port(pod_endpoint["port"])


def test_the_dashboard_config_map_is_the_compose_dashboard() -> None:
    dashboards = [
        c
        for c in of_kind(build("prometheus-operator"), "ConfigMap").values()
        if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    (dashboard,) = dashboards
    source = COMPOSE_DIR / "grafana" / "dashboards" / "turnout.json"
    assert dashboard["data"] == {"turnout.json": source.read_text()}
    assert "turnout.json" not in {p.name for p in KUBERNETES_DIR.rglob("*.json")}, "one copy, in compose/"
