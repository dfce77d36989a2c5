"""Priority under load (`priority_levels: 2`): with the model's queue kept full by
level-2 clients, level-1 requests sent later are still served first.

The design leaves chance little room: the level-2 clients start first and never stop,
and the model runs one request at a time, so in arrival (FIFO) order the 16 level-2
clients would complete about four requests for each one of the 4 level-1 clients. Only a
scheduler that takes level 1 first lets hardly any level-2 request complete while level-1
ones are waiting."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio

from tests.harness import make_models, turnout_up

# Few urgent clients behind many saturating ones: served first, a level-1 request waits for
# at most the other urgent ones (~4 executions), a level-2 one for the whole queue (~16+).
SATURATING_CLIENTS = 16
URGENT_CLIENTS = 4
REQUESTS_PER_URGENT_CLIENT = 16


async def test_level_one_is_served_first_under_a_full_queue(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("repo_priority")
    # One instance, one request per execution: the queue, not the model, decides the order.
    # Each execution takes several times a client's round trip, so a level-1 client's next
    # request is queued before the instance frees even on a loaded machine.
    make_models().write_mlp(
        repo,
        name="mlp_priority",
        sizes=(512, 3072, 3072, 3072, 10),
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

            fillers = [asyncio.create_task(saturating()) for _ in range(SATURATING_CLIENTS)]
            await asyncio.sleep(1.0)  # the level-2 clients fill the queue first
            window_start = time.monotonic()
            await asyncio.gather(*(urgent() for _ in range(URGENT_CLIENTS)))
            window_end = time.monotonic()
            background.set()
            await asyncio.gather(*fillers)

    level_one = [s for _, s in latencies[1]]
    # Level-2 requests that completed while level-1 ones were being offered.
    level_two_done = [s for sent, s in latencies[2] if window_start <= sent + s <= window_end]
    print(
        f"level 1: {len(level_one)} requests, mean {statistics.mean(level_one) * 1000:.1f} ms; "
        f"level 2 completed in the same window: {len(level_two_done)}"
    )
    assert len(level_one) == URGENT_CLIENTS * REQUESTS_PER_URGENT_CLIENT
    # In arrival order the 16 saturating clients would complete ~4 requests for each urgent one.
    assert len(level_two_done) < len(level_one) / 2
