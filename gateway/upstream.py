"""The gateway's side of one sidecar: a persistent grpc.aio channel and its calls.

ModelInfer travels as bytes both ways (identity serializers), so a gRPC request
crosses the gateway without being re-encoded; every other method is typed. gRPC
errors become TurnoutError here, with the sidecar's status, text and cause unchanged.
With TLS (SidecarTls) both the channel and the infer lane are encrypted. A sidecar whose
lane speaks another protocol version is not ready, with the reason logged once.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from protos import grpc_service_pb2 as pb
from protos.lane import LaneClient, LaneMismatch
from protos.logs import REQUEST_ID
from protos.rpc import MESSAGE_SIZE_OPTIONS, METHODS, SERVICE
from protos.status import (
    CAUSE_METADATA,
    Cause,
    Status,
    TurnoutError,
    cause_named,
    internal,
    status_from_grpc,
    unavailable,
)
from protos.trace import TRACEPARENT

M = TypeVar("M", bound=Message)

logger = logging.getLogger(__name__)

# Readiness probes must not hang on a stopped or paused sidecar.
READY_TIMEOUT_SECS = 2.0


# gRPC's words for a call that never reached a server (as opposed to one cut mid-way).
_NOT_CONNECTED = ("failed to connect", "connection refused", "no route to host", "connect failed")


class SidecarUnreachable(TurnoutError):
    """The request never reached the sidecar, so another replica may safely take it."""


# A TLS mismatch shows only as a socket the sidecar closed; say where to look.
_CLOSED_HINT = {
    False: "the sidecar may serve TLS only: give the gateway --sidecar-ssl-root-cert",
    True: "the sidecar may want a client certificate (--sidecar-ssl-cert) or serve no TLS",
}


def _translate(exc: grpc.aio.AioRpcError, tls: bool) -> TurnoutError:
    details = exc.details() or ""
    lowered = details.lower()
    if exc.code() == grpc.StatusCode.UNAVAILABLE and any(w in lowered for w in _NOT_CONNECTED):
        if "socket closed" in lowered:
            details = f"{details} ({_CLOSED_HINT[tls]})"
        return SidecarUnreachable(Status.UNAVAILABLE, details)
    causes = [value for key, value in exc.trailing_metadata() or () if key == CAUSE_METADATA]
    cause = cause_named(str(causes[0])) if causes else None
    return TurnoutError(status_from_grpc(exc.code()), details, cause)


# A restarted sidecar comes back on the same address within a second or two; grpc's
# default reconnect backoff (1 s, growing to 120 s) would keep its channel down far longer.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class SidecarTls:
    """How the gateway speaks TLS to sidecars: the CAs it trusts (the system's when none are
    given) and, for sidecars that want mutual TLS, its own certificate chain and key (PEM
    file paths). `server_name`: the name every sidecar certificate must hold, where sidecars
    come and go on addresses no certificate can list (containers); "" = each one's host.
    The files are read once; raises OSError (ssl.SSLError included) for unusable ones."""

    def __init__(self, root_cert: str = "", cert: str = "", key: str = "", server_name: str = "") -> None:
        self.server_name = server_name

        def read(path: str) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as file:
                return file.read()

        self.channel_credentials = grpc.ssl_channel_credentials(read(root_cert), read(key), read(cert))
        self.lane_context = ssl.create_default_context(cafile=root_cert or None)
        if cert:
            self.lane_context.load_cert_chain(cert, key)


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


class SidecarClient:
    """One sidecar: its framework name, address and channel; with `tls`, TLS to both its
    gRPC port and its lane.

    Create it inside the event loop that will use it; `close()` releases the channel.
    """

    def __init__(
        self, framework: str, address: str, lane: str = "", metrics: str = "", tls: SidecarTls | None = None
    ) -> None:
        self.framework = framework
        self.address = address
        self.metrics = metrics  # host:port of its /metrics, "" if unknown
        self.tls = tls is not None
        self._last_lane_failure = ""
        # ModelInfer takes the sidecar's lane when it has one: a frame costs far less than a call.
        # A Unix lane's certificate is the sidecar's own, issued for its gRPC host.
        self._lane = None
        if lane:
            name = (tls.server_name or _host(address)) if tls else ""
            self._lane = LaneClient(lane, tls.lane_context, name) if tls else LaneClient(lane)
        options: list[tuple[str, int | str]] = [*MESSAGE_SIZE_OPTIONS, *_RECONNECT_OPTIONS]
        if tls is not None and tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        if tls is not None:
            self._channel = grpc.aio.secure_channel(address, tls.channel_credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
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
        # A stream's request to a sidecar without a lane: one request on its ModelStreamInfer.
        self._stream_infer = self._channel.stream_stream(
            f"/{SERVICE}/ModelStreamInfer", response_deserializer=pb.ModelStreamInferResponse.FromString
        )

    def __repr__(self) -> str:
        return f"SidecarClient({self.framework!r}, {self.address!r})"

    async def infer(
        self, encoded: bytes, traceparent: str = "", responses: Callable[[bytes | TurnoutError], None] | None = None
    ) -> bytes:
        """Forward a serialized ModelInferRequest; return the serialized response. A traced
        request's `traceparent` rides the gRPC call's metadata (on the lane, the request's
        own trace parameter carries it). With `responses` (a stream's request), a decoupled
        model's responses before its last go there, and the last is returned (b"" when the
        model ended without one); only the lane carries them."""
        if self._lane is not None:
            try:
                # The request id rides the frame, so the sidecar's lines name it at any level.
                if responses is not None:
                    return await self._stream(encoded, responses)
                return await self._lane.call(encoded, REQUEST_ID.get())  # raises the sidecar's TurnoutError
            except LaneMismatch as exc:  # nothing was sent: another replica may take it
                self._say_lane_failure(exc.message)
                raise SidecarUnreachable(exc.status, exc.message) from exc
            except TurnoutError as exc:
                if isinstance(exc.__cause__, OSError):  # the connect failed: nothing was sent
                    if self.tls:
                        self._say_lane_failure(exc.message)
                    raise SidecarUnreachable(exc.status, exc.message) from exc
                raise
        try:
            if responses is not None:
                return await self._grpc_stream(encoded, responses)
            if traceparent:
                response: bytes = await self._infer(encoded, metadata=((TRACEPARENT, traceparent),))
            else:
                response = await self._infer(encoded)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.tls) from exc
        return response

    async def _stream(self, encoded: bytes, responses: Callable[[bytes | TurnoutError], None]) -> bytes:
        assert self._lane is not None
        async for payload, last in self._lane.stream(encoded, REQUEST_ID.get()):
            if last and isinstance(payload, bytes):  # a last error is raised, never yielded
                return payload
            responses(payload)
        return b""  # pragma: no cover - a lane stream always ends with its last answer

    async def _grpc_stream(self, encoded: bytes, responses: Callable[[bytes | TurnoutError], None]) -> bytes:
        """`_stream` over the sidecar's ModelStreamInfer: its responses up to the final one."""
        async for answer in self._stream_infer(iter([encoded])):
            final = answer.infer_response.parameters.get("triton_final_response")
            if answer.error_message:
                if final is not None and not final.bool_param:  # an error response, more to follow
                    responses(internal(answer.error_message))
                    continue
                # The model's error response names the model; a refusal of the request does not.
                raise TurnoutError(
                    Status.INTERNAL, answer.error_message, Cause.RESPONSE if answer.infer_response.model_name else None
                )
            payload: bytes = answer.infer_response.SerializeToString()
            if final is not None and final.bool_param:
                return payload
            responses(payload)
        return b""  # the final flag came alone, and the client did not ask to see it

    def _say_lane_failure(self, message: str) -> None:
        # Once per distinct failure, not once per request that meets it.
        if message != self._last_lane_failure:
            self._last_lane_failure = message
            logger.error("the %s sidecar at %s: %s", self.framework, self.address, message)

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float | None = None) -> M:
        """A typed unary call by method name ("ModelMetadata", ...)."""
        try:
            response = await self._calls[method](request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, self.tls) from exc
        if not isinstance(response, response_type):  # pragma: no cover - table mismatch
            raise unavailable(f"unexpected response type from sidecar {self.address}")
        return response

    async def readiness(self) -> bool | None:
        """The sidecar's own readiness; None when it cannot be reached in time, False when
        its lane speaks another protocol version (no inference could pass)."""
        try:
            response = await self.call(
                "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, timeout=READY_TIMEOUT_SECS
            )
        except TurnoutError:
            return None
        if response.ready and self._lane is not None:
            try:
                await asyncio.wait_for(self._lane.connect(), READY_TIMEOUT_SECS)  # at once when connected
            except LaneMismatch as exc:
                self._say_lane_failure(exc.message)
                return False
            except (TurnoutError, TimeoutError):
                pass  # a lane that does not answer shows on the requests, which fail over
        return bool(response.ready)

    async def server_ready(self) -> bool:
        """`readiness`, False when it cannot be reached."""
        return bool(await self.readiness())

    async def repository_index(self) -> pb.RepositoryIndexResponse:
        return await self.call("RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse)

    async def close(self, grace: float | None = None) -> None:
        if self._lane is not None:
            if grace:
                await self._lane.drain(grace)
            self._lane.close()
        await self._channel.close(grace)
