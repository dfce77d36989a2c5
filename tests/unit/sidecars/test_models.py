"""ModelManager's state transitions, in process, on real tiny ONNX models and the real
ONNX Runtime runtime: start-up loads per control mode, per-version states as the index
reports them, failures with their reasons, unload, reload with a config override,
version policies, polling, version resolution and concurrent loads.

The LOADING and UNLOADING states last only while a framework call runs, so the tests that
look at them wrap the real runtime in GatedRuntime, which holds those calls at a gate.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from scripts import make_models
from sidecars.config import parse_override
from sidecars.journal import LoadJournal
from sidecars.models import IndexEntry, LoadedVersion, ModelManager
from sidecars.runtime import ModelInstance, Runtime, runtime_for
from sidecars.settings import ControlMode, SidecarSettings

# Only reached when a test fails with a gate still shut; a passing test never waits on it.
GATE_TIMEOUT_S = 5.0
# How long a second load gets to reach the runtime while the first one holds the model.
OVERLAP_WINDOW_S = 0.005


def sidecar_settings(
    repository: Path, mode: str = "none", load_models: tuple[str, ...] = (), strict_readiness: bool = True
) -> SidecarSettings:
    """As sidecars/__main__.py builds them from `--framework onnxruntime --model-repository DIR
    --model-control-mode MODE [--load-model M]... [--strict-readiness=false]`."""
    return SidecarSettings(
        framework="onnxruntime",
        model_repositories=(str(repository),),
        model_control_mode=ControlMode(mode),
        load_models=load_models,
        strict_readiness=strict_readiness,
        auto_complete_config=True,  # no --disable-auto-complete-config
        default_max_batch_size=4,
        backend_config=(),
    )


class GatedInstance:
    """A real instance whose `close` (run on a worker thread) waits for the runtime's gate."""

    def __init__(self, real: ModelInstance, runtime: GatedRuntime) -> None:
        self.real = real
        self.name: str = getattr(real, "name", "")
        self.runtime = runtime
        self.closed = False

    async def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await self.real.execute(inputs)

    def close(self) -> None:
        self.runtime.closing.set()
        self.runtime.closes_open.wait(GATE_TIMEOUT_S)
        self.real.close()
        self.closed = True


class GatedRuntime:
    """The real ONNX Runtime runtime, with gates: `load` waits for `loads_open` and every
    instance's `close` for `closes_open`. Both run on worker threads, hence threading events.
    It also counts loads and how many ran at once."""

    def __init__(self, real: Runtime, loads_open: bool = True, closes_open: bool = True) -> None:
        self.real = real
        self.loads_open = threading.Event()
        self.closes_open = threading.Event()
        if loads_open:
            self.loads_open.set()
        if closes_open:
            self.closes_open.set()
        self.loading = threading.Event()  # a load reached the gate
        self.closing = threading.Event()  # a close reached the gate
        self.loads = 0
        self.most_at_once = 0
        self.instances: list[GatedInstance] = []
        self._running = 0
        self._lock = threading.Lock()

    def gpu_count(self) -> int:
        return self.real.gpu_count()

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        self.real.auto_complete(config, version_dir, default_max_batch_size)

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        with self._lock:
            self.loads += 1
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        self.loading.set()
        try:
            self.loads_open.wait(GATE_TIMEOUT_S)
            instances = [GatedInstance(real, self) for real in self.real.load(config, version_dir, first)]
        finally:
            with self._lock:
                self._running -= 1
        self.instances.extend(instances)
        return list(instances)

    def open_gates(self) -> None:
        self.loads_open.set()
        self.closes_open.set()


ManagerFactory = Callable[..., ModelManager]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
async def managers() -> AsyncIterator[ManagerFactory]:
    """Builds managers as sidecars/process.py does (the runtime from RUNTIMES by name);
    closes every one at the end, gates opened first so no close waits."""
    built: list[ModelManager] = []

    def build(
        repository: Path,
        mode: str = "none",
        load_models: tuple[str, ...] = (),
        strict_readiness: bool = True,
        runtime: Runtime | None = None,
    ) -> ModelManager:
        settings = sidecar_settings(repository, mode, load_models, strict_readiness)
        manager = ModelManager(settings, runtime or runtime_for(settings.framework, settings.backend_config))
        built.append(manager)
        return manager

    yield build
    for manager in built:
        if isinstance(manager.runtime, GatedRuntime):
            manager.runtime.open_gates()
        await manager.close()


def gated(**gates: bool) -> GatedRuntime:
    return GatedRuntime(runtime_for("onnxruntime"), **gates)


async def entries(manager: ModelManager, name: str, ready_only: bool = False) -> list[tuple[str, str, str]]:
    """The index entries of one model as (version, state, reason)."""
    return [(e.version, e.state, e.reason) for e in await manager.index(ready_only) if e.name == name]


async def reached(event: threading.Event, timeout_s: float = GATE_TIMEOUT_S) -> bool:
    """Wait, off the event loop, for a worker thread to set `event`."""
    return await asyncio.to_thread(event.wait, timeout_s)


def write_without_dims(repository: Path, name: str = "no_dims") -> Path:
    """`simple` with a complete config whose INPUT0 has no dims: it parses, but no version loads."""
    model_dir = make_models.write_simple(repository, name=name)
    dims = " dims: [ 16 ]"
    inputs = f'{{ name: "INPUT0" data_type: TYPE_INT32 }}, {{ name: "INPUT1" data_type: TYPE_INT32{dims} }}'
    outputs = f'{{ name: "OUTPUT0" data_type: TYPE_INT32{dims} }}, {{ name: "OUTPUT1" data_type: TYPE_INT32{dims} }}'
    config = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    config += f"input [ {inputs} ]\noutput [ {outputs} ]\n"
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def spoil(version_dir: Path) -> None:
    """Replace a version's model file with bytes ONNX Runtime cannot read."""
    (version_dir / "model.onnx").write_bytes(b"not an onnx model")


NO_DIMS_REASON = "Invalid argument: model input 'INPUT0' must specify 'dims' for no_dims"


# -- start-up loads per control mode ---------------------------------------------------------


async def test_start_in_none_mode_loads_every_model_and_every_version_its_policy_serves(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    make_models.write_linear(repository, versions={1: 1.0, 2: 2.0})
    manager = managers(repository, "none")

    assert await manager.start() == []

    assert await manager.index(ready_only=False) == [
        IndexEntry("linear", "1", "READY"),
        IndexEntry("linear", "2", "READY"),
        IndexEntry("simple", "1", "READY"),
    ]
    assert manager.model_names() == ["linear", "simple"]
    assert manager.is_ready()


async def test_start_in_explicit_mode_loads_only_the_load_model_names(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    make_models.write_linear(repository)
    manager = managers(repository, "explicit", load_models=("simple",))

    assert await manager.start() == []

    assert await manager.index(ready_only=False) == [IndexEntry("linear"), IndexEntry("simple", "1", "READY")]
    assert manager.model_names() == ["simple"]


async def test_start_in_explicit_mode_without_load_model_loads_nothing_but_lists_every_model(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    make_models.write_linear(repository)
    manager = managers(repository, "explicit")

    assert await manager.start() == []

    assert await manager.index(ready_only=False) == [IndexEntry("linear"), IndexEntry("simple")]
    assert await manager.index(ready_only=True) == []
    assert manager.model_names() == []


async def test_start_in_explicit_mode_with_a_star_loads_every_model(repository: Path, managers: ManagerFactory) -> None:
    make_models.write_simple(repository)
    make_models.write_linear(repository)
    manager = managers(repository, "explicit", load_models=("*",))

    assert await manager.start() == []

    assert manager.model_names() == ["linear", "simple"]
    assert [(e.name, e.version) for e in await manager.index(ready_only=True)] == [
        ("linear", "1"),
        ("linear", "2"),
        ("simple", "1"),
    ]


async def test_start_in_explicit_mode_reports_a_load_model_name_missing_from_the_repository(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "explicit", load_models=("simple", "missing"))

    failures = await manager.start()

    assert failures == ["failed to load 'missing', failed to poll from model repository"]
    assert manager.model_names() == ["simple"]
    assert "missing" not in {e.name for e in await manager.index(ready_only=False)}


# -- failures are listed with their reasons ----------------------------------------------------


async def test_a_version_that_fails_to_load_is_listed_unavailable_with_its_reason(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    write_without_dims(repository)
    manager = managers(repository, "none")

    failures = await manager.start()

    assert failures == [f"load failed for model 'no_dims': version 1 is at UNAVAILABLE state: {NO_DIMS_REASON};\n"]
    assert await entries(manager, "no_dims") == [("1", "UNAVAILABLE", NO_DIMS_REASON)]
    assert await entries(manager, "simple") == [("1", "READY", "")]  # the others still load
    assert await entries(manager, "no_dims", ready_only=True) == []


async def test_a_version_whose_model_file_onnx_runtime_cannot_read_is_listed_with_onnx_runtimes_reason(
    repository: Path, managers: ManagerFactory
) -> None:
    spoil(make_models.write_simple(repository) / "1")
    manager = managers(repository, "none")

    [failure] = await manager.start()

    [(version, state, reason)] = await entries(manager, "simple")
    assert (version, state) == ("1", "UNAVAILABLE")
    assert reason.startswith("Internal: onnx runtime error: ")
    assert failure == f"load failed for model 'simple': version 1 is at UNAVAILABLE state: {reason};\n"


async def test_one_version_failing_to_load_unloads_the_versions_loaded_with_it(
    repository: Path, managers: ManagerFactory
) -> None:
    # Triton's ModelLifeCycle::OnLoadFinal: a load is all or nothing across its versions.
    spoil(make_models.write_linear(repository) / "2")
    manager = managers(repository, "none")

    await manager.start()

    [one, two] = await entries(manager, "linear")
    assert one == ("1", "UNAVAILABLE", "unloaded")
    assert two[:2] == ("2", "UNAVAILABLE")
    assert two[2].startswith("Internal: onnx runtime error: ")
    assert manager.ready_versions("linear") == []


async def test_a_model_whose_config_cannot_be_parsed_is_still_listed_and_start_reports_why(
    repository: Path, managers: ManagerFactory
) -> None:
    # Where Triton's index names such a folder alone, turnout's says why it is not served.
    broken = make_models.write_simple(repository, name="broken")
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nthis is not a model config\n')
    make_models.write_simple(repository)
    manager = managers(repository, "none")

    [failure] = await manager.start()

    prefix = "failed to load 'broken', failed to poll from model repository: "
    assert failure.startswith(prefix + "failed to read text proto from ")
    [listed] = [e for e in await manager.index(ready_only=False) if e.name == "broken"]
    assert (listed.version, listed.state, listed.reason) == ("", "UNAVAILABLE", failure.removeprefix(prefix))
    assert manager.model_names() == ["simple"]
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("broken", "")
    assert (raised.value.status, raised.value.message) == (
        Status.NOT_FOUND,
        "Request for unknown model: 'broken' is not found",
    )


@pytest.mark.parametrize(("strict_readiness", "ready"), [(True, False), (False, True)])
async def test_a_model_that_failed_to_load_makes_the_sidecar_not_ready_only_under_strict_readiness(
    repository: Path, managers: ManagerFactory, strict_readiness: bool, ready: bool
) -> None:
    make_models.write_simple(repository)
    write_without_dims(repository)
    manager = managers(repository, "none", strict_readiness=strict_readiness)

    await manager.start()

    assert manager.is_ready() is ready
    assert manager.is_model_ready("simple", "")
    assert not manager.is_model_ready("no_dims", "")


async def test_unloading_the_model_that_failed_keeps_its_reason_and_the_sidecar_not_ready(
    repository: Path, managers: ManagerFactory
) -> None:
    # As Triton's ModelLifeCycle::AsyncUnload: only READY versions are released as "unloaded".
    write_without_dims(repository)
    manager = managers(repository, "none")
    await manager.start()

    await manager.unload("no_dims")

    assert await entries(manager, "no_dims") == [("1", "UNAVAILABLE", NO_DIMS_REASON)]
    assert not manager.is_ready()


async def test_loading_a_model_that_is_not_in_the_repository_fails_with_tritons_text(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "explicit")

    with pytest.raises(TurnoutError) as raised:
        await manager.load("missing")

    assert (raised.value.status, raised.value.message) == (
        Status.INTERNAL,
        "failed to load 'missing', failed to poll from model repository",
    )
    assert "missing" not in {e.name for e in await manager.index(ready_only=False)}
    assert manager.is_ready()


# -- LOADING, READY, UNLOADING, UNAVAILABLE ----------------------------------------------------


async def test_a_version_is_loading_until_its_instances_are_open_and_then_ready(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    runtime = gated(loads_open=False)
    manager = managers(repository, "explicit", runtime=runtime)
    manager.changed.clear()

    load = asyncio.create_task(manager.load("simple"))
    assert await reached(runtime.loading)

    assert await entries(manager, "simple") == [("1", "LOADING", "")]
    assert await entries(manager, "simple", ready_only=True) == []
    assert not manager.is_ready()  # strict readiness: LOADING is not READY
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("simple", "1")
    assert (raised.value.status, raised.value.message) == (
        Status.UNAVAILABLE,
        "Request for unknown model: 'simple' version 1 is not at ready state",
    )
    assert not manager.changed.is_set()

    runtime.loads_open.set()
    await load

    assert await entries(manager, "simple") == [("1", "READY", "")]
    assert manager.is_ready()
    assert manager.changed.is_set()
    assert manager.resolve("simple", "1").version == 1


async def test_a_version_is_unloading_while_its_instances_close_and_then_unavailable_as_unloaded(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    runtime = gated(closes_open=False)
    manager = managers(repository, "explicit", load_models=("simple",), runtime=runtime)
    await manager.start()
    manager.changed.clear()

    unload = asyncio.create_task(manager.unload("simple"))
    assert await reached(runtime.closing)

    assert await entries(manager, "simple") == [("1", "UNLOADING", "")]
    assert manager.changed.is_set()  # set before draining, so the fleet stops routing here first
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("simple", "1")
    assert (raised.value.status, raised.value.message) == (
        Status.UNAVAILABLE,
        "Request for unknown model: 'simple' version 1 is not at ready state",
    )

    runtime.closes_open.set()
    await unload

    assert await entries(manager, "simple") == [("1", "UNAVAILABLE", "unloaded")]
    assert all(instance.closed for instance in runtime.instances)


async def test_unload_makes_every_version_unavailable_with_reason_unloaded(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_linear(repository)
    make_models.write_simple(repository)
    manager = managers(repository, "explicit", load_models=("*",))
    await manager.start()

    await manager.unload("linear")

    assert await entries(manager, "linear") == [("1", "UNAVAILABLE", "unloaded"), ("2", "UNAVAILABLE", "unloaded")]
    assert await entries(manager, "linear", ready_only=True) == []
    assert await entries(manager, "simple") == [("1", "READY", "")]
    assert manager.ready_versions("linear") == []
    assert manager.is_ready()  # strict readiness forgives versions that were unloaded
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("linear", "")
    assert (raised.value.status, raised.value.message) == (
        Status.NOT_FOUND,
        "Request for unknown model: 'linear' has no available versions",
    )


async def test_a_model_unloaded_can_be_loaded_again(repository: Path, managers: ManagerFactory) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "explicit", load_models=("simple",))
    await manager.start()
    await manager.unload("simple")

    await manager.load("simple")

    assert await entries(manager, "simple") == [("1", "READY", "")]


async def test_closing_the_manager_unloads_every_model_and_reports_not_ready(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "none", strict_readiness=False)
    await manager.start()

    await manager.close()

    assert not manager.is_ready()
    assert await entries(manager, "simple") == [("1", "UNAVAILABLE", "unloaded")]


# -- reload with a config override ------------------------------------------------------------


async def test_a_reload_with_a_config_override_replaces_the_repository_config(
    repository: Path, managers: ManagerFactory
) -> None:
    origin = 'parameters { key: "origin" value: { string_value: "config.pbtxt" } }'
    make_models.write_simple(repository, extra_config=origin)
    manager = managers(repository, "explicit", load_models=("simple",))
    await manager.start()
    before = manager.resolve("simple", "")
    assert before.config.max_batch_size == 8
    assert before.config.parameters["origin"].string_value == "config.pbtxt"

    await manager.load("simple", parse_override('{"max_batch_size": "16"}'))

    after = manager.resolve("simple", "")
    assert after is not before
    assert after.config.max_batch_size == 16
    assert "origin" not in after.config.parameters  # replaced, not merged
    assert [t.name for t in after.config.input] == ["INPUT0", "INPUT1"]  # auto-complete filled the rest
    assert await entries(manager, "simple") == [("1", "READY", "")]


async def test_a_reload_with_a_version_policy_override_serves_only_the_versions_it_names(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_linear(repository)
    manager = managers(repository, "explicit", load_models=("linear",))
    await manager.start()
    version_1 = manager.resolve("linear", "1")

    await manager.load("linear", parse_override(make_models.linear_override([1], warm=False)))

    assert await entries(manager, "linear") == [("1", "READY", ""), ("2", "UNAVAILABLE", "unloaded")]
    assert manager.resolve("linear", "").version == 1
    # Only the policy changed, so version 1 keeps serving as it was, with the config it
    # was loaded with (Triton's core updates it in place; its config still says `all`).
    assert manager.resolve("linear", "1") is version_1
    assert version_1.config.version_policy.WhichOneof("policy_choice") == "all"


async def test_a_reload_that_fails_keeps_serving_the_versions_already_ready(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir, manager, serving = await serving_linear(repository, managers)
    spoil(model_dir / "2")

    with pytest.raises(TurnoutError) as raised:
        await manager.load("linear")

    assert raised.value.message.startswith("load failed for model 'linear': version 2 is at UNAVAILABLE state: ")
    assert await entries(manager, "linear") == [("1", "READY", ""), ("2", "READY", "")]
    assert manager.resolve("linear", "1") is serving[1]
    assert manager.resolve("linear", "2") is serving[2]
    assert manager.is_ready()


async def test_a_config_override_naming_another_model_is_refused_and_the_model_keeps_serving(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "explicit", load_models=("simple",))
    await manager.start()
    serving = manager.resolve("simple", "1")

    with pytest.raises(TurnoutError) as raised:
        await manager.load("simple", parse_override('{"name": "other"}'))

    assert (raised.value.status, raised.value.message) == (
        Status.INTERNAL,  # Triton's status for a model its repository poll refused
        "failed to load 'simple', failed to poll from model repository: unexpected directory name 'simple' for "
        "model 'other', directory name must equal model name",
    )
    assert manager.resolve("simple", "1") is serving


# -- version policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "ready"),
    [
        ("", [3]),  # Triton's default: latest { num_versions: 1 }
        ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy: { specific { versions: [ 1, 3 ] } }", [1, 3]),
        ("version_policy: { all { } }", [1, 2, 3]),
    ],
    ids=["default", "latest-2", "specific-1-3", "all"],
)
async def test_the_version_policy_decides_which_versions_are_ready(
    repository: Path, managers: ManagerFactory, policy: str, ready: list[int]
) -> None:
    make_models.write_simple(repository, versions=(1, 2, 3), extra_config=policy)
    manager = managers(repository, "none")

    assert await manager.start() == []

    assert [v.version for v in manager.ready_versions("simple")] == ready
    # Versions the policy leaves out were never loaded, so the index does not list them.
    assert await entries(manager, "simple") == [(str(v), "READY", "") for v in ready]


async def test_a_version_policy_that_selects_no_version_fails_the_load(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository, extra_config="version_policy: { specific { versions: [ 9 ] } }")
    manager = managers(repository, "explicit")

    with pytest.raises(TurnoutError) as raised:
        await manager.load("simple")

    assert "at least one version must be available under the version policy of model 'simple'" in str(raised.value)
    assert manager.model_names() == []


async def test_a_model_with_no_version_under_its_policy_makes_the_sidecar_not_ready(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository, extra_config="version_policy: { specific { versions: [ 9 ] } }")
    manager = managers(repository, "none")

    assert len(await manager.start()) == 1

    assert not manager.is_ready()


# -- poll mode --------------------------------------------------------------------------------


async def test_a_poll_loads_a_version_folder_added_to_the_repository(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_linear(repository)  # version_policy: all
    manager = managers(repository, "poll")
    await manager.start()

    shutil.copytree(model_dir / "2", model_dir / "3")
    await manager.poll_once()

    assert await entries(manager, "linear") == [("1", "READY", ""), ("2", "READY", ""), ("3", "READY", "")]
    assert manager.resolve("linear", "").version == 3


async def test_a_poll_unloads_a_version_folder_removed_from_the_repository(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_linear(repository)
    manager = managers(repository, "poll")
    await manager.start()

    shutil.rmtree(model_dir / "2")
    await manager.poll_once()

    assert await entries(manager, "linear") == [("1", "READY", ""), ("2", "UNAVAILABLE", "unloaded")]
    assert manager.resolve("linear", "").version == 1


async def test_a_poll_loads_a_model_added_and_forgets_a_model_removed(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "poll")
    await manager.start()

    shutil.rmtree(repository / "simple")
    make_models.write_linear(repository)
    await manager.poll_once()

    assert {e.name for e in await manager.index(ready_only=False)} == {"linear"}
    assert manager.model_names() == ["linear"]
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("simple", "")
    assert (raised.value.status, raised.value.message) == (
        Status.NOT_FOUND,
        "Request for unknown model: 'simple' is not found",
    )


async def test_a_poll_leaves_an_unchanged_model_loaded_as_it_was(repository: Path, managers: ManagerFactory) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "poll")
    await manager.start()
    serving = manager.resolve("simple", "1")

    await manager.poll_once()

    assert manager.resolve("simple", "1") is serving


# -- a load keeps what has not changed ------------------------------------------------------
# Triton's core keeps a READY version whose files and configuration (its version_policy
# aside) a load finds unchanged, with its instances, statistics and sequences
# (ModelLifeCycle::AsyncLoad); the others are opened again.


async def serving_linear(
    repository: Path, managers: ManagerFactory, runtime: Runtime | None = None
) -> tuple[Path, ModelManager, dict[int, LoadedVersion]]:
    """`linear` (versions 1 and 2) loaded in explicit mode: its folder, manager and versions."""
    model_dir = make_models.write_linear(repository)
    manager = managers(repository, "explicit", load_models=("linear",), runtime=runtime)
    await manager.start()
    return model_dir, manager, {v.version: v for v in manager.ready_versions("linear")}


def rewrite(config: Path, old: str, new: str) -> None:
    """Edit a config file, refusing an edit that would change nothing."""
    text = config.read_text()
    assert old in text, (old, text)
    config.write_text(text.replace(old, new))


def touch(path: Path) -> None:
    """Give a file a later modification time, as an editor's save would."""
    mark = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(mark, mark))


async def test_loading_an_unchanged_model_again_keeps_every_version_as_it_is(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_linear(repository)
    runtime = gated()
    manager = managers(repository, "explicit", load_models=("linear",), runtime=runtime)
    await manager.start()
    serving = {v.version: v for v in manager.ready_versions("linear")}

    await manager.load("linear")
    await manager.load("linear")

    assert {v.version: v for v in manager.ready_versions("linear")} == serving
    assert runtime.loads == 2  # once per version, at start
    assert not any(instance.closed for instance in runtime.instances)


async def test_a_load_opens_again_only_the_version_whose_files_changed(
    repository: Path, managers: ManagerFactory
) -> None:
    runtime = gated()
    model_dir, manager, serving = await serving_linear(repository, managers, runtime)
    touch(model_dir / "2" / "model.onnx")

    await manager.load("linear")

    assert manager.resolve("linear", "1") is serving[1]
    assert manager.resolve("linear", "2") is not serving[2]
    assert runtime.loads == 3
    assert await entries(manager, "linear") == [("1", "READY", ""), ("2", "READY", "")]


@pytest.mark.parametrize("where", ["labels.txt", "extra/notes.txt"])
async def test_a_file_beside_the_version_folders_opens_every_version_again(
    repository: Path, managers: ManagerFactory, where: str
) -> None:
    model_dir, manager, serving = await serving_linear(repository, managers)
    (model_dir / where).parent.mkdir(exist_ok=True)
    (model_dir / where).write_text("a\n")

    await manager.load("linear")

    assert all(manager.resolve("linear", str(v)) is not serving[v] for v in (1, 2))


async def test_a_changed_configuration_opens_every_version_again_and_the_same_text_none(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir, manager, serving = await serving_linear(repository, managers)
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    config.write_text(text)  # written again, not changed
    touch(config)

    await manager.load("linear")

    assert {v.version: v for v in manager.ready_versions("linear")} == serving
    config.write_text(text + 'parameters { key: "note" value: { string_value: "x" } }\n')

    await manager.load("linear")

    assert all(manager.resolve("linear", str(v)) is not serving[v] for v in (1, 2))
    assert manager.resolve("linear", "1").config.parameters["note"].string_value == "x"


async def test_a_load_keeps_the_statistics_of_a_version_it_keeps(repository: Path, managers: ManagerFactory) -> None:
    _, manager, serving = await serving_linear(repository, managers)
    serving[1].stats.load_secs = 12.5  # a mark that a fresh copy would not carry

    await manager.load("linear")

    assert manager.resolve("linear", "1").stats.load_secs == 12.5


async def test_a_load_that_keeps_every_version_is_still_written_to_the_journal(
    repository: Path, managers: ManagerFactory, tmp_path: Path
) -> None:
    _, manager, _ = await serving_linear(repository, managers)
    manager.journal = LoadJournal(tmp_path / "journal")
    override = parse_override(make_models.linear_override([1], warm=False))

    await manager.load("linear", override)  # version 1 kept, version 2 unloaded

    # A restarted sidecar loads it again as the client last did: version 1 alone.
    assert manager.journal.entries()["linear"].override == override


TWO_GROUPS = "instance_group [{{ count: 1 kind: KIND_CPU }}, {{ count: {second} kind: KIND_MODEL }}]"


async def test_a_changed_instance_group_is_updated_in_place_keeping_the_groups_it_does_not_change(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_simple(repository, extra_config=TWO_GROUPS.format(second=1))
    runtime = gated()
    manager = managers(repository, "explicit", load_models=("simple",), runtime=runtime)
    await manager.start()
    serving = manager.resolve("simple", "1")
    rewrite(model_dir / "config.pbtxt", TWO_GROUPS.format(second=1), TWO_GROUPS.format(second=2))

    await manager.load("simple")

    assert manager.resolve("simple", "1") is serving  # its statistics go on
    assert [(g.name, g.count) for g in serving.config.instance_group] == [("simple_0", 1), ("simple_1", 2)]
    assert serving.batcher.instance_count == 3
    # Both instances stay; the second group gets one more, numbered after the one it has.
    assert [(i.name, i.closed) for i in runtime.instances] == [
        ("simple_0_0", False),
        ("simple_1_0", False),
        ("simple_1_1", False),
    ]
    assert await entries(manager, "simple") == [("1", "READY", "")]


async def test_a_smaller_instance_count_closes_the_instances_past_it(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_simple(repository, extra_config="instance_group [{ count: 3 kind: KIND_CPU }]")
    runtime = gated()
    manager = managers(repository, "explicit", load_models=("simple",), runtime=runtime)
    await manager.start()
    serving = manager.resolve("simple", "1")
    rewrite(model_dir / "config.pbtxt", "count: 3", "count: 1")

    await manager.load("simple")

    assert manager.resolve("simple", "1") is serving
    assert serving.batcher.instance_count == 1
    assert [instance.closed for instance in runtime.instances] == [False, True, True]
    assert runtime.loads == 1


async def test_a_gpu_group_grows_and_shrinks_on_each_of_its_gpus(repository: Path, managers: ManagerFactory) -> None:
    # Without GPUs here the instances fall back to the CPU, but each keeps its place: a GPU
    # group's instances are opened GPU by GPU, and an update keeps that order.
    group = "instance_group [{{ count: {count} kind: KIND_GPU gpus: [ 0, 1 ] }}]"
    model_dir = make_models.write_simple(repository, extra_config=group.format(count=1))
    config = model_dir / "config.pbtxt"
    runtime = gated()
    manager = managers(repository, "explicit", load_models=("simple",), runtime=runtime)
    await manager.start()
    serving = manager.resolve("simple", "1")
    first_two = list(runtime.instances)

    rewrite(config, group.format(count=1), group.format(count=2))
    await manager.load("simple")

    assert serving.groups is not None
    [(_, count, instances)] = serving.groups
    added = runtime.instances[2:]
    assert (count, instances) == (2, [first_two[0], added[0], first_two[1], added[1]])  # GPU 0's, then GPU 1's

    rewrite(config, group.format(count=2), group.format(count=1))
    await manager.load("simple")

    [(_, count, instances)] = serving.groups
    assert (count, instances) == (1, first_two)
    assert [instance.closed for instance in runtime.instances] == [False, False, True, True]
    assert manager.resolve("simple", "1") is serving


async def test_a_refused_instance_group_leaves_the_version_serving_as_it_was_saying_why(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_simple(repository)
    manager = managers(repository, "explicit", load_models=("simple",))
    await manager.start()
    serving = manager.resolve("simple", "1")
    groups = list(serving.config.instance_group)
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    config.write_text(text + "instance_group [{ count: 1 kind: KIND_CPU gpus: [0] }]\n")

    with pytest.raises(TurnoutError) as raised:
        await manager.load("simple")

    # Triton 2.51's answer and index, word for word.
    reason = (
        "Invalid argument: instance group simple_0 of model simple has kind KIND_CPU but specifies one or more GPUs"
    )
    assert (raised.value.status, raised.value.message) == (
        Status.INVALID_ARG,
        f"load failed for model 'simple': version 1 is at READY state: {reason};\n",
    )
    assert await entries(manager, "simple") == [("1", "READY", reason)]
    assert manager.resolve("simple", "1") is serving
    assert list(serving.config.instance_group) == groups
    assert manager.is_ready()
    config.write_text(text)

    await manager.load("simple")

    assert await entries(manager, "simple") == [("1", "READY", "")]
    assert manager.resolve("simple", "1") is serving


async def test_a_sequence_model_whose_instance_group_changed_is_updated_in_place(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_sequence(repository, "running_sum", ("READY",), state=True, instances=1)
    manager = managers(repository, "explicit", load_models=("running_sum",))
    await manager.start()
    serving = manager.resolve("running_sum", "1")
    rewrite(model_dir / "config.pbtxt", "count: 1 ", "count: 2 ")

    await manager.load("running_sum")

    assert manager.resolve("running_sum", "1") is serving
    assert serving.config.instance_group[0].count == 2
    assert serving.batcher.instance_count == 2


async def test_uploaded_files_are_opened_at_every_load(
    repository: Path, managers: ManagerFactory, tmp_path: Path
) -> None:
    model_dir = make_models.write_linear(tmp_path / "source")
    files = {"1/model.onnx": (model_dir / "1" / "model.onnx").read_bytes()}
    override = parse_override(make_models.linear_override([1], warm=False))
    manager = managers(repository, "explicit")
    await manager.start()

    await manager.load("linear", override, files)
    first = manager.resolve("linear", "1")
    await manager.load("linear", override, files)

    assert manager.resolve("linear", "1") is not first  # Triton writes them to a new folder each time


async def test_a_poll_opens_again_only_the_version_whose_files_changed(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir = make_models.write_linear(repository)
    manager = managers(repository, "poll")
    await manager.start()
    serving = {v.version: v for v in manager.ready_versions("linear")}
    touch(model_dir / "1" / "model.onnx")

    await manager.poll_once()

    assert manager.resolve("linear", "1") is not serving[1]
    assert manager.resolve("linear", "2") is serving[2]


# -- version resolution -----------------------------------------------------------------------


async def test_an_empty_version_resolves_to_the_newest_ready_version(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_linear(repository)
    manager = managers(repository, "none")
    await manager.start()

    assert manager.resolve("linear", "").version == 2
    assert manager.resolve("linear", "1").version == 1
    assert manager.resolve("linear", " 1st").version == 1  # std::stol reads the leading number, as Triton
    for text, words in (
        ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
        (
            "x",
            "failed to get model version from specified version string 'x' (details: stol), "
            "version should be an integral value > 0",
        ),
    ):
        with pytest.raises(TurnoutError) as caught:
            manager.resolve("linear", text)
        assert (caught.value.status, caught.value.message) == (Status.INVALID_ARG, words)


async def test_the_newest_ready_version_skips_a_newer_version_that_failed_to_load(
    repository: Path, managers: ManagerFactory
) -> None:
    model_dir, manager, _ = await serving_linear(repository, managers)
    shutil.copytree(model_dir / "2", model_dir / "3")
    spoil(model_dir / "3")

    with pytest.raises(TurnoutError):
        await manager.load("linear")

    assert [state for _, state, _ in await entries(manager, "linear")] == ["READY", "READY", "UNAVAILABLE"]
    assert manager.resolve("linear", "").version == 2
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("linear", "3")
    assert (raised.value.status, raised.value.message) == (
        Status.UNAVAILABLE,
        "Request for unknown model: 'linear' version 3 is not at ready state",
    )


@pytest.mark.parametrize(
    ("model", "version_text", "status", "message"),
    [
        ("missing", "", Status.NOT_FOUND, "Request for unknown model: 'missing' is not found"),
        ("linear", "99", Status.NOT_FOUND, "Request for unknown model: 'linear' version 99 is not found"),
        (
            "linear",
            "one",
            Status.INVALID_ARG,
            "failed to get model version from specified version string 'one' (details: stol), "
            "version should be an integral value > 0",
        ),
    ],
    ids=["unknown-model", "unknown-version", "not-a-number"],
)
async def test_a_model_or_version_that_cannot_be_resolved_gives_tritons_error(
    repository: Path, managers: ManagerFactory, model: str, version_text: str, status: Status, message: str
) -> None:
    make_models.write_linear(repository)
    manager = managers(repository, "none")
    await manager.start()

    with pytest.raises(TurnoutError) as raised:
        manager.resolve(model, version_text)

    assert (raised.value.status, raised.value.message) == (status, message)
    if status is Status.INVALID_ARG:  # Triton's ModelReady refuses a version it cannot read
        with pytest.raises(TurnoutError):
            manager.is_model_ready(model, version_text)
    else:
        assert not manager.is_model_ready(model, version_text)


async def test_a_model_in_the_repository_but_never_loaded_is_unknown_to_requests_saying_how_to_load_it(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    manager = managers(repository, "explicit")
    await manager.start()

    with pytest.raises(TurnoutError) as raised:
        manager.resolve("simple", "")

    assert (raised.value.status, raised.value.message) == (
        Status.NOT_FOUND,
        "Request for unknown model: 'simple' is not found (model 'simple' is in the repository but not loaded; "
        "load it with POST /v2/repository/models/simple/load)",
    )
    with pytest.raises(TurnoutError) as raised:
        manager.resolve("elsewhere", "")
    assert raised.value.message == "Request for unknown model: 'elsewhere' is not found"


# -- concurrent loads -------------------------------------------------------------------------


async def test_concurrent_loads_of_one_model_run_one_at_a_time_and_leave_one_live_copy(
    repository: Path, managers: ManagerFactory
) -> None:
    make_models.write_simple(repository)
    runtime = gated(loads_open=False)
    manager = managers(repository, "explicit", runtime=runtime)

    first = asyncio.create_task(manager.load("simple"))
    assert await reached(runtime.loading)
    runtime.loading.clear()
    # Another configuration, so the second load must open the model again.
    second = asyncio.create_task(manager.load("simple", parse_override('{"max_batch_size": "16"}')))
    # The first load holds the model, so the second must not reach the runtime meanwhile.
    assert not await reached(runtime.loading, OVERLAP_WINDOW_S)
    runtime.loads_open.set()
    await asyncio.gather(first, second)

    assert runtime.most_at_once == 1
    assert await entries(manager, "simple") == [("1", "READY", "")]
    assert manager.resolve("simple", "1").config.max_batch_size == 16
    # Two loads of two CPU instances each (Triton's default for onnxruntime): the first
    # copy's instances were closed when the second copy took over.
    assert [instance.closed for instance in runtime.instances] == [True, True, False, False]


async def test_concurrent_loads_of_an_unchanged_model_open_it_once(repository: Path, managers: ManagerFactory) -> None:
    make_models.write_simple(repository)
    runtime = gated()
    manager = managers(repository, "explicit", runtime=runtime)

    await asyncio.gather(manager.load("simple"), manager.load("simple"))

    assert await entries(manager, "simple") == [("1", "READY", "")]
    assert runtime.loads == 1
