"""The fleet rows of `python -m bench.faults`: two sidecars registered in a Consul agent
(dev mode) behind a gateway that discovers them, loaded through the gateway while one
replica is killed or drained, Consul is stopped and restarted, or a version rollout runs
(load version 2 everywhere, warm it, shift Consul KV weights 0 -> 100, unload version 1)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from scripts.make_models import linear_override

ROOT = Path(__file__).resolve().parent.parent
SERVICE, KV_PREFIX = "bench-fleet", "bench-fleet/policies/"
Fault = Callable[[], Awaitable[float | None]]


def consul_binary() -> str | None:
    """scripts/install-consul's copy, else one on PATH; without either the fleet rows are skipped."""
    local = ROOT / ".tools" / "consul" / "usr" / "bin" / "consul"
    return str(local) if local.exists() else shutil.which("consul")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Child:
    """A process of the fleet. Its output is read to the end on a thread, so a chatty
    child never blocks on a full pipe; `ready` holds the fields of its ready line."""

    def __init__(self, command: list[str], ready_prefix: str | None) -> None:
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.ready: dict[str, str] = {}
        found = threading.Event()

        def pump() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if ready_prefix and not found.is_set() and line.startswith(ready_prefix):
                    self.ready = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if ready_prefix is not None:
            found.wait(60)
            if not self.ready:
                self.stop()
                raise SystemExit(f"{command[:4]} was not ready")

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class Consul:
    """A `consul agent -dev` whose ports stay the same across a stop and a restart."""

    def __init__(self, binary: str) -> None:
        self.http = f"127.0.0.1:{_free_port()}"
        self.command = [binary, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1"]
        self.command += ["-http-port", self.http.rsplit(":", 1)[1]]
        for flag in ("-dns-port", "-serf-lan-port", "-serf-wan-port", "-server-port", "-grpc-port"):
            self.command += [flag, str(_free_port())]
        self.agent = self.start()

    def start(self) -> Child:
        self.agent = Child(self.command, None)
        self.wait(lambda: bool(self.get("/v1/status/leader")), "a consul leader")
        return self.agent

    def get(self, path: str) -> object:
        try:
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=2) as response:
                return json.loads(response.read() or b"null")
        except OSError:
            return None

    def put(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(f"http://{self.http}{path}", data=body, method="PUT")
        urllib.request.urlopen(request, timeout=5).close()

    def passing(self) -> int:
        return len(self.get(f"/v1/health/service/{SERVICE}?passing=true") or [])  # type: ignore[arg-type]

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        # Consul has no event to wait on: poll its API.
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.05)


class Fleet:
    """Consul, two registered sidecars (explicit mode, `simple` and `linear` v1 loaded)
    and a gateway that discovers them and reads weights from Consul KV."""

    def __init__(self, consul_path: str, repository: Path) -> None:
        self.consul = Consul(consul_path)
        self.set_weights(0)
        flags = [f"--consul={self.consul.http}", f"--consul-service={SERVICE}", "--model-control-mode=explicit"]
        sidecar = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repository}"]
        sidecar += [*flags, "--exit-timeout-secs=3", "--load-model=simple"]
        self.replicas = [Child(sidecar, "TURNOUT_SIDECAR_READY") for _ in range(2)]
        gateway = [sys.executable, "-m", "turnout", "gateway", "--host=127.0.0.1", *flags]
        gateway += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", f"--routing-kv-prefix={KV_PREFIX}"]
        self.gateway = Child(gateway, "TURNOUT_READY")
        self.address = self.gateway.ready["grpc"]
        self.consul.wait(lambda: self.consul.passing() == 2, "two passing replicas")
        asyncio.run(self.load_linear([1], warm=False))

    def set_weights(self, version_2: int) -> None:
        policy = {"weights": {"1": 100 - version_2, "2": version_2}}
        self.consul.put(f"/v1/kv/{KV_PREFIX}linear", json.dumps(policy).encode())

    async def load_linear(self, versions: list[int], warm: bool) -> None:
        async with grpcaio.InferenceServerClient(self.address) as client:
            await client.load_model("linear", config=linear_override(versions, warm))

    def close(self) -> None:
        for child in (self.gateway, *self.replicas, self.consul.agent):
            child.stop()

    def faults(self) -> dict[str, tuple[str, Fault]]:
        """Row name -> (model under load, fault); each fault returns when recovery is measured from."""

        async def kill() -> float | None:
            await asyncio.sleep(1.0)
            self.replicas[0].process.kill()
            return time.monotonic()

        async def drain() -> float | None:
            await asyncio.sleep(1.0)
            self.replicas[0].process.send_signal(signal.SIGTERM)
            return time.monotonic()

        async def consul_away() -> float | None:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(self.consul.agent.stop)
            await asyncio.sleep(2.0)
            await asyncio.to_thread(self.consul.start)
            self.set_weights(0)  # a dev agent keeps nothing: the operator puts the policy back
            return time.monotonic()

        async def rollout() -> float | None:
            await asyncio.sleep(0.5)
            await self.load_linear([1, 2], warm=True)
            for weight in (25, 50, 75, 100):
                await asyncio.sleep(1.0)
                self.set_weights(weight)
            await asyncio.sleep(1.5)  # the last KV change reaches the gateway within a second
            await self.load_linear([2], warm=False)
            return None

        return {
            "fleet: replica SIGKILL (2 replicas)": ("simple", kill),
            "fleet: replica drain (SIGTERM)": ("simple", drain),
            "fleet: consul stopped 2 s, restarted": ("simple", consul_away),
            "fleet: rollout v1 -> v2 (KV 0..100)": ("linear", rollout),
        }


@contextmanager
def fleet(consul_path: str, repository: Path) -> Iterator[Fleet]:
    running = Fleet(consul_path, repository)
    try:
        yield running
    finally:
        running.close()
