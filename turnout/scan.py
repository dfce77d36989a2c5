"""What `turnout up` finds in its model repositories before any sidecar starts: each model
folder's framework and config text, the frameworks to start, and which sidecar loads which
`--load-model` name. Reads listings and config.pbtxt files only, never a model file."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.layout import config_path, framework_of_model
from protos.remote import RemoteError, RemoteRepository, is_remote, parse_location

log = logging.getLogger("turnout.supervisor")

DEFAULT_FRAMEWORK = "onnxruntime"


@dataclass(frozen=True)
class FoundModel:
    """A model folder as `turnout up` sees it before any sidecar starts."""

    framework: str | None
    config_text: str


def models_in(repositories: Sequence[str], config_name: str = "") -> dict[str, FoundModel]:
    """Every model folder of the repositories by name, from listings and config files
    only (the first repository wins a name found twice; its sidecar reports that);
    `config_name`: Triton's --model-config-name (layout.config_key)."""
    found: dict[str, FoundModel] = {}
    for repository in repositories:
        for name, model in _models_of(repository, config_name).items():
            found.setdefault(name, model)
    return found


def _models_of(repository: str, config_name: str) -> dict[str, FoundModel]:
    if is_remote(repository):
        try:
            listed = RemoteRepository(parse_location(repository), config_name).scan()
        except RemoteError as exc:
            # Left to the sidecars, which report an unreadable repository under --exit-on-error.
            log.error("failed to poll model repository '%s': %s", repository, exc)
            return {}
        return {name: FoundModel(m.framework, m.config_text) for name, m in listed.items()}
    models = {}
    for model_dir in sorted(Path(repository).iterdir()):
        if model_dir.is_dir():  # hidden folders too: Triton takes every folder for a model
            config = config_path(model_dir, config_name)
            text = config.read_text() if config.is_file() else ""
            models[model_dir.name] = FoundModel(framework_of_model(model_dir, text), text)
    return models


def frameworks_in(models: dict[str, FoundModel]) -> list[str]:
    """The frameworks the models need, in a stable order."""
    found = {model.framework for model in models.values() if model.framework}
    # An empty repository still gets the default sidecar, so explicit loads have a home.
    return sorted(found) or [DEFAULT_FRAMEWORK]


def startup_loads(
    models: dict[str, FoundModel], names: Sequence[str], frameworks: Sequence[str]
) -> dict[str, list[str]]:
    """Which sidecar loads which `--load-model` name: each model its own framework's
    sidecar, with an ensemble's composing models (Triton loads them together), and a
    name found nowhere every sidecar, so the start fails with Triton's text."""
    if "*" in names:
        return {framework: ["*"] for framework in frameworks}
    loads: dict[str, list[str]] = {framework: [] for framework in frameworks}
    for name in _with_steps(models, names):
        model = models.get(name)
        if model is not None and model.framework is None:
            loads[frameworks[0]].append(name)  # the sidecar that reports unassigned folders
        elif model is None or model.framework not in loads:
            for wanted in loads.values():
                wanted.append(name)
        else:
            loads[model.framework].append(name)
    return loads


def startup_steps(models: dict[str, FoundModel], names: Sequence[str]) -> list[str]:
    """The models `--load-model` loads only as an ensemble's steps: Triton's dependency
    graph holds them as loaded with it, so unloading it with `unload_dependents` takes them."""
    if "*" in names:
        return []  # every model is named
    return [name for name in _with_steps(models, names) if name not in names]


def _with_steps(models: dict[str, FoundModel], names: Sequence[str]) -> list[str]:
    """`names`, each followed by the step models of those that are ensembles, once each."""
    found: list[str] = []
    pending, seen = list(names), set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        found.append(name)
        model = models.get(name)
        if model is not None and model.framework is not None:
            pending += _composing_models(model.config_text)
    return found


def _composing_models(config_text: str) -> list[str]:
    """The step models of an ensemble config (none for other models or a bad config,
    which the ensemble's own load reports)."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(config_text, config)
    except text_format.ParseError:
        return []
    return [step.model_name for step in config.ensemble_scheduling.step]
