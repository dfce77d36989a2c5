"""The model repository as this sidecar sees it: its framework's model folders, their
version folders after the version policy, and temporary folders for uploaded files."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from protos import layout
from protos import model_config_pb2 as mc
from sidecars.config import load_failure


@dataclass(frozen=True)
class ModelFolder:
    """A model folder and a fingerprint that changes when its files do (for polling)."""

    name: str
    path: Path
    fingerprint: tuple[tuple[str, int, int], ...]
    duplicates: tuple[Path, ...] = ()  # same name in other repositories: the model cannot load


class Repository:
    """Reads one or more repository folders; only models of `framework` are ever listed."""

    def __init__(self, roots: Sequence[Path], framework: str) -> None:
        self.roots = tuple(roots)
        self.framework = framework

    def scan(self) -> dict[str, ModelFolder]:
        """Every model folder of this framework, by name. Anything else is ignored."""
        found: dict[str, ModelFolder] = {}
        for root in self.roots:
            if not root.is_dir():
                continue
            for entry in sorted(root.iterdir()):
                folder = self._folder(entry)
                if folder is not None:
                    found[folder.name] = _merge(found.get(folder.name), folder)
        return found

    def find(self, name: str) -> ModelFolder | None:
        if not name or "/" in name or name in (".", ".."):
            return None
        found: ModelFolder | None = None
        for root in self.roots:
            folder = self._folder(root / name)
            if folder is not None:
                found = _merge(found, folder)
        return found

    def _folder(self, path: Path) -> ModelFolder | None:
        try:
            if not path.is_dir() or layout.framework_of_model(path) != self.framework:
                return None
            return ModelFolder(path.name, path, _fingerprint(path))
        except OSError:
            return None  # a folder removed or unreadable mid-scan is not a model


def _merge(first: ModelFolder | None, another: ModelFolder) -> ModelFolder:
    if first is None:
        return another
    return replace(first, duplicates=(*first.duplicates, another.path))


def duplicate_failure(folder: ModelFolder) -> str:
    places = ", ".join(str(p.parent) for p in (folder.path, *folder.duplicates))
    return f"model '{folder.name}' appears in more than one model repository ({places})"


def _fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    marks = []
    for entry in sorted(path.rglob("*")):
        if entry.is_file():
            stat = entry.stat()
            marks.append((str(entry.relative_to(path)), stat.st_mtime_ns, stat.st_size))
    return tuple(marks)


def version_numbers(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and layout.is_version_dir(p.name))


def select_versions(available: list[int], policy: mc.ModelVersionPolicy) -> list[int]:
    """The versions a version policy serves, ascending."""
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return list(available)
    if which == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions or 1
    return available[-count:]


class UploadedModel:
    """A temporary model folder holding a load request's `file:<version>/<name>` contents."""

    def __init__(self, model: str, files: dict[str, bytes]) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="turnout-model-"))
        self.path = self._root / model
        self.path.mkdir()
        try:
            for relative, content in files.items():
                target = (self.path / relative).resolve()
                if not target.is_relative_to(self.path.resolve()) or target == self.path.resolve():
                    raise load_failure(model, f"invalid file path '{relative}'")
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                except OSError as exc:  # e.g. a name past NAME_MAX: refuse it, keep serving
                    raise load_failure(model, "failed to poll from model repository") from exc
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
