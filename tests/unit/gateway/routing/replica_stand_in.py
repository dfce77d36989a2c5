"""A replica as the routing code sees it, in process: the few calls that `Balancer`,
`Dispatcher` and `SequencePins` make on a `gateway.upstream.SidecarClient`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from gateway.upstream import SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import read_sequence
from protos.status import Cause, Status, TurnoutError

M = TypeVar("M", bound=Message)


class StandInReplica:
    """Stands in for a network peer: one sidecar replica behind a `SidecarClient`.

    `infer` answers `answer` (its name, by default) and records what it received; while
    the replica is down it raises `SidecarUnreachable` with gRPC's connect-failure text,
    as a real client does when nothing was sent; `error` makes it answer that error
    instead, as a replica that was reached but refused the request. A readiness probe
    (`server_ready`) waits until the replica is up again and then answers True, so tests
    need no probe interval to pass. `journal`, when shared by several replicas, records
    the order in which they were sent requests.
    """

    def __init__(
        self,
        name: str,
        framework: str = "onnxruntime",
        *,
        reachable: bool = True,
        journal: list[str] | None = None,
    ) -> None:
        self.name = name
        self.framework = framework
        self.address = f"{name}.fleet:8001"
        self.received: list[bytes] = []
        self.traceparents: list[str] = []  # the W3C context each call passed ("" untraced)
        self.error: TurnoutError | None = None
        self.probes = 0
        self.probe_cancelled = False
        self.config_requests: list[Message] = []
        self._journal = journal if journal is not None else []
        self._up = asyncio.Event()
        if reachable:
            self._up.set()

    def __repr__(self) -> str:
        return f"StandInReplica({self.name!r})"

    @property
    def unreachable_message(self) -> str:
        return f"failed to connect to all addresses; last error: UNAVAILABLE: ipv4:{self.address}: Connection refused"

    def go_down(self) -> None:
        self._up.clear()

    def come_back(self) -> None:
        self._up.set()

    async def infer(
        self, encoded: bytes, traceparent: str = "", responses: Callable[[bytes], None] | None = None
    ) -> bytes:
        self.received.append(encoded)
        self.traceparents.append(traceparent)
        self._journal.append(self.name)
        if not self._up.is_set():
            raise SidecarUnreachable(Status.UNAVAILABLE, self.unreachable_message)
        if self.error is not None:
            raise self.error
        return self.name.encode()

    async def server_ready(self) -> bool:
        self.probes += 1
        try:
            await self._up.wait()
        except asyncio.CancelledError:
            self.probe_cancelled = True
            raise
        return True

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float | None = None) -> M:
        """Only `SequencePins` calls this (ModelConfig, for the sequence idle time): an
        empty config, which leaves pins at their default lifetime."""
        assert method == "ModelConfig"
        self.config_requests.append(request)
        return response_type()


async def let_background_tasks_run(turns: int = 10) -> None:
    """Give tasks the code under test started (probes, idle-time lookups) a few turns of
    the event loop; no time passes."""
    for _ in range(turns):
        await asyncio.sleep(0)


class SequenceHoldingReplica(StandInReplica):
    """A replica of a stateful model, as its sequence batcher answers: a START takes the
    sequence (per version), an END lets it go, and a later request of a sequence it does
    not hold is refused with Triton's text and `Cause.UNKNOWN_SEQUENCE`. `held` is the
    (version, sequence id) pairs it holds."""

    def __init__(self, name: str, *, journal: list[str] | None = None) -> None:
        super().__init__(name, journal=journal)
        self.held: set[tuple[str, int | str]] = set()

    async def infer(
        self, encoded: bytes, traceparent: str = "", responses: Callable[[bytes], None] | None = None
    ) -> bytes:
        answer = await super().infer(encoded, traceparent, responses)
        request = pb.ModelInferRequest.FromString(encoded)
        sequence = read_sequence(request.parameters)
        held = (request.model_version, sequence.id)
        if sequence.start:
            self.held.add(held)
        elif held not in self.held:
            message = (
                f"inference request for sequence {sequence.id} to model '{request.model_name}' must specify the "
                "START flag on the first request of the sequence"
            )
            raise TurnoutError(Status.INVALID_ARG, message, Cause.UNKNOWN_SEQUENCE)
        if sequence.end:
            self.held.discard(held)
        return answer
