"""`turnout up`: start one sidecar per framework the repository needs, then serve the
gateway in this process, and stop the children after the gateway has drained.

Children run in their own session (a terminal's Ctrl-C reaches only us, so shutdown
keeps its order) and die with us even on SIGKILL (Linux parent-death signal).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import GatewaySettings, SidecarAddress
from protos.layout import framework_of_model

log = logging.getLogger("turnout.supervisor")

READY_PREFIX = "TURNOUT_SIDECAR_READY"
DEFAULT_FRAMEWORK = "onnxruntime"
_PR_SET_PDEATHSIG = 1


def frameworks_in(repositories: Sequence[str]) -> list[str]:
    """The frameworks whose models the repositories hold, in a stable order."""
    found: set[str] = set()
    for repository in repositories:
        for model_dir in sorted(Path(repository).iterdir()):
            if model_dir.is_dir() and not model_dir.name.startswith("."):
                framework = framework_of_model(model_dir)
                if framework:
                    found.add(framework)
    # An empty repository still gets the default sidecar, so explicit loads have a home.
    return sorted(found) or [DEFAULT_FRAMEWORK]


def sidecar_arguments(
    *,
    model_repositories: Sequence[str],
    model_control_mode: str,
    load_models: Sequence[str],
    exit_on_error: bool,
    strict_readiness: bool,
    repository_poll_secs: float,
    disable_auto_complete_config: bool,
    backend_configs: Sequence[str],
    exit_timeout_secs: float,
    log_verbose: int,
) -> list[str]:
    """The command-line flags every sidecar of a `turnout up` shares."""
    arguments = [f"--model-repository={r}" for r in model_repositories]
    arguments += [
        f"--model-control-mode={model_control_mode}",
        f"--repository-poll-secs={repository_poll_secs}",
        f"--exit-timeout-secs={exit_timeout_secs}",
        f"--log-verbose={log_verbose}",
        "--exit-on-error" if exit_on_error else "--no-exit-on-error",
        "--strict-readiness" if strict_readiness else "--no-strict-readiness",
    ]
    arguments += [f"--load-model={m}" for m in load_models]
    arguments += [f"--backend-config={c}" for c in backend_configs]
    if disable_auto_complete_config:
        arguments.append("--disable-auto-complete-config")
    return arguments


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Child:
    framework: str
    process: subprocess.Popen[str]
    address: str = ""
    lane: str = ""


class Supervisor:
    """Owns the sidecar children of one `turnout up`."""

    def __init__(self, repositories: Sequence[str], arguments: Sequence[str], *, exit_timeout_secs: float) -> None:
        self._repositories = list(repositories)
        self._arguments = list(arguments)
        self._exit_timeout = exit_timeout_secs
        self._children: list[_Child] = []

    def run(self, settings_for: Callable[[tuple[SidecarAddress, ...]], GatewaySettings]) -> int:
        from gateway.app import run as run_gateway

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            for framework in frameworks_in(self._repositories):
                self._start(framework)
            addresses = tuple(SidecarAddress(c.framework, c.address, c.lane) for c in self._children)
            return run_gateway(settings_for(addresses))
        except _StartFailed as failure:
            log.error("%s", failure)
            return 1
        finally:
            self._stop_children()

    def _start(self, framework: str) -> None:
        command = [
            sys.executable,
            "-m",
            "sidecars",
            f"--framework={framework}",
            "--host=127.0.0.1",
            "--port=0",
            *self._arguments,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        child = _Child(framework, process)
        self._children.append(child)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(READY_PREFIX):
                fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                child.address = fields["grpc"]
                child.lane = "" if fields.get("lane", "off") == "off" else fields["lane"]
                break
            sys.stdout.write(line)
        else:
            code = process.wait()
            raise _StartFailed(f"the {framework} sidecar exited with status {code} before it was ready")
        log.info("%s sidecar ready on %s (pid %d)", framework, child.address, process.pid)
        # Keep its stdout drained so a chatty child never blocks on a full pipe.
        threading.Thread(target=_forward, args=(process.stdout,), daemon=True).start()

    def _stop_children(self) -> None:
        """SIGTERM every child, give them the drain window, then SIGKILL what is left."""
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


class _StartFailed(Exception):
    pass


def _forward(stream: object) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sys.stdout.write(line)
        sys.stdout.flush()
