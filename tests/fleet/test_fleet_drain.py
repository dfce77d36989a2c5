"""Drain of a registered sidecar under load: on SIGTERM it leaves Consul first, finishes
the requests it already holds, and the gateway sends everything new to the other replica;
no request fails."""

from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, gateway, running, sidecar, wait_until
from tests.harness import write_repository

CONCURRENCY = 16


def _linear() -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return [tensor]


def _held() -> list[aioclient.InferInput]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [aioclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


async def _inferences(address: str, model: str) -> int:
    async with aioclient.InferenceServerClient(address) as client:
        stats = (await client.get_inference_statistics(model)).model_stats
    return sum(s.inference_count for s in stats)


async def test_sigterm_deregisters_first_and_fails_no_request(
    consul: Consul, tmp_path_factory: pytest.TempPathFactory
) -> None:
    service = "drain"
    repository = write_repository(tmp_path_factory.mktemp("drain_repo"), ("linear", "simple_held"))
    leaving, staying = (sidecar(consul.http, repository, f"--consul-service={service}") for _ in range(2))
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(gw, leaving, staying):
        wait_until(lambda: len(consul.passing(service)) == 2, 15, "two passing replicas")
        (leaving_id,) = (
            k for k, v in consul.services(service).items() if v["Port"] == int(leaving.fields["grpc"].rsplit(":", 1)[1])
        )
        failures: list[str] = []
        answered = 0
        stop = asyncio.Event()

        async def worker(client: aioclient.InferenceServerClient) -> None:
            nonlocal answered
            while not stop.is_set():
                try:
                    await client.infer("linear", _linear(), client_timeout=10)
                except InferenceServerException as exc:
                    failures.append(str(exc))
                else:
                    answered += 1

        async with (
            aioclient.InferenceServerClient(gw.fields["grpc"]) as client,
            aioclient.InferenceServerClient(leaving.fields["grpc"]) as direct,
        ):
            workers = [asyncio.create_task(worker(client)) for _ in range(CONCURRENCY)]
            # Requests the leaving replica holds 1.5 s in its queue when SIGTERM arrives:
            # some sent to it directly, more spread by the gateway.
            held = [asyncio.ensure_future(direct.infer("simple_held", _held(), client_timeout=10)) for _ in range(2)]
            held += [asyncio.ensure_future(client.infer("simple_held", _held(), client_timeout=10)) for _ in range(6)]
            await asyncio.sleep(0.5)
            leaving.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()

            # Deregistered while it still drains the held requests.
            await asyncio.to_thread(wait_until, lambda: leaving_id not in consul.services(service), 5, "deregistration")
            assert leaving.process.poll() is None, "it left Consul only on exit"
            before = await _inferences(staying.fields["grpc"], "linear")
            results = await asyncio.gather(*held)
            assert all(r.as_numpy("OUTPUT0") is not None for r in results)
            code = await asyncio.to_thread(leaving.process.wait, 10)
            drained_in = time.monotonic() - signalled
            # Everything after the drain went to the staying replica.
            while await _inferences(staying.fields["grpc"], "linear") < before + 200:
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*workers)
    print(f"drain: exit {code} after {drained_in:.1f}s; {answered} answered, {len(failures)} failed")
    assert code == 0
    assert failures == []
    assert 1.0 < drained_in < 5.0  # it waited for the held requests, within --exit-timeout-secs
    assert "deregistered" in leaving.output()
