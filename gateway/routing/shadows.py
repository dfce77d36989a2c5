"""Shadow traffic: copies of some requests sent to a candidate arm (a version, or
another model) after the primary has answered, so they can neither delay nor fail it.

At most `limit` shadows run at once; past that a copy is dropped (and counted), so a
slow candidate costs the primary path nothing but the count. Each shadow's latency,
error and whether its outputs match the primary's are recorded per arm: floating outputs
within the shadow's tolerance (numpy.isclose), integers, BOOL and BYTES exactly; and the
largest difference seen per output. Comparing decodes the outputs, the one place the
gateway does, off the primary's path (on a thread for large responses).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from gateway.metrics import GatewayMetrics
from gateway.routing.dispatch import Dispatcher
from gateway.routing.versions import Shadow, Tolerance
from protos import codec
from protos import grpc_service_pb2 as pb
from protos.status import TurnoutError

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 16
THREAD_BYTES = 1 << 16  # responses larger than this are compared off the event loop
EXACT = Shadow("", 1.0, Tolerance(0.0, 0.0))  # no tolerance: equal values only


@dataclass
class Comparison:
    same: bool
    differences: dict[str, float] = field(default_factory=dict)  # output -> max |shadow - primary|


def _outputs(response: pb.ModelInferResponse) -> dict[str, tuple[str, tuple[int, ...], np.ndarray | bytes]]:
    """Each output's datatype, shape and values: an array for numeric types, else its bytes."""
    raw = response.raw_output_contents
    tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray | bytes]] = {}
    for index, tensor in enumerate(response.outputs):
        shape = tuple(tensor.shape)
        datatype = codec.datatype(tensor.datatype)
        if datatype is None or datatype.numpy is None or datatype.name == "BYTES":
            data = raw[index] if index < len(raw) else tensor.contents.SerializeToString()
            tensors[tensor.name] = (tensor.datatype, shape, data)
        elif index < len(raw):
            tensors[tensor.name] = (tensor.datatype, shape, codec.from_raw(raw[index], datatype, shape))
        else:
            values = list(getattr(tensor.contents, datatype.contents_field or "", []))
            tensors[tensor.name] = (tensor.datatype, shape, codec.from_contents(values, datatype, shape))
    return tensors


def _largest_difference(primary: np.ndarray, shadow: np.ndarray) -> float:
    if primary.size == 0:
        return 0.0
    first, second = primary.astype(np.float64), shadow.astype(np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.abs(second - first)
    both_nan = np.isnan(first) & np.isnan(second)
    gap[both_nan] = 0.0
    gap[np.isnan(gap)] = np.inf  # a NaN against a number
    return float(gap.max())


def compare_outputs(primary: bytes, shadow: bytes, tolerances: Shadow = EXACT) -> Comparison:
    """Whether two serialized responses carry matching outputs (names, datatypes, shapes,
    values), with the largest difference per numeric output. Floating outputs match within
    `tolerances` (NaN matching NaN); others must be equal. Raises ValueError on a response
    that cannot be decoded."""
    first = _outputs(pb.ModelInferResponse.FromString(primary))
    second = _outputs(pb.ModelInferResponse.FromString(shadow))
    result = Comparison(first.keys() == second.keys())
    for name in first.keys() & second.keys():
        (datatype, shape, data), (other_type, other_shape, other) = first[name], second[name]
        if (datatype, shape) != (other_type, other_shape):
            result.same = False
            continue
        if not isinstance(data, np.ndarray) or not isinstance(other, np.ndarray):
            result.same = result.same and data == other
            continue
        result.differences[name] = _largest_difference(data, other)
        if data.dtype.kind == "f" or datatype == "BF16":
            tolerance = tolerances.tolerance_of(name)
            close = np.allclose(
                other.astype(np.float64), data.astype(np.float64), tolerance.rtol, tolerance.atol, equal_nan=True
            )
            result.same = result.same and bool(close)
        else:
            result.same = result.same and bool(np.array_equal(data, other))
    return result


def same_outputs(primary: bytes, shadow: bytes) -> bool:
    """Whether two serialized responses carry the same output tensors (names, shapes, data)."""
    return compare_outputs(primary, shadow).same


class ShadowMirror:
    """Owns the shadow tasks: bounded, droppable, awaited or cancelled at close."""

    def __init__(self, dispatcher: Dispatcher, metrics: GatewayMetrics, limit: int = DEFAULT_LIMIT) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(self, model: str, shadow: Shadow, payload: bytes, primary: bytes) -> None:
        """Send `payload` to `shadow`'s arm of `model` in the background and compare with `primary`."""
        if len(self._tasks) >= self._limit:
            self._metrics.count_shadow(model, shadow.version, "dropped")
            return
        task = asyncio.get_running_loop().create_task(self._run(model, shadow, payload, primary))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, model: str, shadow: Shadow, payload: bytes, primary: bytes) -> None:
        arm = shadow.version
        started = time.monotonic()
        try:
            answer = await self._dispatcher.send_shadow(model, arm, payload)
        except TurnoutError as exc:
            self._metrics.count_shadow(model, arm, "error")
            logger.debug("shadow to %s arm %s failed: %s", model, arm, exc.message)
            return
        self._metrics.observe_shadow_latency(model, arm, time.monotonic() - started)
        try:
            if len(primary) + len(answer) > THREAD_BYTES:
                comparison = await asyncio.to_thread(compare_outputs, primary, answer, shadow)
            else:
                comparison = compare_outputs(primary, answer, shadow)
        except (ValueError, DecodeError):  # a response that does not decode is a difference too
            comparison = Comparison(False)
        for output, difference in comparison.differences.items():
            self._metrics.observe_shadow_difference(model, arm, output, difference)
        self._metrics.count_shadow(model, arm, "same" if comparison.same else "different")

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
