"""Model lifecycle: which versions of which models are loaded, in what state, and how
they get loaded, reloaded and unloaded under each model-control mode."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from protos import layout
from protos import model_config_pb2 as mc
from protos.cnum import parse_version
from protos.statistics import VersionStatistics
from protos.status import Status, TurnoutError, internal, invalid_arg, load_failed, model_not_found, unknown_model
from protos.validation import Signature
from sidecars.batcher import DynamicBatcher
from sidecars.config import load_failure, normalize, poll_config, poll_failure
from sidecars.config_rules import (
    check_unimplemented,
    normalize_instance_groups,
    validate_instance_groups,
    validate_io_config,
    validate_model_config,
)
from sidecars.ensemble.dependencies import check_dependencies
from sidecars.ensemble.validation import ENSEMBLE_PLATFORM
from sidecars.journal import LoadJournal, Replay
from sidecars.repository import (
    Fingerprint,
    LocalizedFolder,
    ModelFolder,
    Repository,
    UploadedModel,
    duplicate_failure,
    select_versions,
    version_numbers,
)
from sidecars.responses import read_labels
from sidecars.runtime import ModelInstance, Runtime
from sidecars.sequence import SequenceBatcher
from sidecars.sequence_config import SequenceTensors
from sidecars.settings import ControlMode, SidecarSettings
from sidecars.warmup import warm_up

log = logging.getLogger(__name__)

UNLOADED = "unloaded"


class State(enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True)
class Origin:
    """What a version was opened from: its model's configuration as read, before the
    framework completed it, apart from its version_policy (which versions load) and its
    instance_group (`groups`), and the marks of the files it depends on (`version_marks`);
    None for uploaded files, which are new at every load."""

    config: bytes
    groups: bytes
    files: Fingerprint | None

    @classmethod
    def of(cls, base: mc.ModelConfig, files: Fingerprint | None) -> Origin:
        config = mc.ModelConfig()
        config.CopyFrom(base)
        config.ClearField("version_policy")
        groups = mc.ModelConfig(instance_group=config.instance_group)
        config.ClearField("instance_group")
        return cls(config.SerializeToString(deterministic=True), groups.SerializeToString(deterministic=True), files)


class Reuse(enum.Enum):
    """What a load does with a READY version, as Triton's core decides (AsyncLoad): a
    version whose configuration and files are unchanged is kept, and updated in place
    when only its instance groups changed; any other is opened again."""

    KEEP = "keep"
    REGROUP = "regroup"
    REOPEN = "reopen"


def version_marks(fingerprint: Fingerprint, version: int, config_key: str | None) -> Fingerprint:
    """The marks a version's files depend on, as Triton's timestamps count them: its own
    folder's and those of the model folder's other files, neither version folders nor the
    configuration (compared by its content instead)."""
    own = str(version)
    config_part = config_key.split("/", 1)[0] if config_key else ""
    marks = []
    for mark in fingerprint:
        first, _, rest = mark[0].partition("/")
        if first == own or not (first == config_part or (rest and layout.is_version_dir(first))):
            marks.append(mark)
    return tuple(marks)


class LoadedVersion:
    """A model version that serves requests: its complete config and its batcher."""

    def __init__(
        self,
        config: mc.ModelConfig,
        version: int,
        instances: list[ModelInstance],
        model_dir: Path,
        sequence_tensors: SequenceTensors | None = None,
        origin: Origin | None = None,
    ) -> None:
        self.config = config
        self.origin = origin
        self.folder = model_dir
        # Its instances by instance group, so an update can keep the groups it does not change.
        self.groups = _by_group(config.instance_group, instances)
        self.name = config.name
        self.version = version
        self.version_text = str(version)
        self.signature = Signature(config)
        self.stats = VersionStatistics()
        self.labels = {
            t.name: read_labels(str(model_dir / t.label_filename)) for t in config.output if t.label_filename
        }
        self.batcher: DynamicBatcher | SequenceBatcher
        if sequence_tensors is not None:
            self.batcher = SequenceBatcher(config, instances, self.stats, sequence_tensors)
        else:
            self.batcher = DynamicBatcher(config, instances, self.stats)

    def reuse(self, origin: Origin) -> Reuse:
        """What a load that finds `origin` does with this version."""
        before = self.origin
        if before is None or origin.files is None or (before.config, before.files) != (origin.config, origin.files):
            return Reuse.REOPEN
        if before.groups == origin.groups:
            return Reuse.KEEP
        return Reuse.REOPEN if self.groups is None else Reuse.REGROUP

    async def regroup(
        self,
        config: mc.ModelConfig,
        groups: list[tuple[bytes, int, list[ModelInstance]]],
        added: list[ModelInstance],
        removed: list[ModelInstance],
        origin: Origin,
    ) -> None:
        """Serve with the instance groups of `config` (normalized): `groups` its instances
        by group, of which `added` are new and `removed` go once their batch is done."""
        del self.config.instance_group[:]
        self.config.instance_group.extend(config.instance_group)
        self.groups, self.origin = groups, origin
        await self.batcher.update_instances(added, removed)

    async def close(self) -> None:
        """Finish every request already queued or running, then release the instances."""
        await self.batcher.close()


@dataclass
class VersionSlot:
    state: State
    reason: str = ""
    loaded: LoadedVersion | None = None


@dataclass
class ModelEntry:
    name: str
    versions: dict[int, VersionSlot] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    uploaded: UploadedModel | None = None
    localized: LocalizedFolder | None = None  # the repository folder it was loaded from
    fingerprint: Fingerprint = ()
    # Why its last load failed before any version was tried ("" when none did). As in
    # Triton, a refused configuration leaves readiness alone; no version to load does not.
    failure: str = ""
    config_failed: bool = False


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


class ModelManager:
    """Owns every model of this sidecar's framework in the repository."""

    def __init__(self, settings: SidecarSettings, runtime: Runtime) -> None:
        self.settings = settings
        self.runtime = runtime
        self.repository = Repository(
            settings.model_repositories, settings.framework, settings.report_unassigned, settings.model_config_name
        )
        self.models: dict[str, ModelEntry] = {}
        # The model folders of the last repository scan: the index lists them, and an
        # unknown model found there is one a client has not loaded yet (explicit mode).
        self._scanned: dict[str, ModelFolder] = {}
        self.exiting = False
        explicit = settings.model_control_mode is ControlMode.EXPLICIT
        self.journal = LoadJournal.beside(settings.lane_path if explicit else "")
        # Set whenever the READY set may have changed (load, unload); Consul registration waits on it.
        self.changed = asyncio.Event()

    # -- start, poll, stop -------------------------------------------------------------

    async def start(self) -> list[str]:
        """The start-up loads of the control mode; returns the failures' texts."""
        scan = await asyncio.to_thread(self.repository.scan)
        folders = scan.folders
        self._scanned = folders
        # Loading "all models" fails when a repository could not be read (as Triton).
        unread = list(scan.failures)
        for failure in unread:
            log.error("%s", failure)
        if self.settings.report_unassigned:  # one sidecar says it, under `turnout up`
            for level, problem in await asyncio.to_thread(self.repository.misplaced):
                log.log(level, "%s", problem)
        replays: dict[str, Replay] = {}
        if self.settings.model_control_mode is ControlMode.EXPLICIT:
            wanted = set(self.settings.load_models)
            names = sorted(folders) if "*" in wanted else sorted(wanted)
            unread = unread if "*" in wanted else []
            # After a supervised restart, what clients had loaded comes back as they loaded it.
            replays = self.journal.entries()
        else:
            names = sorted(folders)
        everything = sorted(set(names) | set(replays))
        loads = (self.load(name, *_replayed(replays.get(name))) for name in everything)
        results = dict(zip(everything, await asyncio.gather(*loads, return_exceptions=True), strict=True))
        for name, result in results.items():
            if isinstance(result, BaseException) and name not in names:
                # A replay is no start-up load: its failure must not stop the sidecar (a
                # supervisor would restart it into the same failure); it is forgotten.
                log.warning("could not load '%s' again after the restart: %s", name, result)
                self.journal.unloaded(name)
        return unread + [str(r) for n, r in results.items() if isinstance(r, BaseException) and n in names]

    async def poll_forever(self) -> None:
        """Poll mode: pick up added, changed and removed models every poll interval."""
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            await self.poll_once()

    async def poll_once(self) -> None:
        scan = await asyncio.to_thread(self.repository.scan)
        folders = scan.folders
        self._scanned = folders
        for failure in scan.failures:
            log.error("%s", failure)
        tasks = []
        for name, folder in folders.items():
            entry = self.models.get(name)
            if entry is None or entry.fingerprint != folder.fingerprint:
                tasks.append(self.load(name))
        for name, entry in list(self.models.items()):
            # A repository that could not be read this time (a network blip) unloads nothing.
            if name not in folders and entry.uploaded is None and not scan.failures:
                tasks.append(self._forget(name))
        # A failed load has logged its reason; the others keep being polled.
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _forget(self, name: str) -> None:
        await self.unload(name)
        self.models.pop(name, None)

    async def close(self) -> None:
        self.exiting = True
        await asyncio.gather(*(self.unload(name) for name in list(self.models)), return_exceptions=True)

    # -- loading -------------------------------------------------------------------------

    async def load(
        self, name: str, override: mc.ModelConfig | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load or reload a model. New versions replace old ones only once all are ready,
        so requests keep being served during a reload. A failure is logged, naming the model."""
        try:
            await self._load(name, override, files)
        except TurnoutError as exc:
            log.error("%s", exc.message.rstrip("\n"))
            raise

    async def _load(self, name: str, override: mc.ModelConfig | None, files: dict[str, bytes] | None) -> None:
        uploaded = None
        localized = None
        if files:
            if override is None:  # Triton's poll refuses it (its log says why; our answer does too)
                raise poll_failure(name, "Load parameter 'config' must be specified for model file override")
            uploaded = await asyncio.to_thread(UploadedModel, name, files)
            folder, fingerprint = uploaded.path, Fingerprint()
        else:
            # Off the event loop: a remote repository is read over the network.
            found = await asyncio.to_thread(self.repository.find, name)
            if found is None:
                raise load_failure(name, "failed to poll from model repository")
            if found.duplicates:
                raise load_failure(name, duplicate_failure(found))
            localized = await asyncio.to_thread(self.repository.localize, found)
            folder, fingerprint = localized.path, found.fingerprint
        entry = self.models.setdefault(name, ModelEntry(name))
        marks = None if uploaded is not None else fingerprint  # uploaded files are new at every load
        copied = localized is not None and localized.copied
        async with entry.lock:
            try:
                opened = await self._load_versions(entry, folder, override, marks, copied)
            except BaseException:
                entry.fingerprint = fingerprint  # a poll tries it again only once its files change
                if uploaded is not None:
                    uploaded.remove()
                if localized is not None:
                    localized.release()
                raise
            finally:
                self.changed.set()
            entry.fingerprint = fingerprint
            if opened:
                if entry.uploaded is not None and entry.uploaded is not uploaded:
                    entry.uploaded.remove()
                if entry.localized is not None:
                    entry.localized.release()  # a remote model's previous copy
                entry.uploaded, entry.localized = uploaded, localized
            elif localized is not None:
                localized.release()  # every version kept serving from the copy it was opened from
            # Off the loop: uploaded files are copied into the journal, to load again after a restart.
            await asyncio.to_thread(self.journal.loaded, name, override, files if uploaded is not None else None)

    async def _load_versions(
        self,
        entry: ModelEntry,
        folder: Path,
        override: mc.ModelConfig | None,
        marks: Fingerprint | None,
        copied: bool,
    ) -> bool:
        """Triton's order: the configuration on its own, then the versions, then each
        version's files and the framework's own checks; the failures in its words.

        A READY version whose configuration and files are what it was opened from is kept
        as it is (its instances, statistics and live sequences), as Triton's core keeps
        it, and one whose instance groups alone changed is updated in place (`_regroup`);
        the others are opened from `folder`. A fresh copy of a remote model (`copied`)
        serves every version or none. Returns whether any version was opened."""
        name = entry.name
        auto_complete = self.settings.auto_complete_config
        try:
            config_name = self.settings.model_config_name
            base = await asyncio.to_thread(poll_config, folder, name, override, auto_complete, config_name)
        except TurnoutError as exc:
            entry.failure, entry.config_failed = exc.message, True
            raise poll_failure(name, exc.message) from None
        if base.platform == ENSEMBLE_PLATFORM:
            try:
                await asyncio.to_thread(check_dependencies, base, self.repository.config_text)
            except TurnoutError as exc:  # Triton does not load such an ensemble at all
                entry.failure, entry.config_failed = exc.message, True
                raise load_failed(name, exc.message) from None
        available = version_numbers(folder)
        for missing in sorted(set(base.version_policy.specific.versions) - set(available)):
            log.error("version %d is specified for model '%s', but the version directory is not present", missing, name)
        versions = select_versions(available, base.version_policy)
        if not versions:
            reason = f"at least one version must be available under the version policy of model '{name}'"
            entry.failure, entry.config_failed = reason, False
            raise load_failed(name, reason)
        entry.failure, entry.config_failed = "", False
        config_key = layout.config_key((mark[0] for mark in marks), self.settings.model_config_name) if marks else None
        shared = Origin.of(base, None)  # each version has its own files (none: uploaded, new every time)
        origins = {v: shared for v in versions}
        if marks is not None:
            origins = {v: replace(shared, files=version_marks(marks, v, config_key)) for v in versions}
        reuse = {v: Reuse.REOPEN for v in versions}
        if base.platform != ENSEMBLE_PLATFORM:  # Triton loads an ensemble again whole
            for version in versions:
                slot = entry.versions.get(version)
                if slot is not None and slot.state is State.READY and slot.loaded is not None:
                    reuse[version] = slot.loaded.reuse(origins[version])
            if copied and Reuse.REOPEN in reuse.values():
                reuse = {v: Reuse.REOPEN for v in versions}
        opening = [v for v in versions if reuse[v] is Reuse.REOPEN]
        regrouping = [v for v in versions if reuse[v] is Reuse.REGROUP]
        for version in opening:
            slot = entry.versions.get(version)
            if slot is None or slot.state is not State.READY:
                entry.versions[version] = VersionSlot(State.LOADING)
        for version in versions:
            if reuse[version] is not Reuse.REOPEN:
                entry.versions[version].reason = ""  # as Triton's update clears it first
            if reuse[version] is Reuse.KEEP:
                log.info("version %d of model '%s' is unchanged: it keeps serving as loaded", version, name)
            elif reuse[version] is Reuse.REGROUP:
                log.info("version %d of model '%s' gets its new instance groups in place", version, name)
        results = await asyncio.gather(
            *(self._open_version(base, folder / str(v)) for v in opening),
            *(self._regroup(entry.versions[v], base, origins[v]) for v in regrouping),
            return_exceptions=True,
        )
        failures: list[tuple[int, bool, str]] = []  # (version, whether it was an update, why)
        loaded: dict[int, LoadedVersion] = {}
        for version, result in zip(opening + regrouping, results, strict=True):
            if isinstance(result, BaseException):
                reason = result.as_string() if isinstance(result, TurnoutError) else f"Internal: {result}"
                failures.append((version, reuse[version] is Reuse.REGROUP, reason))
            elif result is not None:
                config, instances, tensors, load_secs = result
                loaded[version] = LoadedVersion(config, version, instances, folder, tensors, origins[version])
                loaded[version].stats.load_secs = load_secs
        if failures:
            await asyncio.gather(*(v.close() for v in loaded.values()))
            for version, updating, reason in failures:
                slot = entry.versions[version]
                if updating:
                    slot.reason = reason  # it goes on serving as it was, saying why
                elif slot.state is not State.READY:
                    entry.versions[version] = VersionSlot(State.UNAVAILABLE, reason)
            for version in loaded:
                if entry.versions[version].state is State.LOADING:
                    entry.versions[version] = VersionSlot(State.UNAVAILABLE, UNLOADED)
            detail = "".join(
                f"version {v} is at {'READY' if updating else 'UNAVAILABLE'} state: {r};"
                for v, updating, r in sorted(failures)
            )
            raise load_failed(name, detail)
        retired = [
            slot.loaded
            for version, slot in entry.versions.items()
            if slot.loaded is not None and reuse.get(version, Reuse.REOPEN) is Reuse.REOPEN
        ]
        for version in list(entry.versions):
            if version not in loaded and reuse.get(version, Reuse.REOPEN) is Reuse.REOPEN:
                entry.versions[version] = VersionSlot(State.UNAVAILABLE, UNLOADED)
        for version, version_loaded in loaded.items():
            entry.versions[version] = VersionSlot(State.READY, loaded=version_loaded)
        await asyncio.gather(*(old.close() for old in retired))
        return bool(opening)

    async def _regroup(self, slot: VersionSlot, base: mc.ModelConfig, origin: Origin) -> None:
        """Triton's in-place update of a READY version's instance groups (PrepareInstances):
        the new groups normalized and checked; a group matching one it had (all but name
        and count alike) keeps that group's instances up to its new count and opens the
        rest after them, others are opened whole; new instances are warmed up, and those
        no group keeps go once their batch is done. Raises, changing nothing, when the
        groups are refused or a new instance fails."""
        loaded = slot.loaded
        assert loaded is not None and loaded.groups is not None
        config = mc.ModelConfig()
        config.CopyFrom(loaded.config)
        del config.instance_group[:]
        config.instance_group.extend(base.instance_group)
        gpus = list(range(self.runtime.gpu_count()))
        normalize_instance_groups(config, gpus)
        validate_instance_groups(config, gpus)
        unmatched: dict[bytes, list[tuple[int, list[ModelInstance]]]] = {}
        for key, count, instances in loaded.groups:
            unmatched.setdefault(key, []).append((count, instances))
        plans: list[tuple[bytes, int, list[list[ModelInstance]], int]] = []  # key, count, kept per GPU, first new
        removed: list[ModelInstance] = []
        for group in config.instance_group:
            key, count, devices = _group_key(group), group.count, _devices_of(group)
            if unmatched.get(key):
                had, instances = unmatched[key].pop(0)
                kept = min(had, count)
                per_device = [instances[d * had : d * had + kept] for d in range(devices)]
                removed += [instances[d * had + c] for d in range(devices) for c in range(kept, had)]
                plans.append((key, count, per_device, kept))
            else:
                plans.append((key, count, [[] for _ in range(devices)], 0))
        removed += [instance for groups in unmatched.values() for _, instances in groups for instance in instances]
        opening = sum((count - first) * len(per_device) for _, count, per_device, first in plans)
        added: list[ModelInstance] = []
        if opening:
            firsts = [first for *_, first in plans]
            added = await asyncio.to_thread(self.runtime.load, config, loaded.folder / loaded.version_text, firsts)
            if len(added) != opening:
                await _close_all(added)
                raise internal(f"model '{config.name}' opened {len(added)} instances, not {opening}")
            await _warmed_up(config, added, loaded.folder)
        groups: list[tuple[bytes, int, list[ModelInstance]]] = []
        at = 0
        for key, count, per_device, first in plans:
            fresh = count - first
            instances = []
            for device, kept_here in enumerate(per_device):
                instances += kept_here + added[at + device * fresh : at + (device + 1) * fresh]
            at += fresh * len(per_device)
            groups.append((key, count, instances))
        await loaded.regroup(config, groups, added, removed, origin)

    async def _open_version(
        self, base: mc.ModelConfig, version_dir: Path
    ) -> tuple[mc.ModelConfig, list[ModelInstance], SequenceTensors | None, float]:
        """Prepare a version and warm its instances up; it is ready only after both.
        Returns the config, the instances, the sequence tensors and the seconds both took."""
        started = time.monotonic()
        config, instances, tensors = await asyncio.to_thread(self._prepare, base, version_dir)
        await _warmed_up(config, instances, version_dir.parent)
        return config, instances, tensors, time.monotonic() - started

    def _prepare(
        self, base: mc.ModelConfig, version_dir: Path
    ) -> tuple[mc.ModelConfig, list[ModelInstance], SequenceTensors | None]:
        """Blocking: this version's instance groups, the framework's completion of the
        config from the model file, the whole config checked again (Triton's Model::Init),
        its sequence tensors (with `sequence_batching`), then its instances."""
        config = mc.ModelConfig()
        config.CopyFrom(base)
        self._check_backend(config)
        gpus = list(range(self.runtime.gpu_count()))
        normalize_instance_groups(config, gpus)
        validate_instance_groups(config, gpus)
        if self.settings.auto_complete_config:
            self.runtime.auto_complete(config, version_dir, self.settings.default_max_batch_size)
            normalize(config)
        validate_model_config(config)
        validate_io_config(config)
        for output in config.output:  # read when the version is built; checked here, as Triton's Model::Init
            label_file = version_dir.parent / output.label_filename
            if output.label_filename and not label_file.is_file():
                raise internal(f"failed to open text file for read {label_file}: No such file or directory")
        # After Triton's own checks, so a field Triton refuses is refused in its words.
        for warning in check_unimplemented(config):
            log.warning("%s", warning)
        # The initial_state files are read here, so a missing or short one fails the load
        # rather than a sequence's first request.
        tensors = SequenceTensors(config, version_dir.parent) if config.HasField("sequence_batching") else None
        return config, self.runtime.load(config, version_dir), tensors

    def _check_backend(self, config: mc.ModelConfig) -> None:
        """A backend turnout has no sidecar for fails each version, as a backend library
        Triton cannot find does."""
        framework = layout.framework_of_fields(config.backend, config.platform)
        if framework == self.settings.framework:
            return
        if framework is None:
            raise invalid_arg(
                f"unable to find backend library for backend '{config.backend}': turnout serves {layout.SERVED}"
            )
        raise invalid_arg(f"backend '{config.backend}' is served by the {framework} sidecar, not by this one")

    async def unload(self, name: str) -> None:
        """Stop routing to a model, let its queued and running requests finish, release it."""
        self.journal.unloaded(name)
        entry = self.models.get(name)
        if entry is None:
            return
        async with entry.lock:
            closing = []
            for slot in entry.versions.values():
                if slot.loaded is not None:
                    slot.state = State.UNLOADING
                    closing.append(slot)
            self.changed.set()  # before draining, so the fleet stops routing here first
            await asyncio.gather(*(slot.loaded.close() for slot in closing if slot.loaded is not None))
            for slot in closing:
                slot.state, slot.reason, slot.loaded = State.UNAVAILABLE, UNLOADED, None
            if entry.uploaded is not None:
                entry.uploaded.remove()
                entry.uploaded = None
            if entry.localized is not None:
                entry.localized.release()
                entry.localized = None

    # -- lookups -------------------------------------------------------------------------

    def resolve(self, name: str, version_text: str) -> LoadedVersion:
        """The READY version a request names ("" = the newest READY one), or Triton's error
        (the version's text is read first, as Triton does)."""
        return self._resolve(name, parse_version(version_text))

    def _resolve(self, name: str, version: int) -> LoadedVersion:
        entry = self.models.get(name)
        if entry is None or not entry.versions:
            hint = ""
            if name in self._scanned and self.settings.model_control_mode is ControlMode.EXPLICIT:
                hint = (
                    f" (model '{name}' is in the repository but not loaded; "
                    f"load it with POST /v2/repository/models/{name}/load)"
                )
            raise unknown_model(f"Request for unknown model: '{name}' is not found{hint}")
        if version < 0:
            for version in sorted(entry.versions, reverse=True):
                slot = entry.versions[version]
                if slot.state is State.READY and slot.loaded is not None:
                    return slot.loaded
            raise unknown_model(f"Request for unknown model: '{name}' has no available versions")
        found = entry.versions.get(version)
        if found is None:
            raise model_not_found(name, version)
        if found.state is not State.READY or found.loaded is None:
            raise unknown_model(
                f"Request for unknown model: '{name}' version {version} is not at ready state", Status.UNAVAILABLE
            )
        return found.loaded

    def is_model_ready(self, name: str, version_text: str) -> bool:
        """Whether that version is READY; a version text Triton cannot read is refused."""
        version = parse_version(version_text)
        try:
            self._resolve(name, version)
        except TurnoutError:
            return False
        return True

    def is_ready(self) -> bool:
        """Server readiness: with strict readiness, every live version must be READY."""
        if self.exiting:
            return False
        if not self.settings.strict_readiness:
            return True
        for entry in self.models.values():
            if entry.failure and not entry.config_failed and not entry.versions:
                return False  # Triton's model with a state but no version
            for slot in entry.versions.values():
                if slot.state is not State.READY and not (slot.state is State.UNAVAILABLE and slot.reason == UNLOADED):
                    return False
        return True

    def failed_versions(self) -> dict[str, list[str]]:
        """The models whose load failed as strict readiness counts them, each with its
        failed versions (none: it failed before any version was tried). Loading and
        unloading ones are left out: they are on their way, not failed."""
        failed: dict[str, list[str]] = {}
        for name, entry in sorted(self.models.items()):
            if entry.failure and not entry.config_failed and not entry.versions:
                failed[name] = []
                continue
            versions = [
                str(version)
                for version, slot in sorted(entry.versions.items())
                if slot.state is State.UNAVAILABLE and slot.reason != UNLOADED
            ]
            if versions:
                failed[name] = versions
        return failed

    def ready_versions(self, name: str) -> list[LoadedVersion]:
        entry = self.models.get(name)
        if entry is None:
            return []
        return [
            slot.loaded
            for _, slot in sorted(entry.versions.items())
            if slot.state is State.READY and slot.loaded is not None
        ]

    def model_names(self) -> list[str]:
        return sorted(name for name, entry in self.models.items() if entry.versions)

    async def index(self, ready_only: bool) -> list[IndexEntry]:
        """One entry per (model, version); models never loaded as their name alone."""
        self._scanned = (await asyncio.to_thread(self.repository.scan)).folders
        return self.entries(ready_only)

    def entries(self, ready_only: bool) -> list[IndexEntry]:
        """The index as of the last repository scan (start, poll or `index`)."""
        folders = self._scanned
        names = set(folders) | set(self.models)
        entries: list[IndexEntry] = []
        for name in sorted(names):
            folder = folders.get(name)
            if folder is not None and folder.duplicates:
                if not ready_only:
                    entries.append(IndexEntry(name, "", State.UNAVAILABLE.value, duplicate_failure(folder)))
                continue
            entry = self.models.get(name)
            if entry is None or not entry.versions:
                if not ready_only:
                    failure = entry.failure if entry is not None else ""
                    entries.append(
                        IndexEntry(name, "", State.UNAVAILABLE.value, failure) if failure else IndexEntry(name)
                    )
                continue
            for version, slot in sorted(entry.versions.items()):
                if ready_only and slot.state is not State.READY:
                    continue
                entries.append(IndexEntry(name, str(version), slot.state.value, slot.reason))
        return entries


async def _warmed_up(config: mc.ModelConfig, instances: list[ModelInstance], model_dir: Path) -> None:
    """Run the config's warm-up samples on new instances; closes them when one fails."""
    try:
        await warm_up(config, instances, model_dir)
    except BaseException:
        await _close_all(instances)
        raise


async def _close_all(instances: list[ModelInstance]) -> None:
    await asyncio.gather(*(asyncio.to_thread(i.close) for i in instances))


def _group_key(group: mc.ModelInstanceGroup) -> bytes:
    """An instance group as Triton matches instances across an update: all but its name
    and count."""
    key = mc.ModelInstanceGroup()
    key.CopyFrom(group)
    key.ClearField("name")
    key.ClearField("count")
    serialized: bytes = key.SerializeToString(deterministic=True)
    return serialized


def _devices_of(group: mc.ModelInstanceGroup) -> int:
    """How many GPUs a group runs `count` instances on (1 for the other kinds)."""
    return len(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU and group.gpus else 1


def _by_group(
    groups: Sequence[mc.ModelInstanceGroup], instances: Sequence[ModelInstance]
) -> list[tuple[bytes, int, list[ModelInstance]]] | None:
    """`instances`, as a runtime opens them (group by group, GPU by GPU), cut by group as
    (key, count, instances); None where they do not add up."""
    cut: list[tuple[bytes, int, list[ModelInstance]]] = []
    at = 0
    for group in groups:
        size = group.count * _devices_of(group)
        cut.append((_group_key(group), group.count, list(instances[at : at + size])))
        at += size
    return cut if at == len(instances) else None


def _replayed(replay: Replay | None) -> tuple[mc.ModelConfig | None, dict[str, bytes] | None]:
    """load()'s override and files for a journal entry (none: the repository's model)."""
    return (replay.override, replay.files) if replay is not None else (None, None)
