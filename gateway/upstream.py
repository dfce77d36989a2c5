"""The gateway's side of one sidecar: a persistent grpc.aio channel and its calls.

ModelInfer travels as bytes both ways (identity serializers), so a gRPC request
crosses the gateway without being re-encoded; every other method is typed. gRPC
errors become TurnoutError here, with the sidecar's status and text unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from protos import grpc_service_pb2 as pb
from protos.lane import LaneClient
from protos.logs import REQUEST_ID
from protos.rpc import MESSAGE_SIZE_OPTIONS, METHODS
from protos.status import Status, TurnoutError, status_from_grpc, unavailable

M = TypeVar("M", bound=Message)

# Readiness probes must not hang on a stopped or paused sidecar.
READY_TIMEOUT_SECS = 2.0


# gRPC's words for a call that never reached a server (as opposed to one cut mid-way).
_NOT_CONNECTED = ("failed to connect", "connection refused", "no route to host", "connect failed")


class SidecarUnreachable(TurnoutError):
    """The request never reached the sidecar, so another replica may safely take it."""


def _translate(exc: grpc.aio.AioRpcError) -> TurnoutError:
    details = exc.details() or ""
    if exc.code() == grpc.StatusCode.UNAVAILABLE and any(w in details.lower() for w in _NOT_CONNECTED):
        return SidecarUnreachable(Status.UNAVAILABLE, details)
    return TurnoutError(status_from_grpc(exc.code()), details)


# A restarted sidecar comes back on the same address within a second or two; grpc's
# default reconnect backoff (1 s, growing to 120 s) would keep its channel down far longer.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class SidecarClient:
    """One sidecar: its framework name, address and channel.

    Create it inside the event loop that will use it; `close()` releases the channel.
    """

    def __init__(self, framework: str, address: str, lane: str = "", metrics: str = "") -> None:
        self.framework = framework
        self.address = address
        self.metrics = metrics  # host:port of its /metrics, "" if unknown
        # ModelInfer takes the sidecar's lane when it has one: a frame costs far less than a call.
        self._lane = LaneClient(lane) if lane else None
        self._channel = grpc.aio.insecure_channel(address, options=[*MESSAGE_SIZE_OPTIONS, *_RECONNECT_OPTIONS])
        self._calls: dict[str, Any] = {}
        for method in METHODS:
            if method.streaming:
                continue  # the gateway turns stream requests into unary ModelInfer calls
            if method.name == "ModelInfer":
                self._calls[method.name] = self._channel.unary_unary(method.path)
            else:
                self._calls[method.name] = self._channel.unary_unary(
                    method.path,
                    request_serializer=getattr(pb, method.request).SerializeToString,
                    response_deserializer=getattr(pb, method.response).FromString,
                )
        self._infer = self._calls["ModelInfer"]

    def __repr__(self) -> str:
        return f"SidecarClient({self.framework!r}, {self.address!r})"

    async def infer(self, encoded: bytes) -> bytes:
        """Forward a serialized ModelInferRequest; return the serialized response."""
        if self._lane is not None:
            try:
                # The request id rides the frame, so the sidecar's lines name it at any level.
                return await self._lane.call(encoded, REQUEST_ID.get())  # raises the sidecar's TurnoutError
            except TurnoutError as exc:
                if isinstance(exc.__cause__, OSError):  # the connect failed: nothing was sent
                    raise SidecarUnreachable(exc.status, exc.message) from exc
                raise
        try:
            response: bytes = await self._infer(encoded)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        return response

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float | None = None) -> M:
        """A typed unary call by method name ("ModelMetadata", ...)."""
        try:
            response = await self._calls[method](request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        if not isinstance(response, response_type):  # pragma: no cover - table mismatch
            raise unavailable(f"unexpected response type from sidecar {self.address}")
        return response

    async def server_ready(self) -> bool:
        """The sidecar's own readiness; False when it cannot be reached in time."""
        try:
            response = await self.call(
                "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, timeout=READY_TIMEOUT_SECS
            )
        except TurnoutError:
            return False
        return bool(response.ready)

    async def repository_index(self) -> pb.RepositoryIndexResponse:
        return await self.call("RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse)

    async def close(self, grace: float | None = None) -> None:
        if self._lane is not None:
            if grace:
                await self._lane.drain(grace)
            self._lane.close()
        await self._channel.close(grace)
