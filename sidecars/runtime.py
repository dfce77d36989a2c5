"""The seam between the sidecar and a framework: the Runtime and ModelInstance contracts,
and the table that imports a runtime by name only when its sidecar starts."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from protos import model_config_pb2 as mc
from protos.status import TurnoutError, unavailable

if TYPE_CHECKING:
    from protos.triton_metrics import Exposition
    from protos.validation import Answer, ValidRequest

# Imported lazily, so the ONNX image never imports torch or tensorrt.
RUNTIMES: dict[str, str] = {
    "onnxruntime": "sidecars.onnxruntime.runtime:OnnxRuntime",
    "pytorch": "sidecars.pytorch.runtime:TorchRuntime",
    "tensorrt": "sidecars.tensorrt.runtime:TensorrtRuntime",
    "ensemble": "sidecars.ensemble.runtime:EnsembleRuntime",
    "python": "sidecars.python.runtime:PythonRuntime",
}

Tensors = Mapping[str, np.ndarray]


class ModelInstance(Protocol):
    """One execution slot of a loaded model version (one per instance_group instance)."""

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        """Run one batch on this instance's own thread; outputs by name, batch dim first
        when the model batches. Never called again before the previous call returns."""
        ...

    def close(self) -> None:
        """Release the framework's resources; called once, after the last execute."""
        ...


@runtime_checkable
class RequestInstance(ModelInstance, Protocol):
    """An instance that takes whole requests rather than one stacked batch (a python
    model's `execute` gets a list of requests, each with its own parameters and outputs)."""

    async def execute_requests(self, requests: Sequence[ValidRequest]) -> list[Answer | TurnoutError | None]:
        """Each request's outputs or its own error, in order; raises for the whole batch.
        None for a request whose responses go to its `responses` callback (decoupled)."""
        ...


@runtime_checkable
class MetricsSource(Protocol):
    """A runtime with metrics of its own (python models' custom ones) for the sidecar's scrape."""

    def add_metrics(self, exposition: Exposition) -> None: ...


class RuntimeUnavailable(Exception):
    """This machine cannot run the framework (package or GPU missing); the text says
    which, in one line."""


class Runtime(Protocol):
    """A framework: completes configs from model files and loads model versions.

    The constructor raises RuntimeUnavailable where the framework cannot run here.
    """

    def gpu_count(self) -> int:
        """GPUs this framework can use on this machine; 0 resolves KIND_AUTO to KIND_CPU."""
        ...

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        """Fill inputs, outputs and batching from the model file, as Triton's backend does.

        Raises TurnoutError with Triton's autofill text when the config contradicts the model.
        """
        ...

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        """Blocking: one instance per instance_group instance of a complete config, group
        by group and, in a GPU group, GPU by GPU. With `first`, group g opens only its
        instances numbered first[g] and up (on each of its GPUs), as an in-place update
        adds instances after those a group has."""
        ...


# Handing a call to a thread and back costs two wake-ups, tens of microseconds; a model
# that runs faster than this is cheaper to run on the event loop than to hand off.
INLINE_BELOW_NS = 60_000
# An inline model goes back to its thread only when it is several times slower than that:
# a busy host slows every run of a window alike (and a profiler, the inline ones more than
# those on the thread), which must not move a fast model back and forth.
THREAD_ABOVE_NS = 4 * INLINE_BELOW_NS
_UNMEASURED = 2**63


# How many runs decide where the next ones go: the fastest of them, since any run also
# waits for the GIL whenever another thread holds it (by up to the interpreter's switch
# interval), which the fastest run of a window escapes.
RUN_WINDOW = 32


class ThreadedInstance:
    """Base for instances whose framework call blocks: each owns one worker thread,
    created once at load, so no request ever creates a thread.

    A model that runs in less than INLINE_BELOW_NS runs inline on the event loop instead:
    after every RUN_WINDOW runs, wherever they ran, the fastest of them decides where
    the next ones go, so a model that slows down past THREAD_ABOVE_NS (bigger batches)
    moves back to its thread by itself, and waits for the GIL do not keep a fast one there.
    """

    def __init__(self, name: str) -> None:
        self.name = name  # Triton's instance name, <group>_<number>
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._inline = False  # on the thread until measured
        self._fastest_ns = _UNMEASURED  # of this window's runs
        self._runs = 0

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _timed_run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        start = time.perf_counter_ns()
        try:
            return self.run(inputs)
        finally:
            self._fastest_ns = min(self._fastest_ns, time.perf_counter_ns() - start)

    @property
    def inline(self) -> bool:
        """Whether the next run is on the event loop."""
        return self._inline

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        if self._inline:
            return self.run_inline(inputs)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._timed_run, inputs)
        finally:
            self._count_run()

    def run_inline(self, inputs: Tensors) -> dict[str, np.ndarray]:
        """One run on the calling thread (the event loop), counted as `execute` counts it."""
        try:
            return self._timed_run(inputs)
        finally:
            self._count_run()

    def _count_run(self) -> None:
        self._runs += 1
        if self._runs >= RUN_WINDOW:
            self._inline = self._fastest_ns < (THREAD_ABOVE_NS if self._inline else INLINE_BELOW_NS)
            self._runs, self._fastest_ns = 0, _UNMEASURED

    def close(self) -> None:
        self._thread.shutdown(wait=True)


class UnavailableRuntime:
    """Stands in for a framework that cannot run here, so its models are listed as
    UNAVAILABLE with the reason instead of the sidecar refusing to start."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def gpu_count(self) -> int:
        return 0

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        raise unavailable(self.reason)

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        raise unavailable(self.reason)


def runtime_for(framework: str, options: Sequence[tuple[str, str]] = ()) -> Runtime:
    """Import and build the runtime of a framework named in RUNTIMES; raises
    RuntimeUnavailable where this machine cannot run it."""
    target = RUNTIMES.get(framework)
    if target is None:
        raise ValueError(f"no runtime for framework '{framework}'; known: {', '.join(sorted(RUNTIMES))}")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] in ("sidecars", "protos"):
            raise
        raise RuntimeUnavailable(
            f"the {framework} sidecar cannot start: the '{exc.name}' package is not installed "
            f"(pip install 'turnout[{framework}]')"
        ) from exc
    runtime_class = getattr(module, class_name)
    runtime: Runtime = runtime_class(dict(options))
    return runtime
