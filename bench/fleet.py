"""The fleet rows of `python -m bench.faults`: two sidecars registered in a Consul agent
(dev mode) behind a gateway that discovers them, loaded through the gateway while one
replica is killed or drained, Consul is stopped and restarted, or a version rollout runs
(load version 2 everywhere, warm it, shift Consul KV weights 0 -> 100, unload version 1);
or while one replica failed to load the model under load (`second`, its repository), or
Consul under default-deny ACLs is stopped and restarted (`acl_dir`); and
two sidecars behind two gateways serving a stateful model, whose sequences alternate
between the gateways while one replica is killed."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from scripts.make_models import linear_override
from tests.fleet.fleet_harness import Consul, Process, gateway, metric, sidecar, wait_until

SERVICE, KV_PREFIX = "bench-fleet", "bench-fleet/policies/"
SEQUENCE_SERVICE = "bench-sequences"
SEQUENCE_MODEL = "running_sum"  # scripts.make_models.write_sequence with state: OUTPUT = the running sum
Fault = Callable[[], Awaitable[float | None]]


# Least privilege under ACLs (the policies docs/deploy.md prints, for this bench's names).
SIDECAR_RULES = f'service_prefix "{SERVICE}" {{ policy = "write" }}'
GATEWAY_RULES = f"""
service_prefix "" {{ policy = "read" }}
node_prefix "" {{ policy = "read" }}
key_prefix "{KV_PREFIX}" {{ policy = "read" }}
"""


class Fleet:
    """Consul, two registered sidecars (explicit mode, `simple` and `linear` v1 loaded)
    and a gateway that discovers them and reads weights from Consul KV. With `acl_dir`
    (a folder for the agent's config), Consul denies by default and sidecars and gateway
    hold least-privilege tokens."""

    def __init__(
        self, consul_path: Path, repository: Path, second: Path | None = None, acl_dir: Path | None = None
    ) -> None:
        """`second`: the second replica's repository (default: the first's)."""
        master = str(uuid.uuid4()) if acl_dir is not None else ""
        self.consul = Consul(consul_path, config_dir=acl_dir, acl_master=master)
        self.tokens = {"sidecar": str(uuid.uuid4()), "gateway": str(uuid.uuid4())} if master else {}
        self.replicas: list[Process] = []
        self.gateway: Process | None = None
        try:  # a fleet that fails to start stops what it started
            self._start(repository, second or repository)
        except BaseException:
            self.close()
            raise

    def _start(self, repository: Path, second: Path) -> None:
        self.restore_tokens()
        self.set_weights(0)
        flags = [f"--consul-service={SERVICE}", "--model-control-mode=explicit"]
        loads = ["--load-model=simple", "--exit-on-error=false"]
        as_sidecar = [f"--consul-token={self.tokens['sidecar']}"] if self.tokens else []
        as_gateway = [f"--consul-token={self.tokens['gateway']}"] if self.tokens else []
        for replica in (repository, second):
            self.replicas.append(sidecar(self.consul.http, replica, *flags, *loads, *as_sidecar))
        self.gateway = gateway(self.consul.http, *flags, f"--routing-kv-prefix={KV_PREFIX}", *as_gateway)
        self.address = self.gateway.fields["grpc"]
        wait_until(lambda: len(self.consul.passing(SERVICE)) == 2, 30, "two passing replicas")
        asyncio.run(self.load_linear([1], warm=False))

    def restore_tokens(self) -> None:
        """Put the tokens (same secrets) in the agent: a dev agent starts empty."""
        if self.tokens:
            self.consul.token("bench-sidecar", SIDECAR_RULES, self.tokens["sidecar"])
            self.consul.token("bench-gateway", GATEWAY_RULES, self.tokens["gateway"])

    def set_weights(self, version_2: int) -> None:
        policy = {"weights": {"1": 100 - version_2, "2": version_2}}
        self.consul.put(f"/v1/kv/{KV_PREFIX}linear", json.dumps(policy).encode())

    async def load_linear(self, versions: list[int], warm: bool) -> None:
        async with grpcaio.InferenceServerClient(self.address) as client:
            await client.load_model("linear", config=linear_override(versions, warm))

    def close(self) -> None:
        for child in (self.gateway, *self.replicas):
            if child is not None:
                child.stop()
        self.consul.close()

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
            await asyncio.to_thread(self.consul.close)
            await asyncio.sleep(2.0)
            await asyncio.to_thread(self.consul.start)
            # A dev agent keeps nothing: the operator puts the tokens and the policy back.
            await asyncio.to_thread(self.restore_tokens)
            self.set_weights(0)
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


class SequenceFleet:
    """Consul, two registered sidecars serving `running_sum`, and two gateways that
    discover them; `addresses` are the gateways' gRPC addresses."""

    def __init__(self, consul_path: Path, repository: Path) -> None:
        self.consul = Consul(consul_path)
        self.replicas: list[Process] = []
        self.gateways: list[Process] = []
        try:  # a fleet that fails to start stops what it started
            self._start(repository)
        except BaseException:
            self.close()
            raise

    def _start(self, repository: Path) -> None:
        flags = [f"--consul-service={SEQUENCE_SERVICE}", "--model-control-mode=explicit"]
        for _ in range(2):
            self.replicas.append(sidecar(self.consul.http, repository, *flags, f"--load-model={SEQUENCE_MODEL}"))
        for _ in range(2):
            self.gateways.append(gateway(self.consul.http, *flags))
        self.addresses = [front.fields["grpc"] for front in self.gateways]
        wait_until(lambda: len(self.consul.passing(SEQUENCE_SERVICE)) == 2, 30, "two passing replicas")
        for front in self.gateways:

            def knows_both(address: str = front.fields["metrics"]) -> bool:
                return metric(address, "turnout_gateway_replicas", state="healthy") == 2

            wait_until(knows_both, 30, "each gateway to know both replicas")

    async def kill(self) -> float | None:
        await asyncio.sleep(1.0)
        self.replicas[0].process.kill()
        return time.monotonic()

    def close(self) -> None:
        for child in (*self.gateways, *self.replicas):
            child.stop()
        self.consul.close()


@contextmanager
def sequence_fleet(consul_path: Path, repository: Path) -> Iterator[SequenceFleet]:
    running = SequenceFleet(consul_path, repository)
    try:
        yield running
    finally:
        running.close()


@contextmanager
def fleet(
    consul_path: Path, repository: Path, second: Path | None = None, acl_dir: Path | None = None
) -> Iterator[Fleet]:
    running = Fleet(consul_path, repository, second, acl_dir)
    try:
        yield running
    finally:
        running.close()
