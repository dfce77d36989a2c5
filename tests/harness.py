"""Start `turnout up` as a real process on loopback and hand its addresses to tests.

Servers bind port 0 and report the ports they got on one ready line; we wait on that
line (never on a sleep) and show the process's own output when it fails to start.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from protos.ready import GATEWAY_READY, parse_ready, quiet_port

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


_handed_out: set[int] = set()


def loopback_bytes() -> int:
    """Bytes the loopback interface has carried (Linux, /proc/net/dev)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    raise AssertionError("no loopback interface")


def flood(address: str, opening: bytes, unit: bytes, limit: int, stall: float) -> tuple[int, bool]:
    """Connects to `address` ("host:port") as a client that reads nothing, sends `opening`,
    then `unit` again and again (never a part of one before the whole one before it), until
    the server has taken none of it for `stall` seconds or `limit` bytes are sent:
    (bytes sent, whether it stalled)."""
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # holds little of the answers
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    try:
        sock.connect((host, int(port)))
        sock.sendall(opening)
        sock.setblocking(False)
        sent = 0
        while sent < limit:
            if not select.select([], [sock], [], stall)[1]:
                return sent, True
            with contextlib.suppress(BlockingIOError):
                sent += sock.send(memoryview(unit)[sent % len(unit) :])
        return sent, False
    finally:
        sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server that cannot bind port 0 and report it:
    below the kernel's own range (protos.ready.quiet_port), never the same twice in one run."""
    port = quiet_port(host, _handed_out)
    _handed_out.add(port)
    return port


def make_models() -> ModuleType:
    """scripts/make_models.py, the builders of the test models."""
    return importlib.import_module("scripts.make_models")


@dataclass
class Server:
    """One running `turnout up`: its three addresses and everything it printed."""

    http: str
    grpc: str
    metrics: str
    process: subprocess.Popen[str]
    repository: Path
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def alive(self) -> bool:
        return self.process.poll() is None

    def json_lines(self) -> list[dict[str, object]]:
        """The JSON objects among its output lines (both processes', under --log-format=json)."""
        documents = []
        for line in self.lines:
            with contextlib.suppress(ValueError):
                document = json.loads(line)
                if isinstance(document, dict):
                    documents.append(document)
        return documents


class ServerFailedToStart(AssertionError):
    pass


def pump_lines(stream: object, sink: queue.Queue[str | None], lines: list[str]) -> None:
    """Copy `stream` line by line into `lines` and `sink`, then put None; run it on a thread."""
    # Drains the child's output for its whole life, so a chatty child never blocks.
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)
        sink.put(line)
    sink.put(None)


@contextlib.contextmanager
def turnout_up(
    repository: Path,
    *flags: str,
    start_timeout: float = START_TIMEOUT_S,
    stop_timeout: float = STOP_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Run `python -m turnout up` on `repository` with `flags`; yield once it prints its ready line."""
    command = [
        sys.executable,
        "-m",
        "turnout",
        "up",
        f"--model-repository={repository}",
        "--host=127.0.0.1",
        "--http-port=0",
        "--grpc-port=0",
        "--metrics-port=0",
        "--exit-timeout-secs=5",
        *flags,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    sink: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=pump_lines, args=(process.stdout, sink, lines), daemon=True)
    pump.start()
    try:
        server = _wait_ready(process, sink, lines, repository, start_timeout)
        yield server
    finally:
        _stop(process, stop_timeout)
        pump.join(timeout=5)


def _wait_ready(
    process: subprocess.Popen[str],
    sink: queue.Queue[str | None],
    lines: list[str],
    repository: Path,
    timeout: float,
) -> Server:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerFailedToStart(f"no {GATEWAY_READY} line within {timeout:.0f}s; output:\n{''.join(lines)}")
        try:
            line = sink.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            code = process.wait(timeout=10)
            raise ServerFailedToStart(f"turnout up exited with {code} before it was ready; output:\n{''.join(lines)}")
        fields = parse_ready(line, GATEWAY_READY)
        if fields is not None:
            missing = {"http", "grpc", "metrics"} - fields.keys()
            if missing:
                raise ServerFailedToStart(f"ready line lacks {sorted(missing)}: {line!r}")
            return Server(fields["http"], fields["grpc"], fields["metrics"], process, repository, lines)


def _stop(process: subprocess.Popen[str], timeout: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The whole session: the supervisor and any sidecar it left behind.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether `predicate` turns true within `timeout`; polled, since another process
    writes what it checks and there is no event to wait on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def terminate(process: subprocess.Popen[str], timeout: float) -> None:
    """SIGTERM `process`; SIGKILL it if it outlives `timeout`; reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def live_children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs: it exists and is no zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def write_repository(repo: Path, models: Sequence[str]) -> Path:
    """Build the named test models into `repo` (see MODELS)."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in models:
        MODELS[name](repo)
    return repo


def _simple(repo: Path) -> None:
    make_models().write_simple(repo)


def _simple_string(repo: Path) -> None:
    make_models().write_simple_string(repo)


def _simple_identity(repo: Path) -> None:
    make_models().write_identity(repo)


def _linear(repo: Path) -> None:
    make_models().write_linear(repo)


def _identity_fp32(repo: Path) -> None:
    make_models().write_identity(repo, name="identity_fp32", datatype="FP32")


def _identity_fp16(repo: Path) -> None:
    make_models().write_identity(repo, name="identity_fp16", datatype="FP16")


def _simple_stats(repo: Path) -> None:
    make_models().write_simple(repo, name="simple_stats")


def _simple_batched(repo: Path) -> None:
    make_models().write_simple(
        repo,
        name="simple_batched",
        max_batch_size=32,
        extra_config="dynamic_batching { max_queue_delay_microseconds: 20000 }",
    )


def _simple_queue(repo: Path) -> None:
    # Holds a request a second in the queue, and queues at most one.
    make_models().write_simple(
        repo,
        name="simple_queue",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 1000000 "
        "default_queue_policy { max_queue_size: 1 } }",
    )


def _simple_timeout(repo: Path) -> None:
    # Holds requests 3 s in the queue but lets them wait 0.1 s.
    make_models().write_simple(
        repo,
        name="simple_timeout",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { default_timeout_microseconds: 100000 timeout_action: REJECT } }",
    )


def _simple_held(repo: Path) -> None:
    # Holds every request 1.5 s in the queue, with no queue timeout of its own.
    make_models().write_simple(
        repo, name="simple_held", extra_config="dynamic_batching { max_queue_delay_microseconds: 1500000 }"
    )


def _simple_int8(repo: Path) -> None:
    make_models().write_simple(repo, name="simple_int8", datatype="INT8")


MODELS = {
    "simple": _simple,
    "simple_string": _simple_string,
    "simple_identity": _simple_identity,
    "linear": _linear,
    "identity_fp32": _identity_fp32,
    "identity_fp16": _identity_fp16,
    "simple_stats": _simple_stats,
    "simple_batched": _simple_batched,
    "simple_int8": _simple_int8,
    "simple_queue": _simple_queue,
    "simple_timeout": _simple_timeout,
    "simple_held": _simple_held,
}


def onnx_identity_bytes(tmp: Path, datatype: str = "FP32") -> bytes:
    """The bytes of a fresh ONNX identity model, for uploads through the load API."""
    model_dir: Path = make_models().write_identity(tmp, name="upload_source", datatype=datatype, with_config=False)
    return (model_dir / "1" / "model.onnx").read_bytes()
