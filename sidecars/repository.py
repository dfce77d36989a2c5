"""The model repository as this sidecar sees it: its framework's model folders, their
version folders after the version policy, and temporary folders for uploaded files."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
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


class Repository:
    """Reads one repository folder; only models of `framework` are ever listed."""

    def __init__(self, root: Path, framework: str) -> None:
        self.root = root
        self.framework = framework

    def scan(self) -> dict[str, ModelFolder]:
        """Every model folder of this framework, by name. Anything else is ignored."""
        found: dict[str, ModelFolder] = {}
        if not self.root.is_dir():
            return found
        for entry in sorted(self.root.iterdir()):
            folder = self._folder(entry)
            if folder is not None:
                found[folder.name] = folder
        return found

    def find(self, name: str) -> ModelFolder | None:
        if not name or "/" in name or name in (".", ".."):
            return None
        return self._folder(self.root / name)

    def _folder(self, path: Path) -> ModelFolder | None:
        try:
            if not path.is_dir() or layout.framework_of_model(path) != self.framework:
                return None
            return ModelFolder(path.name, path, _fingerprint(path))
        except OSError:
            return None  # a folder removed or unreadable mid-scan is not a model


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
