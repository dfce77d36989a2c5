"""Priority under load (`priority_levels: 2`): with the model's queue kept full by
level-2 clients, level-1 requests sent later are still served first.

The design leaves chance no room: the level-2 clients start first and never stop, and
the model runs one request at a time, so in arrival (FIFO) order both levels would wait
behind the same queue and see the same latency. Only a scheduler that takes level 1
first makes level-1 requests several times faster than the level-2 requests sent in the
same window."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from harness import make_models, turnout_up

CLIENTS_PER_LEVEL = 16
REQUESTS_PER_URGENT_CLIENT = 8


async def test_level_one_is_served_first_under_a_full_queue(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("repo_priority")
    # One instance, one request per execution: the queue, not the model, decides the order.
    make_models().write_mlp(
        repo,
        name="mlp_priority",
        max_batch_size=1,
        extra_config="instance_group [ { count: 1 } ]\n"
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    )
    data = np.ones((1, 512), dtype=np.float32)
    with turnout_up(repo) as server:
        async with grpcaio.InferenceServerClient(server.grpc) as client:
            tensor = grpcaio.InferInput("INPUT0", [1, 512], "FP32")
            tensor.set_data_from_numpy(data)
            latencies: dict[int, list[tuple[float, float]]] = {1: [], 2: []}  # (sent at, seconds)
            background = asyncio.Event()

            async def one(priority: int) -> None:
                sent = time.monotonic()
                await client.infer("mlp_priority", [tensor], priority=priority, client_timeout=60)
                latencies[priority].append((sent, time.monotonic() - sent))

            async def saturating() -> None:
                while not background.is_set():
                    await one(2)

            async def urgent() -> None:
                for _ in range(REQUESTS_PER_URGENT_CLIENT):
                    await one(1)

            fillers = [asyncio.create_task(saturating()) for _ in range(CLIENTS_PER_LEVEL)]
            await asyncio.sleep(1.0)  # the level-2 clients fill the queue first
            window_start = time.monotonic()
            await asyncio.gather(*(urgent() for _ in range(CLIENTS_PER_LEVEL)))
            window_end = time.monotonic()
            background.set()
            await asyncio.gather(*fillers)

    level_one = [s for _, s in latencies[1]]
    # Level-2 requests sent while level-1 ones were being offered: the same queue, in time.
    level_two = [s for sent, s in latencies[2] if window_start <= sent < window_end - 0.1]
    one_mean, two_mean = statistics.mean(level_one), statistics.mean(level_two)
    print(
        f"level 1: {len(level_one)} requests, mean {one_mean * 1000:.1f} ms; "
        f"level 2 in the same window: {len(level_two)}, mean {two_mean * 1000:.1f} ms"
    )
    assert len(level_one) == CLIENTS_PER_LEVEL * REQUESTS_PER_URGENT_CLIENT
    assert level_two, "no level-2 request was sent during the level-1 window"
    assert two_mean > 3 * one_mean
