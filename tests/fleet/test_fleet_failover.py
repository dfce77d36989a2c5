"""A replica killed with SIGKILL under concurrent load: requests that had not reached it
fail over to the others; only those it had already accepted may fail, and the count
of those is reported."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, gateway, metric, running, sidecar, wait_until

CONCURRENCY = 32


async def test_sigkill_under_load_fails_over(consul: Consul, fleet_repository: Path) -> None:
    service = "failover"
    replicas = [sidecar(consul.http, fleet_repository, f"--consul-service={service}") for _ in range(3)]
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(gw, *replicas):
        wait_until(lambda: len(consul.passing(service)) == 3, 15, "three passing replicas")
        client = aioclient.InferenceServerClient(gw.fields["grpc"])
        tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        outcomes: list[tuple[float, bool, str]] = []  # (start time, ok, error)
        killed_at: list[float] = []
        stop = time.monotonic() + 4.0

        async def worker() -> None:
            while time.monotonic() < stop:
                started = time.monotonic()
                try:
                    await client.infer("linear", [tensor], client_timeout=10)
                except InferenceServerException as exc:
                    outcomes.append((started, False, str(exc)))
                else:
                    outcomes.append((started, True, ""))

        async def killer() -> None:
            await asyncio.sleep(1.0)
            killed_at.append(time.monotonic())
            replicas[0].kill()

        try:
            await asyncio.gather(killer(), *(worker() for _ in range(CONCURRENCY)))
        finally:
            await client.close()

        failed = [o for o in outcomes if not o[1]]
        after_kill = [o for o in outcomes if o[0] > killed_at[0]]
        print(
            f"{len(outcomes)} requests, {len(after_kill)} started after the kill; "
            f"{len(failed)} failed: {sorted({e for _, _, e in failed})[:3]}"
        )
        # Only requests in flight on the killed replica can be lost: at most one per worker.
        assert len(failed) <= CONCURRENCY
        # Everything sent after the kill was routed around it (failover, then ejection).
        assert all(ok for started, ok, _ in outcomes if started > killed_at[0] + 0.05), failed
        assert len(after_kill) > 100
        metrics = gw.fields["metrics"]
        # The gateway stopped routing to the dead replica: it ejected it after a failed
        # connect, or Consul's check took it out first (then no request reached it).
        wait_until(lambda: metric(metrics, "turnout_gateway_replicas", state="healthy") == 2, 15, "2 replicas left")
        ejections = metric(metrics, "turnout_gateway_replica_ejections_total")
        errors = metric(metrics, "turnout_gateway_requests_total", model="linear", outcome="failure")
        assert errors == len(failed)  # the gateway reports the same error count
        failovers = metric(metrics, "turnout_gateway_failovers_total", outcome="retried")
        print(f"ejections: {ejections:.0f}, failovers: {failovers:.0f}")
