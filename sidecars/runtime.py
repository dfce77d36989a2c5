"""The seam between the sidecar and a framework: the Runtime and ModelInstance contracts,
and the table that imports a runtime by name only when its sidecar starts."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from protos import model_config_pb2 as mc

# Imported lazily, so the ONNX image never imports torch or tensorrt.
RUNTIMES: dict[str, str] = {
    "onnxruntime": "sidecars.onnxruntime.runtime:OnnxRuntime",
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


class Runtime(Protocol):
    """A framework: completes configs from model files and loads model versions."""

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        """Fill inputs, outputs and batching from the model file, as Triton's backend does.

        Raises TurnoutError with Triton's autofill text when the config contradicts the model.
        """
        ...

    def load(self, config: mc.ModelConfig, version_dir: Path) -> list[ModelInstance]:
        """Blocking: one instance per instance_group instance of a complete config."""
        ...


# Handing a call to a thread and back costs two wake-ups, tens of microseconds; a model
# that runs faster than this is cheaper to run on the event loop than to hand off.
INLINE_BELOW_NS = 60_000


class ThreadedInstance:
    """Base for instances whose framework call blocks: each owns one worker thread,
    created once at load, so no request ever creates a thread.

    Runs that take less than INLINE_BELOW_NS on average run inline on the event loop
    instead; the average keeps being measured, so a model that slows down (bigger
    batches) moves back to its thread by itself.
    """

    def __init__(self, name: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._average_ns = float(INLINE_BELOW_NS)  # start on the thread until measured

    def run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _timed_run(self, inputs: Tensors) -> dict[str, np.ndarray]:
        start = time.perf_counter_ns()
        try:
            return self.run(inputs)
        finally:
            self._average_ns += (time.perf_counter_ns() - start - self._average_ns) / 8

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        if self._average_ns < INLINE_BELOW_NS:
            return self._timed_run(inputs)
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._timed_run, inputs)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


def runtime_for(framework: str, options: Sequence[tuple[str, str]] = ()) -> Runtime:
    """Import and build the runtime of a framework named in RUNTIMES."""
    target = RUNTIMES.get(framework)
    if target is None:
        raise ValueError(f"no runtime for framework '{framework}'; known: {', '.join(sorted(RUNTIMES))}")
    module_name, _, class_name = target.partition(":")
    runtime_class = getattr(importlib.import_module(module_name), class_name)
    runtime: Runtime = runtime_class(dict(options))
    return runtime
