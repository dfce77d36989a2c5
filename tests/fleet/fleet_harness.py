"""Real fleet processes for the fleet tests: a Consul agent in dev mode, sidecars that
register with it, and gateways that discover them. Each reports readiness on a line
(or, for Consul, through its HTTP API) that we wait on; nothing sleeps blindly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from protos.ready import GATEWAY_READY, SIDECAR_READY, parse_ready
from tests.harness import ROOT, free_port, pump_lines, terminate
from tests.pki import Pki

CONSUL = ROOT / ".tools" / "consul" / "usr" / "bin" / "consul"
START_TIMEOUT_S = 60.0
NO_CONSUL = (
    "no consul binary: `make setup` fetches Debian's (scripts/install-consul, needs apt-get); "
    "elsewhere put a consul binary, 1.8 or newer, on PATH (e.g. `brew install consul`)"
)


def consul_binary() -> Path | None:
    if CONSUL.exists():
        return CONSUL
    found = shutil.which("consul")
    return Path(found) if found else None


async def wait_until_async(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.05
) -> None:
    """`wait_until` for an async `check`: a policy change has no event a test can wait on."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; the other process gives no event to wait on.
    `what` names what was awaited; a callable is asked only on a timeout (a process's output then)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


@dataclass
class Process:
    """A child process, its output lines so far, and the fields of its ready line."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)
    pump: threading.Thread | None = None

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout: float = 20.0) -> int:
        terminate(self.process, timeout)
        self._release()
        return int(self.process.returncode)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._release()

    def _release(self) -> None:
        if self.pump is not None:
            self.pump.join(timeout=5)
        if self.process.stdout is not None and (self.pump is None or not self.pump.is_alive()):
            self.process.stdout.close()


def spawn(
    command: Sequence[str],
    ready_prefix: str | None,
    timeout: float = START_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> Process:
    """Start `command` (with `env` added to ours); with `ready_prefix`, return once it
    prints that line."""
    process = subprocess.Popen(
        list(command),
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    running = Process(process)
    sink: queue.Queue[str | None] = queue.Queue()
    running.pump = threading.Thread(target=pump_lines, args=(process.stdout, sink, running.lines), daemon=True)
    running.pump.start()
    if ready_prefix is None:
        return running
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = sink.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            running.kill()
            raise AssertionError(f"no {ready_prefix} within {timeout:.0f}s:\n{running.output()}") from None
        if line is None:
            running.stop()
            raise AssertionError(f"{command[:4]} exited with {process.returncode}:\n{running.output()}")
        fields = parse_ready(line, ready_prefix)
        if fields is not None:
            running.fields = fields
            return running


class Consul:
    """A `consul agent -dev` on free ports; `http` is its API's host:port.

    In production form, given a `config_dir` to write its config in: with `acl_master`,
    ACLs on with default deny (the harness's own calls send the master token); with `pki`,
    also HTTPS on `https` with that CA's server certificate, requiring client
    certificates when `verify_incoming`; with `check_certs` (CA, certificate, key files),
    its health checks present that certificate, as mutual TLS sidecars want."""

    def __init__(
        self,
        binary: Path,
        bind: str = "127.0.0.1",
        clients: Sequence[str] = ("127.0.0.1",),
        *,
        config_dir: Path | None = None,
        acl_master: str = "",
        pki: Pki | None = None,
        verify_incoming: bool = False,
        check_certs: tuple[str, str, str] | None = None,
    ) -> None:
        self.http = f"{clients[0]}:{free_port(clients[0])}"
        self.https = f"{clients[0]}:{free_port(clients[0])}" if pki is not None else ""
        self.acl_master = acl_master
        ports = {
            "-http-port": self.http.rsplit(":", 1)[1],
            "-dns-port": str(free_port()),
            "-serf-lan-port": str(free_port(bind)),
            "-serf-wan-port": str(free_port(bind)),
            "-server-port": str(free_port(bind)),
            "-grpc-port": str(free_port()),
        }
        command = [str(binary), "agent", "-dev", "-bind", bind, "-client", " ".join(clients)]
        for flag, port in ports.items():
            command += [flag, port]
        config = []
        if acl_master:
            # Consul 1.8's syntax; the agent's own token lets it sync its node and checks.
            tokens = f'master = "{acl_master}", agent = "{acl_master}"'
            config.append(f'acl {{ enabled = true, default_policy = "deny", tokens {{ {tokens} }} }}')
        if pki is not None:
            config.append(f"ports {{ https = {self.https.rsplit(':', 1)[1]} }}")
            config.append(f'ca_file = "{pki.ca}"\ncert_file = "{pki.server_cert}"\nkey_file = "{pki.server_key}"')
            config.append(f"verify_incoming_https = {str(verify_incoming).lower()}")
        if check_certs is not None:
            ca, cert, key = check_certs
            config.append(f'ca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"')
            config.append("enable_agent_tls_for_checks = true")
        if config:
            assert config_dir is not None, "ACLs and TLS need a config_dir"
            path = config_dir / "consul.hcl"
            path.write_text("\n".join(config) + "\n")
            command += ["-config-file", str(path)]
        self.command = command
        self.start()

    def start(self) -> None:
        """Start the agent (again, after `close`, on the same ports); a dev agent starts empty.
        Returns once it has a leader and, with ACLs, once its ACL system answers: the leader
        sets ACLs up a moment after its election, and ACL calls fail until then."""
        self.agent = spawn(self.command, None)
        try:
            wait_until(
                self._has_leader, START_TIMEOUT_S, lambda: f"a consul leader; output:\n{self.agent.output()}", 0.1
            )
            if self.acl_master:
                wait_until(
                    self._acl_ready, START_TIMEOUT_S, lambda: f"consul's ACLs; output:\n{self.agent.output()}", 0.1
                )
        except BaseException:
            self.agent.kill()
            raise

    def _has_leader(self) -> bool:
        if self.agent.process.poll() is not None:
            raise AssertionError(f"consul exited:\n{self.agent.output()}")
        try:
            return bool(self.get("/v1/status/leader"))
        except OSError:
            return False

    def _acl_ready(self) -> bool:
        try:
            self.get("/v1/acl/token/self")  # the master token, once the leader has set it up
        except OSError:  # urllib's HTTPError included
            return False
        return True

    def _request(self, path: str, method: str = "GET", body: bytes | None = None) -> urllib.request.Request:
        headers = {"X-Consul-Token": self.acl_master} if self.acl_master else {}
        return urllib.request.Request(f"http://{self.http}{path}", data=body, method=method, headers=headers)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self._request(path), timeout=5) as response:
            body = response.read()
        return json.loads(body) if body else None

    def put(self, path: str, body: bytes = b"") -> Any:
        with urllib.request.urlopen(self._request(path, "PUT", body), timeout=5) as response:
            return json.loads(response.read() or b"null")

    def delete(self, path: str) -> None:
        urllib.request.urlopen(self._request(path, "DELETE"), timeout=5).close()

    def token(self, name: str, rules: str, secret: str = "") -> str:
        """A new ACL token holding only a policy `name` with `rules`; its secret (`secret`
        when given: an operator restoring a token after a dev agent's restart)."""
        self.put("/v1/acl/policy", json.dumps({"Name": name, "Rules": rules}).encode())
        fields: dict[str, Any] = {"Policies": [{"Name": name}]}
        if secret:
            fields["SecretID"] = secret
        token = self.put("/v1/acl/token", json.dumps(fields).encode())
        return str(token["SecretID"])

    def services(self, name: str = "turnout-sidecar") -> dict[str, Any]:
        """The agent's registrations of service `name`, by id."""
        return {k: v for k, v in self.get("/v1/agent/services").items() if v["Service"] == name}

    def passing(self, name: str = "turnout-sidecar") -> list[dict[str, Any]]:
        return self.get(f"/v1/health/service/{name}?passing=true") or []

    def close(self) -> None:
        self.agent.stop(timeout=10)


def sidecar(
    consul: str,
    repository: Path,
    *flags: str,
    python: Sequence[str] = (sys.executable,),
    env: dict[str, str] | None = None,
) -> Process:
    command = [*python, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repository}"]
    command += [f"--consul={consul}", "--exit-timeout-secs=3", *flags]
    return spawn(command, SIDECAR_READY, env=env)


def gateway_command(consul: str, *flags: str, python: Sequence[str] = (sys.executable,)) -> list[str]:
    command = [*python, "-m", "turnout", "gateway", f"--consul={consul}", "--host=127.0.0.1"]
    return [*command, "--http-port=0", "--grpc-port=0", "--metrics-port=0", "--exit-timeout-secs=3", *flags]


def gateway(
    consul: str, *flags: str, python: Sequence[str] = (sys.executable,), env: dict[str, str] | None = None
) -> Process:
    return spawn(gateway_command(consul, *flags, python=python), GATEWAY_READY, env=env)


@contextlib.contextmanager
def running(*processes: Process) -> Iterator[tuple[Process, ...]]:
    try:
        yield processes
    finally:
        for process in processes:
            process.stop()


def metric(metrics_address: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples whose labels include `labels` (0 when none)."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def registered_models(entry: dict[str, Any]) -> str:
    return str(entry.get("Meta", {}).get("models", ""))


def unreachable(address: str) -> bool:
    try:
        urllib.request.urlopen(f"http://{address}/", timeout=1).close()
    except urllib.error.HTTPError:
        return False
    except OSError:
        return True
    return False


@contextlib.contextmanager
def consul_agent(**options: Any) -> Iterator[Consul]:
    """A running dev agent for a fixture (`options` as Consul takes them); skips the test
    where no consul binary exists."""
    binary = consul_binary()
    if binary is None:
        pytest.skip(NO_CONSUL)
    agent = Consul(binary, **options)
    try:
        yield agent
    finally:
        agent.close()
