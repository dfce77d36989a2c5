"""The model repositories as this sidecar sees them: its framework's model folders in
local folders and object stores (s3://, gs://), local copies of remote ones to load from,
their version folders after the version policy, and temporary folders for uploaded files."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from protos import layout
from protos import model_config_pb2 as mc
from protos.remote import RemoteError, RemoteModel, RemoteRepository, is_remote, parse_location
from sidecars.config import load_failure, poll_failure

log = logging.getLogger(__name__)

# (file relative to the model folder, modification time or object mark, size): for polling
Fingerprint = tuple[tuple[str, int | str, int], ...]


@dataclass(frozen=True)
class ModelFolder:
    """A model folder, the repository it is in, and a fingerprint that changes when its files do."""

    name: str
    repository: str  # as given: a local folder or an s3:// / gs:// URL
    fingerprint: Fingerprint
    duplicates: tuple[str, ...] = ()  # other repositories with the same name: the model cannot load


@dataclass(frozen=True)
class RepositoryScan:
    """The model folders found, and why a repository could not be read (Triton's log text)."""

    folders: dict[str, ModelFolder] = field(default_factory=dict)
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalizedFolder:
    """A model folder on local disk: a local repository's own, or a copy of a remote one
    that `release` deletes (Triton loads remote models from a temporary copy too)."""

    path: Path
    copied: bool = False

    def release(self) -> None:
        if self.copied:
            shutil.rmtree(self.path.parent, ignore_errors=True)


class Repository:
    """Reads one or more repositories: the model folders of `framework`, and with
    `unassigned` those no framework claims (a backend turnout lacks, no model file)."""

    def __init__(self, roots: Sequence[str], framework: str, unassigned: bool = False, config_name: str = "") -> None:
        self.roots = tuple(root if is_remote(root) else str(Path(root)) for root in roots)
        self.framework = framework
        self.unassigned = unassigned
        self.config_name = config_name  # Triton's --model-config-name (layout.config_key)
        self._remotes = {
            root: RemoteRepository(parse_location(root), config_name) for root in self.roots if is_remote(root)
        }

    def scan(self) -> RepositoryScan:
        """Every model folder of this framework (and the unassigned ones), by name. A
        repository that cannot be read is reported, and the others still scanned."""
        found: dict[str, ModelFolder] = {}
        failures = []
        for root in self.roots:
            try:
                folders = self._scan_remote(root) if root in self._remotes else self._scan_local(root)
            except RemoteError as exc:
                failures.append(f"failed to poll model repository '{root}': {exc}")
                continue
            for folder in folders:
                found[folder.name] = _merge(found.get(folder.name), folder)
        return RepositoryScan(found, tuple(failures))

    def misplaced(self) -> list[tuple[int, str]]:
        """What looks wrong in the local repositories themselves, with a logging level: one
        that is a model's own folder (a config.pbtxt or version folders at its top) is an
        error, one with no folder at all a warning."""
        problems = []
        for root in self.roots:
            path = Path(root)
            if root in self._remotes or not path.is_dir():
                continue
            folders = [entry.name for entry in path.iterdir() if entry.is_dir()]
            if (path / layout.CONFIG_FILE).is_file() or any(layout.is_version_dir(name) for name in folders):
                problems.append(
                    (
                        logging.ERROR,
                        f"model repository '{root}' looks like a model folder (it holds config.pbtxt or version "
                        "folders); --model-repository takes the folder that holds the model folders",
                    )
                )
            elif not folders:
                problems.append((logging.WARNING, f"model repository '{root}' holds no model folders"))
        return problems

    def find(self, name: str) -> ModelFolder | None:
        """The model's folder (this framework's or an unassigned one), or None; raises
        Triton's load failure, with the reason, when it is in no repository that could be
        read and some repository could not be."""
        if not name or "/" in name or name in (".", ".."):
            return None
        found: ModelFolder | None = None
        failures = []
        for root in self.roots:
            remote = self._remotes.get(root)
            try:
                folder = (
                    self._remote_folder(root, remote.model(name), True) if remote else self._folder(root, name, True)
                )
            except RemoteError as exc:
                failures.append(f"failed to poll model repository '{root}' for model '{name}': {exc}")
                continue
            if folder is not None:
                found = _merge(found, folder)
        for failure in failures:
            log.error("%s", failure)
        if found is None and failures:
            raise load_failure(name, "failed to poll from model repository: " + "; ".join(failures))
        return found

    def config_text(self, name: str) -> str | None:
        """The config.pbtxt text of model folder `name` in the first repository that has
        it, whatever its framework ("" when it has none), or None when none has it."""
        if not name or "/" in name or name in (".", ".."):
            return None
        for root in self.roots:
            remote = self._remotes.get(root)
            try:
                if remote is not None:
                    model = remote.model(name)
                    if model is not None:
                        return model.config_text
                    continue
                path = Path(root) / name
                if path.is_dir():
                    config = layout.config_path(path, self.config_name)
                    return config.read_text() if config.is_file() else ""
            except (RemoteError, OSError, UnicodeDecodeError):
                continue  # an unreadable repository or config counts as not there
        return None

    def localize(self, folder: ModelFolder) -> LocalizedFolder:
        """The folder to load from; a remote model's files are copied to a new temporary folder."""
        remote = self._remotes.get(folder.repository)
        if remote is None:
            return LocalizedFolder(Path(folder.repository) / folder.name)
        target = Path(tempfile.mkdtemp(prefix="turnout-remote-")) / folder.name
        try:
            remote.download(folder.name, (key for key, _, _ in folder.fingerprint), target)
        except RemoteError as exc:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise load_failure(folder.name, f"failed to poll from model repository: {exc}") from exc
        except BaseException:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise
        return LocalizedFolder(target, copied=True)

    def _scan_local(self, root: str) -> list[ModelFolder]:
        if not Path(root).is_dir():
            return []
        return [f for entry in sorted(Path(root).iterdir()) if (f := self._folder(root, entry.name)) is not None]

    def _scan_remote(self, root: str) -> list[ModelFolder]:
        models = self._remotes[root].scan().values()
        return [f for model in models if (f := self._remote_folder(root, model)) is not None]

    def _folder(self, root: str, name: str, unassigned: bool | None = None) -> ModelFolder | None:
        path = Path(root) / name
        try:
            if not path.is_dir() or not self._ours(layout.framework_of_model(path, None, self.config_name), unassigned):
                return None
            return ModelFolder(name, root, _fingerprint(path))
        except OSError:
            return None  # a folder removed or unreadable mid-scan is not a model

    def _remote_folder(
        self, root: str, model: RemoteModel | None, unassigned: bool | None = None
    ) -> ModelFolder | None:
        if model is None or not self._ours(model.framework, unassigned):
            return None
        return ModelFolder(model.name, root, tuple((f.key, f.mark, f.size) for f in model.files))

    def _ours(self, framework: str | None, unassigned: bool | None) -> bool:
        return framework == self.framework or (framework is None and (unassigned or self.unassigned))


def _merge(first: ModelFolder | None, another: ModelFolder) -> ModelFolder:
    if first is None:
        return another
    return replace(first, duplicates=(*first.duplicates, another.repository))


def duplicate_failure(folder: ModelFolder) -> str:
    places = ", ".join((folder.repository, *folder.duplicates))
    return f"model '{folder.name}' appears in more than one model repository ({places})"


def _fingerprint(path: Path) -> Fingerprint:
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
                # Joined as Triton joins paths: a leading '/' starts inside the model's folder.
                target = (self.path / relative.lstrip("/")).resolve()
                if not target.is_relative_to(self.path.resolve()) or target == self.path.resolve():
                    raise poll_failure(
                        model, f"Invalid file parameter 'file:{relative}' must stay within model directory."
                    )
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
