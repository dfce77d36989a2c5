"""deploy/kubernetes/ as files, without a cluster: every overlay builds with `kubectl
kustomize`, every object validates against the schemas of the three newest Kubernetes
minors that kubernetes-validate knows (the Prometheus Operator's kinds against models
generated from its CRDs), images come from compose/'s Dockerfiles, and the monitoring
follows the project's scrape rule."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import yaml

from tests.harness import ROOT
from tests.kubernetes.manifests import (
    KUBERNETES_DIR,
    OVERLAYS,
    build,
    by_component,
    containers,
    image_name,
    labels_match,
    of_kind,
    pod_annotations,
    pod_labels,
    secrets_read,
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
        assert labels_match(deployment["spec"]["selector"], labels), name
        covering = [b for b in budgets if labels_match(b["spec"]["selector"], labels)]
        assert len(covering) == 1, f"{name} has {len(covering)} PodDisruptionBudgets"
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
    assert namespaces == {"turnout"}, "every object lands in the overlay's namespace"
    for item in objects:
        assert item["metadata"]["labels"]["app.kubernetes.io/part-of"] == "turnout", item["metadata"]["name"]
    for deployment in deployments.values():
        assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "turnout"


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


# --- images, security, Secrets ---------------------------------------------------------


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


def test_every_secret_the_pods_read_is_in_the_guide() -> None:
    guide = GUIDE.read_text()
    for overlay in OVERLAYS:
        for secret in secrets_read(build(overlay)):
            assert f"secret generic {secret}" in guide, f"{overlay} reads Secret {secret}: say how to make it"


# --- Prometheus and Grafana ------------------------------------------------------------------


def test_nv_metrics_come_from_sidecars_only() -> None:
    objects = build("prometheus-operator")
    monitors, pod_monitors = of_kind(objects, "ServiceMonitor"), of_kind(objects, "PodMonitor")
    (gateway_monitor,) = monitors.values()
    (service,) = of_kind(objects, "Service").values()
    assert labels_match(gateway_monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = gateway_monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert {"sourceLabels": ["__name__"], "regex": "(nv|turnout_sidecar)_.*", "action": "drop"} in endpoint[
        "metricRelabelings"
    ]
    (sidecar_monitor,) = pod_monitors.values()
    (pod_endpoint,) = sidecar_monitor["spec"]["podMetricsEndpoints"]
    assert "metricRelabelings" not in pod_endpoint, "sidecars are the source of nv_*"
    for sidecar in by_component("prometheus-operator", "sidecar"):
        assert labels_match(sidecar_monitor["spec"]["selector"], pod_labels("prometheus-operator", sidecar.deployment))
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


def test_the_guides_plain_prometheus_job_drops_only_the_gateways_nv_metrics() -> None:
    text = GUIDE.read_text()
    section = text[text.index("**With plain Prometheus**") :]
    (job,) = yaml.safe_load(section[section.index("```yaml") + 7 : section.index("```", section.index("```yaml") + 7)])
    kept = {
        label.removeprefix("__meta_kubernetes_pod_annotation_").replace("_", ".", 1).replace("_", "/", 1)
        for rule in job["relabel_configs"]
        for label in rule["source_labels"]
        if "annotation" in label
    }
    annotations = pod_annotations("pvc", "gateway")
    assert kept == set(annotations), "the job reads the annotations the pods carry"
    (component,) = [r for r in job["relabel_configs"] if r.get("target_label") == "component"]
    label = component["source_labels"][0].removeprefix("__meta_kubernetes_pod_label_")
    assert label == "app_kubernetes_io_component"
    assert pod_labels("pvc", "gateway")["app.kubernetes.io/component"] == "gateway"
    (drop,) = job["metric_relabel_configs"]
    assert drop == {
        "source_labels": ["component", "__name__"],
        "regex": "gateway;(nv|turnout_sidecar)_.*",
        "action": "drop",
    }
