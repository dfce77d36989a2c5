"""Shadow traffic: copies of some requests sent to a candidate version after the
primary has answered, so they can neither delay nor fail it.

At most `limit` shadows run at once; past that a copy is dropped (and counted), so a
slow candidate costs the primary path nothing but the count. Each shadow's latency,
error and whether its outputs equal the primary's are recorded per version.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.metrics import GatewayMetrics
from gateway.routing.dispatch import Dispatcher
from protos import grpc_service_pb2 as pb
from protos.status import TurnoutError

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 16


def same_outputs(primary: bytes, shadow: bytes) -> bool:
    """Whether two serialized responses carry the same output tensors (names, shapes, data)."""
    first = pb.ModelInferResponse.FromString(primary)
    second = pb.ModelInferResponse.FromString(shadow)
    if list(first.raw_output_contents) != list(second.raw_output_contents):
        return False
    shape = [(t.name, t.datatype, list(t.shape), t.contents) for t in first.outputs]
    return shape == [(t.name, t.datatype, list(t.shape), t.contents) for t in second.outputs]


class ShadowMirror:
    """Owns the shadow tasks: bounded, droppable, awaited or cancelled at close."""

    def __init__(self, dispatcher: Dispatcher, metrics: GatewayMetrics, limit: int = DEFAULT_LIMIT) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(self, model: str, version: str, payload: bytes, primary: bytes) -> None:
        """Send `payload` to `version` in the background and compare with `primary`."""
        if len(self._tasks) >= self._limit:
            self._metrics.count_shadow(model, version, "dropped")
            return
        task = asyncio.get_running_loop().create_task(self._run(model, version, payload, primary))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, model: str, version: str, payload: bytes, primary: bytes) -> None:
        started = time.monotonic()
        try:
            answer = await self._dispatcher.send_shadow(model, version, payload)
        except TurnoutError as exc:
            self._metrics.count_shadow(model, version, "error")
            logger.debug("shadow to %s version %s failed: %s", model, version, exc.message)
            return
        self._metrics.observe_shadow_latency(model, version, time.monotonic() - started)
        try:
            outcome = "same" if same_outputs(primary, answer) else "different"
        except ValueError:  # a response that does not parse is a difference too
            outcome = "different"
        self._metrics.count_shadow(model, version, outcome)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
