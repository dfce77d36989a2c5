"""What the batcher unit tests put around a batcher: a model instance that stands in for
the framework (it records each batch it runs, at what virtual time, and computes a
trivial result), configs parsed from config.pbtxt text, and requests built the way the
sidecar's server builds them (a ModelInferRequest through `validate`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import text_format

from protos import grpc_service_pb2 as pb
from protos import model_config_pb2 as mc
from protos.status import TurnoutError
from protos.validation import Signature, ValidRequest, validate
from sidecars.batcher import Result
from sidecars.runtime import Tensors
from tests.unit.virtual_loop import virtual_us

Compute = Callable[[Tensors], dict[str, np.ndarray]]


def model_config(text: str) -> mc.ModelConfig:
    """A ModelConfig from config.pbtxt text."""
    config = mc.ModelConfig()
    text_format.Parse(text, config)
    return config


@dataclass(frozen=True)
class Run:
    """One batch an instance ran: when (virtual µs) and its inputs, copied."""

    at_us: int
    inputs: dict[str, np.ndarray]


class RecordingInstance:
    """A ModelInstance that takes `runs_for_us` of virtual time per batch."""

    def __init__(self, compute: Compute, runs_for_us: int = 0, fails_with: str = "") -> None:
        self._compute = compute
        self._runs_for_us = runs_for_us
        self._fails_with = fails_with
        self.runs: list[Run] = []
        self.closed = False

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        self.runs.append(Run(virtual_us(), {name: array.copy() for name, array in inputs.items()}))
        if self._runs_for_us:
            await asyncio.sleep(self._runs_for_us / 1e6)
        if self._fails_with:
            raise RuntimeError(self._fails_with)
        return self._compute(inputs)

    def close(self) -> None:
        self.closed = True


def infer_request(
    signature: Signature,
    input_name: str,
    values: list[list[int]],
    *,
    request_id: str = "",
    priority: int = 0,
    timeout_us: int | None = None,
    sequence: tuple[int, bool, bool] | None = None,
) -> ValidRequest:
    """One INT32 input of shape [len(values), len(values[0])]; `sequence` is (id, start, end)."""
    request = pb.ModelInferRequest(model_name=signature.model, id=request_id)
    tensor = request.inputs.add(name=input_name, datatype="INT32", shape=[len(values), len(values[0])])
    tensor.contents.int_contents.extend(v for row in values for v in row)
    parameters = request.parameters
    if priority:
        parameters["priority"].uint64_param = priority
    if timeout_us is not None:
        parameters["timeout"].int64_param = timeout_us
    if sequence is not None:
        sequence_id, start, end = sequence
        parameters["sequence_id"].int64_param = sequence_id
        parameters["sequence_start"].bool_param = start
        parameters["sequence_end"].bool_param = end
    return validate(request, signature)


@dataclass(eq=False)
class Call:
    """A submitted request: its task, and the virtual µs at which it finished."""

    task: asyncio.Task[Result]
    done_us: int | None = field(default=None)

    @classmethod
    def start(cls, submission: Coroutine[Any, Any, Result]) -> Call:
        call = cls(asyncio.create_task(submission))
        call.task.add_done_callback(call._finished)
        return call

    def _finished(self, _: object) -> None:
        self.done_us = virtual_us()

    async def result(self) -> Result:
        return await self.task

    async def error(self) -> TurnoutError:
        """The TurnoutError the request failed with (AssertionError if it succeeded)."""
        try:
            result = await self.task
        except TurnoutError as exc:
            return exc
        raise AssertionError(f"expected the request to fail; it returned {result}")


async def until_us(at_us: int) -> None:
    """Let everything ready run, then move virtual time to `at_us` (never backwards)."""
    await asyncio.sleep(max(at_us - virtual_us(), 0) / 1e6)
    await asyncio.sleep(0)
