"""Start `python -m sidecars` as a real process on loopback for the sidecar tests.

The sidecar binds port 0 and prints its address on one ready line, which we wait for
(never a sleep). No protos.*_pb2 here: tests talk through tritonclient only.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protos.ready import SIDECAR_READY, parse_ready
from tests.harness import ROOT, pump_lines, terminate

START_TIMEOUT_S = 60.0

DATATYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32", "FP64"]
DATATYPES += ["BYTES"]

LABELS = ["cat", "dog", "bird", "fish"]


@dataclass
class Sidecar:
    url: str
    process: subprocess.Popen[str]
    pump: threading.Thread
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit status (killed after `timeout`)."""
        terminate(self.process, timeout)
        _close(self.process, self.pump)
        return self.process.returncode


class SidecarFailedToStart(AssertionError):
    def __init__(self, message: str, returncode: int | None, output: str) -> None:
        super().__init__(f"{message}; output:\n{output}")
        self.returncode = returncode
        self.output = output


def launch(repository: Path, *flags: str, framework: str = "onnxruntime") -> Sidecar:
    """Start a sidecar and return once it printed its ready line."""
    command = [
        sys.executable,
        "-m",
        "sidecars",
        f"--framework={framework}",
        f"--model-repository={repository}",
        "--host=127.0.0.1",
        "--port=0",
        "--exit-timeout-secs=5",
        *flags,
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    sink: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=pump_lines, args=(process.stdout, sink, lines), daemon=True)
    pump.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            process.kill()
            process.wait()
            _close(process, pump)
            raise SidecarFailedToStart("no ready line", None, "".join(lines))
        try:
            line = sink.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            code = process.wait(timeout=10)
            _close(process, pump)
            raise SidecarFailedToStart(f"exited with {code} before ready", code, "".join(lines))
        fields = parse_ready(line, SIDECAR_READY)
        if fields is not None:
            assert fields["framework"] == framework, line
            return Sidecar(fields["grpc"], process, pump, lines)


def _close(process: subprocess.Popen[str], pump: threading.Thread) -> None:
    pump.join(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


@contextlib.contextmanager
def running(repository: Path, *flags: str, framework: str = "onnxruntime") -> Iterator[Sidecar]:
    sidecar = launch(repository, *flags, framework=framework)
    try:
        yield sidecar
    finally:
        code = sidecar.stop()
        assert code == 0, f"sidecar exited with {code}; output:\n{sidecar.output()}"


def simple_inputs(client_module: object, batch: int = 1, dtype: type = np.int32) -> tuple[list[object], np.ndarray]:
    """INPUT0 = 0..15, INPUT1 = ones, as tritonclient InferInputs of `client_module`."""
    data = np.tile(np.arange(16, dtype=dtype), (batch, 1))
    ones = np.ones((batch, 16), dtype=dtype)
    name = "INT32" if dtype == np.int32 else "FP32"
    inputs = [
        client_module.InferInput("INPUT0", [batch, 16], name),  # type: ignore[attr-defined]
        client_module.InferInput("INPUT1", [batch, 16], name),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(ones)
    return inputs, data
