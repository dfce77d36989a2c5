"""`turnout up`: start one sidecar per framework the repository needs, then serve the
gateway in this process, and stop the children after the gateway has drained.

Children run in their own session (a terminal's Ctrl-C reaches only us, so shutdown
keeps its order) and die with us even on SIGKILL (Linux parent-death signal). A child
that dies is restarted, with backoff, on the same gRPC port and lane socket, so the
gateway's clients reconnect to it unchanged; the log says how it died.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tenacity import Retrying, retry_if_exception_type, wait_exponential

from gateway.settings import GatewaySettings, SidecarAddress
from protos.children import die_with_parent
from protos.logs import LogSettings
from protos.ready import SIDECAR_READY, parse_ready
from turnout.scan import frameworks_in, models_in, startup_loads, startup_steps

log = logging.getLogger("turnout.supervisor")

# A child that dies sooner than this after its start counts as crash-looping: its next
# restart waits longer, doubling up to the cap.
STABLE_SECS = 30.0
RESTART_BACKOFF_SECS = (0.5, 10.0)


@dataclass
class _Child:
    framework: str
    process: subprocess.Popen[str]
    address: str = ""
    lane: str = ""
    metrics: str = ""
    lane_folder: str = ""
    started: float = 0.0
    quick_deaths: int = 0


class Supervisor:
    """Owns the sidecar children of one `turnout up`."""

    def __init__(
        self,
        repositories: Sequence[str],
        arguments: Sequence[str],
        *,
        load_models: Sequence[str] = (),
        model_config_name: str = "",
        exit_timeout_secs: float,
        logs: LogSettings | None = None,
    ) -> None:
        self._repositories = list(repositories)
        self._arguments = list(arguments)
        self._load_models = list(load_models)
        self._config_name = model_config_name
        self._loads: dict[str, list[str]] = {}
        self._exit_timeout = exit_timeout_secs
        self._logs = logs or LogSettings()
        self._children: list[_Child] = []
        # Set before the children are stopped: from then on, a child's exit is no death.
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self, settings_for: Callable[[tuple[SidecarAddress, ...]], GatewaySettings]) -> int:
        from gateway.app import run as run_gateway

        self._logs.apply()  # the same lines as the gateway's and the sidecars': --log-format, --log-file
        try:
            models = models_in(self._repositories, self._config_name)
            frameworks = frameworks_in(models)
            self._loads = startup_loads(models, self._load_models, frameworks)
            for framework in frameworks:
                self._start(framework)
            addresses = tuple(SidecarAddress(c.framework, c.address, c.lane, c.metrics) for c in self._children)
            steps = tuple(startup_steps(models, self._load_models))
            return run_gateway(replace(settings_for(addresses), startup_steps=steps))
        except _StartFailed as failure:
            log.error("%s", failure)
            return 1
        finally:
            self._stop_children()

    def _start(self, framework: str) -> None:
        # The lane socket lives in a folder we own, so a restarted child binds the same path.
        folder = tempfile.mkdtemp(prefix="turnout-")
        child = _Child(framework, None, lane_folder=folder)  # type: ignore[arg-type]
        self._children.append(child)
        self._launch(child, ["--port=0"])
        # The thread that started a child must outlive it (the parent-death signal
        # follows the forking thread), so the watcher restarts children itself.
        threading.Thread(target=self._watch, args=(child,), daemon=True).start()

    def _launch(self, child: _Child, placement: list[str]) -> None:
        """Start `child`'s process and wait for its ready line; raises _StartFailed."""
        command = [
            sys.executable,
            "-m",
            "sidecars",
            f"--framework={child.framework}",
            "--host=127.0.0.1",
            *self._arguments,
            *(f"--load-model={name}" for name in self._loads.get(child.framework, ())),
            # One sidecar lists the folders no framework serves, so each is refused once.
            f"--report-unassigned-models={'true' if child is self._children[0] else 'false'}",
            f"--lane-path={os.path.join(child.lane_folder, 'lane.sock')}",
            *placement,  # after the shared flags: click keeps an option's last value
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        with self._lock:
            child.process = process
            if self._stopping.is_set():
                process.send_signal(signal.SIGTERM)
        framework = child.framework
        child.started = time.monotonic()
        assert process.stdout is not None
        for line in process.stdout:
            fields = parse_ready(line, SIDECAR_READY)
            if fields is not None:
                child.address = fields["grpc"]
                child.lane = "" if fields.get("lane", "off") == "off" else fields["lane"]
                child.metrics = "" if fields.get("metrics", "off") == "off" else fields["metrics"]
                break
            sys.stdout.write(line)
        else:
            code = process.wait()
            raise _StartFailed(f"the {framework} sidecar exited with status {code} before it was ready")
        log.info("%s sidecar ready on %s (pid %d)", framework, child.address, process.pid)

    def _watch(self, child: _Child) -> None:
        """Forward the child's output until it exits; restart it unless we are stopping."""
        while True:
            process = child.process
            _forward(process.stdout)  # also keeps the pipe drained, so a chatty child never blocks
            code = process.wait()
            if self._stopping.is_set():
                return
            lived = time.monotonic() - child.started
            child.quick_deaths = child.quick_deaths + 1 if lived < STABLE_SECS else 0
            first, cap = RESTART_BACKOFF_SECS
            delay = min(first * 2 ** (child.quick_deaths - 1), cap) if child.quick_deaths else 0.0
            log.error(
                "the %s sidecar (pid %d) died: %s after %.1f s; restarting in %.1f s",
                child.framework,
                process.pid,
                _exit_reason(code),
                lived,
                delay,
            )
            if self._stopping.wait(delay):
                return
            port = child.address.rpartition(":")[2]
            placement = [f"--port={port}"]
            if child.metrics:
                placement.append(f"--metrics-port={child.metrics.rpartition(':')[2]}")
            try:
                for attempt in Retrying(
                    retry=retry_if_exception_type(_StartFailed),
                    wait=wait_exponential(multiplier=first, max=cap),
                    stop=lambda _: self._stopping.is_set(),
                    reraise=True,
                ):
                    with attempt:
                        self._launch(child, placement)
            except _StartFailed as failure:
                log.error("gave up restarting the %s sidecar: %s", child.framework, failure)
                return

    def _stop_children(self) -> None:
        """SIGTERM every child, give them the drain window, then SIGKILL what is left."""
        with self._lock:
            self._stopping.set()
            for child in self._children:
                if child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
        for child in self._children:
            try:
                child.process.wait(timeout=self._exit_timeout + 1)
            except subprocess.TimeoutExpired:
                log.warning("%s sidecar did not stop in time; killing it", child.framework)
                child.process.kill()
                child.process.wait()
            shutil.rmtree(child.lane_folder, ignore_errors=True)


class _StartFailed(Exception):
    pass


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with status {code}"


def _forward(stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(line)
        sys.stdout.flush()
