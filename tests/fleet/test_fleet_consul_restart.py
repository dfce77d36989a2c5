"""Consul stopped and restarted while traffic flows: the gateway routes on the fleet it
knew while Consul is away, keeps it while the restarted (empty) agent waits for the
sidecars to re-register, and fails no request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import NO_CONSUL, Consul, consul_binary, gateway, running, sidecar, wait_until

CONCURRENCY = 8


async def test_consul_restart_under_load_fails_no_request(fleet_repository: Path) -> None:
    binary = consul_binary()
    if binary is None:
        pytest.skip(NO_CONSUL)
    consul = Consul(binary)  # its own agent: this test stops it
    service = "consul-restart"
    try:
        replicas = [sidecar(consul.http, fleet_repository, f"--consul-service={service}") for _ in range(2)]
        gw = gateway(consul.http, f"--consul-service={service}")
        with running(gw, *replicas):
            wait_until(lambda: len(consul.passing(service)) == 2, 15, "two passing replicas")
            tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            failures: list[str] = []
            answered: list[float] = []
            stop = asyncio.Event()

            async def worker(client: aioclient.InferenceServerClient) -> None:
                while not stop.is_set():
                    try:
                        await client.infer("linear", [tensor], client_timeout=10)
                    except InferenceServerException as exc:
                        failures.append(str(exc))
                    else:
                        answered.append(time.monotonic())

            async with aioclient.InferenceServerClient(gw.fields["grpc"]) as client:
                workers = [asyncio.create_task(worker(client)) for _ in range(CONCURRENCY)]
                await asyncio.sleep(1.0)
                await asyncio.to_thread(consul.close)
                await asyncio.sleep(2.0)
                await asyncio.to_thread(consul.start)
                restarted = time.monotonic()
                assert consul.passing(service) == []  # the dev agent forgot both sidecars
                await asyncio.sleep(3.0)
                # They come back on their own (each re-registers every 10 s).
                await asyncio.to_thread(
                    wait_until, lambda: len(consul.passing(service)) == 2, 20, "both sidecars to re-register"
                )
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*workers)
        print(f"consul restart: {len(answered)} answered, {len(failures)} failed: {sorted(set(failures))[:3]}")
        assert failures == []
        assert sum(1 for t in answered if t > restarted + 2.5) > 100  # served all along
        assert "routing on the last known fleet" in gw.output()
    finally:
        consul.close()
