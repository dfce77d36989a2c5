"""Zero-downtime rollout through the gateway, under continuous concurrent load: two
replicas serve `linear` version 1 only; version 2 is loaded (warmed by `model_warmup`)
on every replica through the gateway, Consul KV weights move 0 -> 25 -> 50 -> 75 -> 100,
then version 1 is unloaded. No request may fail, and the answers move from x1 to x2."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, gateway, running, sidecar, wait_until
from tests.harness import make_models

CONCURRENCY = 16
STEPS = (0, 25, 50, 75, 100)


class Load:
    """CONCURRENCY workers sending unversioned `linear` requests until stopped; each answer
    is recorded as (finish time, multiplier) and each failure kept with its text."""

    def __init__(self, address: str) -> None:
        self.client = aioclient.InferenceServerClient(address)
        tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        self.inputs = [tensor]
        self.answers: list[tuple[float, float]] = []
        self.failures: list[str] = []
        self.stopping = asyncio.Event()
        self.workers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.workers = [asyncio.create_task(self._worker()) for _ in range(CONCURRENCY)]

    async def _worker(self) -> None:
        while not self.stopping.is_set():
            try:
                result = await self.client.infer("linear", self.inputs, client_timeout=10)
            except InferenceServerException as exc:
                self.failures.append(str(exc))
            else:
                multiplier = float(result.as_numpy("OUTPUT0")[0, 0])
                assert multiplier == float(result.get_response().model_version)
                self.answers.append((time.monotonic(), multiplier))

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.workers)
        await self.client.close()

    async def answered(self, count: int) -> list[float]:
        """The multipliers of the next `count` answers."""
        start = len(self.answers)
        deadline = time.monotonic() + 30
        while len(self.answers) < start + count:
            assert time.monotonic() < deadline, "the load stopped being answered"
            await asyncio.sleep(0.02)
        return [m for _, m in self.answers[start : start + count]]


async def test_rollout_under_load_fails_no_request(consul: Consul, fleet_repository: Path) -> None:
    service, prefix = "rollout", "rollout/policies/"
    flags = (f"--consul-service={service}", "--model-control-mode=explicit")
    replicas = [sidecar(consul.http, fleet_repository, *flags) for _ in range(2)]
    gw = gateway(consul.http, *flags, f"--routing-kv-prefix={prefix}", "--routing-seed=3")

    def set_weights(new: int) -> None:
        policy = {"weights": {"1": 100 - new, "2": new}}
        assert consul.put(f"/v1/kv/{prefix}linear", json.dumps(policy).encode()) is True

    def meta_lists(versions: str) -> bool:
        entries = consul.passing(service)
        return len(entries) == 2 and all(f"linear:{versions}" in e["Service"]["Meta"]["models"] for e in entries)

    with running(gw, *replicas):
        wait_until(lambda: len(consul.passing(service)) == 2, 15, "two passing replicas")
        set_weights(0)
        async with aioclient.InferenceServerClient(gw.fields["grpc"]) as control:
            await control.load_model("linear", config=make_models().linear_override([1], warm=False))
            wait_until(lambda: meta_lists("1"), 10, "both replicas to list linear:1")
            load = Load(gw.fields["grpc"])
            load.start()
            try:
                assert set(await load.answered(200)) == {1.0}

                # Version 2 joins on every replica (the gateway fans the load out) and is
                # READY only once warmed; version 1 keeps serving through the reload.
                await control.load_model("linear", config=make_models().linear_override([1, 2], warm=True))
                for replica in replicas:
                    async with aioclient.InferenceServerClient(replica.fields["grpc"]) as direct:
                        assert await direct.is_model_ready("linear", "2")
                wait_until(lambda: meta_lists("1,2"), 10, "both replicas to list linear:1,2")

                shares = {}
                for weight in STEPS:
                    set_weights(weight)
                    await asyncio.sleep(1.5)  # a KV change applies within a second
                    answers = await load.answered(400)
                    shares[weight] = answers.count(2.0) / len(answers)
                print(f"share of version 2 at each weight: {shares}; {len(load.answers)} answers so far")
                assert shares[0] == 0.0 and shares[100] == 1.0
                assert 0.1 < shares[25] < 0.4 and 0.35 < shares[50] < 0.65 and 0.6 < shares[75] < 0.9

                # Retire version 1: a reload restricted to version 2 drains it on every replica.
                await control.load_model("linear", config=make_models().linear_override([2], warm=False))
                for replica in replicas:
                    async with aioclient.InferenceServerClient(replica.fields["grpc"]) as direct:
                        assert not await direct.is_model_ready("linear", "1")
                wait_until(lambda: meta_lists("2"), 10, "both replicas to list linear:2 only")
                assert set(await load.answered(400)) == {2.0}
            finally:
                await load.stop()
    print(f"rollout: {len(load.answers)} answered, {len(load.failures)} failed")
    assert load.failures == []
