"""compose/ as files: `docker-compose config` accepts them (with and without the gpu
profile), every path a Dockerfile copies exists, and Prometheus and Grafana configs parse."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.compose.compose_spec import COMPOSE_DIR, COMPOSE_FILE, load_compose
from tests.harness import ROOT

COMPOSE = load_compose()
DOCKERFILES = sorted(COMPOSE_DIR.glob("*.Dockerfile"))


def _docker_compose(*arguments: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip(
            "no docker-compose: `make tools` installs Debian's package where apt-get can (needs root); "
            "elsewhere install your package manager's docker-compose"
        )
    return subprocess.run(
        [binary, "--project-directory", str(COMPOSE_DIR), "-f", str(COMPOSE_FILE), *arguments, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("profiles", [(), ("gpu",)], ids=["cpu", "gpu"])
def test_docker_compose_config_validates(profiles: tuple[str, ...]) -> None:
    result = _docker_compose(*(f"--profile={p}" for p in profiles))
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {"consul", "gateway", "sidecar-onnxruntime", "sidecar-pytorch", "prometheus", "grafana"} <= set(services)
    # docker-compose 1.29 prints every service; `up` starts only those whose profile is on.
    in_gpu_profile = {name for name, service in services.items() if "gpu" in service.get("profiles", [])}
    assert in_gpu_profile == {"sidecar-onnxruntime-gpu", "sidecar-tensorrt"}


def test_gpu_sidecars_reserve_devices_and_cpu_ones_do_not() -> None:
    for name, service in COMPOSE["services"].items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if "gpu" in service.get("profiles", []):
            assert devices and all("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices), name
        else:
            assert not devices, name


def test_every_service_has_a_healthcheck_and_dependencies_wait_for_health() -> None:
    for name, service in COMPOSE["services"].items():
        assert service.get("healthcheck", {}).get("test"), name
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in COMPOSE["services"], (name, dependency)
            assert condition == {"condition": "service_healthy"}, (name, dependency)


def test_mounts_exist_and_the_model_repository_is_read_only() -> None:
    for name, service in COMPOSE["services"].items():
        for volume in service.get("volumes", []):
            source, target, *mode = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", volume).split(":")
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), (name, volume)
            if target == "/models":
                assert mode == ["ro"], (name, volume)


def _copied_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines():
        words = line.split()
        if words[:1] in (["COPY"], ["ADD"]) and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copied_path_exists_and_is_not_docker_ignored(dockerfile: Path) -> None:
    sources = _copied_sources(dockerfile)
    assert sources
    # .dockerignore leaves out everything (`*`) but what it names with `!`.
    rules = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in rules
    allowed = {line[1:].rstrip("/") for line in rules if line.startswith("!")}
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is not in the repository"
        assert source.rstrip("/") in allowed, f"{dockerfile.name} copies {source}, which .dockerignore leaves out"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_a_user_with_a_healthcheck_and_sigterm(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"^USER (?!root)\S+", text, re.M)
    assert re.search(r"^HEALTHCHECK ", text, re.M)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)


def _installed_extras(dockerfile: Path, **build_args: str) -> set[str]:
    """The extras the image's one `pip install` names, expanded by a real shell with the
    Dockerfile's ARG defaults overridden by `build_args`, as `docker build` would."""
    text = dockerfile.read_text()
    installs = re.findall(r"pip install (.*)", text)
    assert len(installs) == 1, dockerfile.name
    arguments = dict(re.findall(r"^ARG (\w+)=\"?([^\"\n]*)\"?$", text, re.M)) | build_args
    expanded = subprocess.run(
        ["sh", "-c", f"echo {installs[0]}"], env=arguments, capture_output=True, text=True, check=True
    ).stdout
    return {extra for group in re.findall(r"\.\[([^\]]*)\]", expanded) for extra in group.split(",")}


def test_each_sidecar_image_installs_only_its_own_framework_and_the_object_stores() -> None:
    # The gateway serves no framework; it exports OpenTelemetry spans (the trace extra).
    assert _installed_extras(COMPOSE_DIR / "gateway.Dockerfile") == {"trace"}
    frameworks = {
        "onnxruntime.Dockerfile": "onnxruntime",
        "pytorch.Dockerfile": "pytorch",
        "tensorrt.Dockerfile": "tensorrt",
    }
    for dockerfile in DOCKERFILES:
        framework = frameworks.get(dockerfile.name)
        if dockerfile.name == "gateway.Dockerfile":
            continue
        if dockerfile.name == "python.Dockerfile":  # no framework extra: python models need none
            assert _installed_extras(dockerfile) == {"s3", "gcs"}
            assert _installed_extras(dockerfile, STORAGE="") == set()
            continue
        if framework is None:
            assert _installed_extras(dockerfile) == set(), dockerfile.name
            continue
        assert _installed_extras(dockerfile) == {framework, "s3", "gcs"}, dockerfile.name
        assert _installed_extras(dockerfile, STORAGE="") == {framework}, dockerfile.name
    gpu = COMPOSE_DIR / "onnxruntime.Dockerfile"
    assert _installed_extras(gpu, EXTRA="onnxruntime-gpu") == {"onnxruntime-gpu", "s3", "gcs"}
    assert "-c constraints.txt" in (COMPOSE_DIR / "pytorch.Dockerfile").read_text()


def test_prometheus_discovers_sidecars_through_consul() -> None:
    config: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["turnout-sidecar"]["consul_sd_configs"][0]["services"] == ["turnout-sidecar"]
    # The scrape address is the metrics address each sidecar advertises, no fixed port.
    relabels = jobs["turnout-sidecar"]["relabel_configs"]
    address = [r for r in relabels if r.get("target_label") == "__address__"]
    assert address == [{"source_labels": ["__meta_consul_service_metadata_metrics"], "target_label": "__address__"}]
    assert "static_configs" not in jobs["turnout-gateway"]  # every gateway replica, found by DNS
    gateway_port = int(COMPOSE["services"]["gateway"]["environment"]["TURNOUT_GATEWAY_METRICS_PORT"])
    assert jobs["turnout-gateway"]["dns_sd_configs"][0]["port"] == gateway_port


def test_grafana_provisioning_and_dashboard_parse() -> None:
    provisioning = COMPOSE_DIR / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    provider = yaml.safe_load((provisioning / "dashboards" / "turnout.yml").read_text())
    dashboards = list((COMPOSE_DIR / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    uid = datasource["datasources"][0]["uid"]
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        assert dashboard["panels"]
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == uid
            assert all(target["expr"] for target in panel["targets"])
    # Grafana reads the dashboards where the compose file mounts them.
    mounts = dict(v.split(":")[:2] for v in COMPOSE["services"]["grafana"]["volumes"] if v.startswith("."))
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]


MODEL_HOST = COMPOSE_DIR / "model-host.yml"
JOINING = {"CONSUL_ADDRESS": "10.0.0.7:8500", "HOST_ADDRESS": "10.0.0.7"}


def test_a_model_host_file_validates_and_asks_for_consul_and_its_address() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("no docker-compose: `make tools` installs Debian's package where apt-get can (needs root)")
    command = [binary, "--project-directory", str(COMPOSE_DIR), "-f", str(MODEL_HOST), "config"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **JOINING})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert set(services) == {"sidecar-onnxruntime", "sidecar-ensemble"}
    for service in services.values():
        assert service["environment"]["TURNOUT_SIDECAR_CONSUL"] == "10.0.0.7:8500"
        assert service["environment"]["TURNOUT_SIDECAR_ADVERTISE_ADDRESS"] == "10.0.0.7"
    missing = subprocess.run(command, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode != 0 and "Consul agent to register with" in missing.stderr


def test_a_model_host_runs_the_one_host_sidecars_without_a_local_consul() -> None:
    joining = yaml.safe_load(MODEL_HOST.read_text())["services"]
    for name, service in joining.items():
        local = COMPOSE["services"][name]
        for key in ("build", "command", "volumes", "healthcheck", "stop_signal", "stop_grace_period", "init"):
            assert service[key] == local[key], (name, key)
        assert "depends_on" not in service
        ports = {e.split(":")[0] for e in service["ports"]}
        env = service["environment"]
        assert ports == {
            env["TURNOUT_SIDECAR_PORT"],
            env["TURNOUT_SIDECAR_LANE_PORT"],
            env["TURNOUT_SIDECAR_METRICS_PORT"],
        }
        same = {k: v for k, v in local["environment"].items() if k not in env or env[k] == v}
        assert set(local["environment"]) - set(same) <= {
            "TURNOUT_SIDECAR_CONSUL",
            "TURNOUT_SIDECAR_PORT",
            "TURNOUT_SIDECAR_LANE_PORT",
            "TURNOUT_SIDECAR_METRICS_PORT",
        }, name
