"""The gRPC front end: inference.GRPCInferenceService and grpc.health.v1.Health.

Handlers are built from protos.rpc.METHODS. ModelInfer and ModelStreamInfer take
the request bytes as received and return the sidecar's bytes, so inference crosses
the gateway without re-encoding; every other method uses protobuf. Every RPC goes
through `guarded`, the one place where errors become gRPC statuses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.context import NO_CONTEXT, RequestContext
from gateway.core import Gateway
from gateway.grpc_server import Server, Transport
from gateway.header_forward import HeaderForward, parameters_suffix, set_parameters
from gateway.restrictions import GRPC_METHOD_GROUPS, Restriction, grpc_refusal
from gateway.settings import GatewaySettings
from gateway.tracing.trace import (
    GRPC_SEND_END,
    GRPC_SEND_START,
    GRPC_WAITREAD_END,
    GRPC_WAITREAD_START,
    INFER_RESPONSE_COMPLETE,
    Trace,
)
from protos import grpc_service_pb2 as pb
from protos.rpc import BY_NAME, MESSAGE_SIZE_OPTIONS, METHODS, SERVICE, abort_call, parse_infer_request
from protos.status import CAUSE_METADATA, REFUSAL_STATUS_PARAMETER, Cause, Status, TurnoutError, internal
from protos.wire import length_delimited

logger = logging.getLogger(__name__)

SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
# Health answers keep flowing while the server drains, so clients can see it go.
_ANSWERED_WHILE_DRAINING = frozenset({"ServerLive", "ServerReady"})

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
StreamHandler = Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], AsyncIterator[bytes]]


def _final_response_suffix(final: bool) -> bytes:
    # Appending a serialized map entry to a serialized message adds that entry, so
    # `triton_final_response` joins the sidecar's response bytes without re-encoding.
    marker = pb.ModelInferResponse()
    marker.parameters["triton_final_response"].bool_param = final
    suffix: bytes = marker.SerializeToString()
    return suffix


_FINAL_RESPONSE = _final_response_suffix(True)
_MORE_RESPONSE = _final_response_suffix(False)  # a decoupled model's response with more to follow
_INFER_RESPONSE_FIELD = pb.ModelStreamInferResponse.INFER_RESPONSE_FIELD_NUMBER


def stream_response(infer_response: bytes) -> bytes:
    """A serialized ModelStreamInferResponse holding a serialized ModelInferResponse."""
    body = infer_response + _FINAL_RESPONSE
    return length_delimited(_INFER_RESPONSE_FIELD, body)


def stream_part(answer: bytes | TurnoutError, request_id: str, model: tuple[str, str]) -> bytes:
    """A decoupled model's response with more to follow, as a ModelStreamInferResponse; an
    error response is its message, as Triton sends it: naming the `model` (name, version as
    the request named them) and the id, not final, and the stream goes on."""
    if isinstance(answer, TurnoutError):
        return stream_error(answer.message, request_id, model, final=False)
    return length_delimited(_INFER_RESPONSE_FIELD, answer + _MORE_RESPONSE)


def stream_error(
    message: str,
    request_id: str,
    model: tuple[str, str] = ("", ""),
    final: bool | None = None,
    status: Status | None = None,
) -> bytes:
    """An error on the stream, worded as Triton words it: the model's error response names
    the `model` (name, version as the request named it) and the id, `final` when it ends
    the request; a request refused before it ran (`final` None) carries its id alone, and
    its `status` where the caller asked for causes (REFUSAL_STATUS_PARAMETER)."""
    response = pb.ModelStreamInferResponse(error_message=message)
    response.infer_response.id = request_id
    if final is not None:
        response.infer_response.model_name, response.infer_response.model_version = model
        response.infer_response.parameters["triton_final_response"].bool_param = final
    elif status is not None:
        response.infer_response.parameters[REFUSAL_STATUS_PARAMETER].string_param = status.name
    serialized: bytes = response.SerializeToString()
    return serialized


def _wants_empty_final(request: pb.ModelInferRequest) -> bool:
    """Triton sends a decoupled model's final flag alone only to clients that ask for it."""
    parameter = request.parameters.get("triton_enable_empty_final_response")
    return parameter is not None and parameter.bool_param


def _empty_response(request: pb.ModelInferRequest) -> bytes:
    empty = pb.ModelInferResponse(id=request.id, model_name=request.model_name, model_version=request.model_version)
    serialized: bytes = empty.SerializeToString()
    return serialized


def _unparsable() -> TurnoutError:
    """What grpc's C++ server (Triton's) answers a request that is no message of its type:
    bytes that do not decode, or a string field that is not UTF-8."""
    return internal("Unable to parse request")


def _parse_infer(encoded: bytes) -> pb.ModelInferRequest:
    try:
        request: pb.ModelInferRequest = parse_infer_request(encoded)
    except DecodeError:
        raise _unparsable() from None
    return request


def _parsing(handler: Handler, message: Any) -> Handler:
    """`handler` taking the request's bytes, parsed as `message` (a protobuf class)."""

    async def call(encoded: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = message.FromString(encoded)
        except DecodeError:
            raise _unparsable() from None
        return await handler(request, context)

    return call


def _request_context(context: Any) -> RequestContext:
    """The call's metadata (routing may read a sticky key there) and its deadline."""
    metadata = context.invocation_metadata()
    remaining = context.time_remaining()
    if not metadata and remaining is None:
        return NO_CONTEXT
    headers = {key: value for key, value in metadata or () if isinstance(value, str)}
    deadline = time.monotonic() + remaining if remaining is not None else None
    return RequestContext(headers, deadline)


def _carries(context: grpc.aio.ServicerContext, restriction: Restriction) -> bool:
    return any(
        key == restriction.key and value == restriction.value for key, value in context.invocation_metadata() or ()
    )


def guarded(name: str, gateway: Gateway, handler: Handler, restriction: Restriction | None = None) -> Handler:
    """The one error wrapper (protos.rpc.abort_call: Triton's status and text, else INTERNAL).
    A `restriction` (gateway.restrictions) refuses calls without its metadata first."""
    refuse_while_draining = name not in _ANSWERED_WHILE_DRAINING

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if restriction is not None and not _carries(context, restriction):
            await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(restriction))
        if refuse_while_draining and gateway.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        try:
            return await handler(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_call(context, _for_clients(exc, context), name, logger)

    call.turnout_guarded = True  # type: ignore[attr-defined]
    call.__qualname__ = f"guarded.{name}"
    return call


def _for_clients(error: Exception, context: grpc.aio.ServicerContext) -> Exception:
    """`error` as a client sees it: a cause is for turnout's own callers alone (a python
    model's BLS call asks for it by sending the cause's metadata key)."""
    if not isinstance(error, TurnoutError) or error.cause is None or _asks_causes(context):
        return error
    return TurnoutError(error.status, error.message)


def _asks_causes(context: grpc.aio.ServicerContext) -> bool:
    return any(key == CAUSE_METADATA for key, _ in context.invocation_metadata() or ())


def guarded_stream(
    name: str, gateway: Gateway, handler: StreamHandler, restriction: Restriction | None = None
) -> StreamHandler:
    """`guarded` for the bidi stream: per-request errors are in-band; this catches the rest."""

    async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if restriction is not None and not _carries(context, restriction):
            await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(restriction))
        if gateway.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        try:
            async for response in handler(requests, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_call(context, _for_clients(exc, context), name, logger)

    call.turnout_guarded = True  # type: ignore[attr-defined]
    call.__qualname__ = f"guarded.{name}"
    return call


def _sent(trace: Trace) -> None:
    trace.stamp(GRPC_SEND_END)
    trace.finish()


class _Final(NamedTuple):
    """A stream request's last response (or its in-band error), and its trace if sampled."""

    payload: bytes
    trace: Trace | None = None


# Requests of one ModelStreamInfer call read and not yet answered, unless set otherwise.
STREAM_WINDOW = 1024


class InferenceService:
    """The v2 methods, each a translation to one Gateway call. `stream_window`: at most so
    many requests of one stream are read and not yet answered (0: no limit); `forward`:
    the metadata that infer requests carry to the model as parameters."""

    def __init__(
        self, gateway: Gateway, stream_window: int = STREAM_WINDOW, forward: HeaderForward | None = None
    ) -> None:
        self._gateway = gateway
        self._stream_window = stream_window
        self._forward = forward if forward is not None else HeaderForward("")

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=await self._gateway.server_live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._gateway.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=await self._gateway.model_ready(request))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return self._gateway.server_metadata()

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return await self._gateway.model_metadata(request)

    async def ModelInfer(self, request: bytes, context: Any) -> bytes:
        parsed = _parse_infer(request)
        call_context = _request_context(context)
        if self._forward:
            request = self._forwarded(parsed, request, call_context)
        trace = self._gateway.tracer.sample(parsed.model_name, call_context.headers)
        if trace is None:
            return await self._gateway.infer(parsed, request, call_context)
        # grpc hands the handler a request already read: the wait for it cannot be seen,
        # so both GRPC_WAITREAD timestamps mark its arrival here.
        trace.stamp(GRPC_WAITREAD_START)
        trace.stamp(GRPC_WAITREAD_END)
        context.add_done_callback(lambda _: _sent(trace))
        try:
            response = await self._gateway.infer(parsed, request, replace(call_context, trace=trace))
            trace.stamp(INFER_RESPONSE_COMPLETE)
            return response
        finally:
            trace.stamp(GRPC_SEND_START)

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        # Each request runs concurrently; its response (or in-band error) is queued as
        # it completes. The stream ends once the client is done and all have answered.
        # At most `stream_window` requests are read and not yet answered: past that, the
        # stream is read no further until an answer leaves, so a client that sends and
        # never reads is held back by gRPC's flow control, not by the gateway's memory.
        responses: asyncio.Queue[bytes | _Final | None] = asyncio.Queue()
        window = asyncio.Semaphore(self._stream_window) if self._stream_window else None
        call_context = _request_context(context)
        with_status = _asks_causes(context)

        async def one(request: pb.ModelInferRequest, encoded: bytes) -> None:
            final = None
            try:
                final = await self._stream_one(request, encoded, call_context, with_status, responses.put_nowait)
            finally:
                if final is not None:
                    responses.put_nowait(final)
                elif window is not None:
                    window.release()

        async def read_all(group: asyncio.TaskGroup) -> None:
            async for encoded in requests:
                try:
                    request = parse_infer_request(encoded)
                except DecodeError:
                    # grpc's C++ server fails such a read, which Triton takes for the end
                    # of the client's requests: those read are answered, then the stream
                    # ends with OK.
                    return
                if window is not None:
                    await window.acquire()
                group.create_task(one(request, encoded))

        async def run() -> None:
            try:
                async with asyncio.TaskGroup() as group:
                    await read_all(group)
            finally:
                responses.put_nowait(None)

        # The reader is held here rather than in a TaskGroup: a generator must not
        # yield from inside one. It is awaited (errors surface) or cancelled on exit.
        reader = asyncio.ensure_future(run())
        try:
            while (response := await responses.get()) is not None:
                if isinstance(response, bytes):  # a decoupled model's response, more to follow
                    yield response
                    continue
                trace = response.trace
                if trace is not None:
                    trace.stamp(GRPC_SEND_START)
                yield response.payload  # grpc resumes the generator once the response is written
                if trace is not None:
                    _sent(trace)
                if window is not None:
                    window.release()
            await reader
        finally:
            reader.cancel()

    async def _stream_one(
        self,
        request: pb.ModelInferRequest,
        encoded: bytes,
        call_context: RequestContext,
        with_status: bool,
        send_part: Callable[[bytes], None],
    ) -> _Final | None:
        """One request of a stream: its final response or in-band error, None when a
        decoupled model ends it without one; earlier responses go to `send_part`."""
        request_id = ""
        called = ("", "")  # the model and version as the client named them
        trace = None
        try:
            request_id = request.id
            called = (request.model_name, request.model_version)
            if self._forward:
                encoded = self._forwarded(request, encoded, call_context)
            trace = self._gateway.tracer.sample(request.model_name, call_context.headers)
            context = call_context
            if trace is not None:
                # As for ModelInfer, the read has already happened: both stamps mark it.
                trace.stamp(GRPC_WAITREAD_START)
                trace.stamp(GRPC_WAITREAD_END)
                context = replace(call_context, trace=trace)
            # A decoupled model's earlier responses join the stream as they come.
            parts = partial(stream_part, request_id=request_id, model=called)
            own = replace(context, responses=lambda part: send_part(parts(part)))
            answer = await self._gateway.infer(request, encoded, own)
            if trace is not None:
                trace.stamp(INFER_RESPONSE_COMPLETE)
            if answer or _wants_empty_final(request):
                return _Final(stream_response(answer or _empty_response(request)), trace)
            if trace is not None:
                trace.finish()
            return None
        except TurnoutError as exc:
            if trace is not None:
                trace.finish()
            if exc.cause is Cause.RESPONSE:  # the model's error response, not a refusal
                return _Final(stream_error(exc.message, request_id, called, final=True))
            status = exc.status if with_status else None
            return _Final(stream_error(exc.message, request_id, status=status))
        except Exception as exc:
            if trace is not None:
                trace.finish()
            logger.exception("stream request failed")
            return _Final(stream_error(str(exc) or type(exc).__name__, request_id))
        except BaseException:  # cancelled with its stream
            if trace is not None:
                trace.finish()
            raise

    def _forwarded(self, request: pb.ModelInferRequest, encoded: bytes, context: RequestContext) -> bytes:
        """The metadata the forward pattern matches, set as parameters of the parsed request
        and appended to its bytes."""
        pairs = self._forward.matching(context.headers.items())
        set_parameters(request, pairs)
        return encoded + parameters_suffix(pairs)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return await self._gateway.model_config(request)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        return await self._gateway.model_statistics(request)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return await self._gateway.repository_index(request)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self._gateway.load_model(request)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self._gateway.unload_model(request)
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        return self._gateway.system_shm_status(request)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._gateway.system_shm_register(request)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._gateway.system_shm_unregister(request)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        return self._gateway.cuda_shm_status(request)

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self._gateway.cuda_shm_register(request)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._gateway.cuda_shm_unregister(request)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        return await self._gateway.trace_setting(request)

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        answer = await self._gateway.log_settings(request)
        await self._gateway.forward_log_settings(request)
        return answer


# Methods whose payload crosses as bytes, unparsed by grpcio.
RAW_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})


def method_handlers(
    gateway: Gateway, restrictions: Mapping[str, Restriction] | None = None, service: InferenceService | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """One guarded handler per method of protos.rpc.METHODS, keyed by method name;
    `restrictions` maps API groups to the metadata they require."""
    service = service or InferenceService(gateway)
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in METHODS:
        function = getattr(service, method.name)
        restriction = (restrictions or {}).get(GRPC_METHOD_GROUPS[method.name])
        raw = method.name in RAW_METHODS
        if not raw:
            function = _parsing(function, getattr(pb, method.request))
        serializer = None if raw else getattr(pb, method.response).SerializeToString
        # Requests arrive as bytes and are parsed inside `guarded`: a grpcio deserializer
        # that fails answers UNKNOWN with a traceback, where bad bytes are INVALID_ARG.
        if method.streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                guarded_stream(method.name, gateway, function, restriction),
                response_serializer=serializer,
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                guarded(method.name, gateway, function, restriction),
                response_serializer=serializer,
            )
    return handlers


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1: SERVING exactly when the gateway is ready.

    As Triton, the standard health check belongs to the `health` group: when that group
    is restricted (`restriction`), Check (and Watch, which Triton lacks) answer UNAVAILABLE
    without its metadata, with the text every restricted RPC gives."""

    SERVICES = frozenset({"", SERVICE})

    def __init__(self, gateway: Gateway, watch_interval: float = 1.0, restriction: Restriction | None = None) -> None:
        self._gateway = gateway
        self._watch_interval = watch_interval
        self._restriction = restriction

    async def _refuse_unless_allowed(self, context: grpc.aio.ServicerContext) -> None:
        if self._restriction is not None and not _carries(context, self._restriction):
            await context.abort(grpc.StatusCode.UNAVAILABLE, grpc_refusal(self._restriction))

    async def _status(self) -> int:
        ready = await self._gateway.server_ready()
        status: int = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        return status

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._refuse_unless_allowed(context)
        if request.service not in self.SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=await self._status())

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await self._refuse_unless_allowed(context)
        if request.service not in self.SERVICES:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            return
        last = None
        while True:
            status = await self._status()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(self._watch_interval)


def build_grpc_server(
    gateway: Gateway,
    settings: GatewaySettings,
    restrictions: Mapping[str, Restriction] | None = None,
    shared: bool = False,
) -> grpc.aio.Server | Server:
    """A server with both services added, its transport as `settings` say; the caller binds
    ports and starts it. `shared`: the port is shared with the gateway's other workers
    (gateway.workers). Plain gRPC is served on the event loop itself (gateway.grpc_server),
    TLS by grpc.aio; both apply Triton's keepalive, ping and connection-age flags."""
    level = settings.grpc_infer_response_compression_level.lower()
    server: grpc.aio.Server | Server
    if own_server_serves(settings):
        # Triton's --grpc-infer-response-compression-level: infer answers alone, gzip.
        infer = frozenset(BY_NAME[name].path for name in RAW_METHODS)
        server = Server(
            compression=None if level == "none" else b"gzip",
            compressed=infer,
            shared=shared,
            transport=own_transport(settings),
        )
    else:
        # so_reuseport off unless shared: a second gateway on the same fixed port must fail, not share it.
        options = [*MESSAGE_SIZE_OPTIONS, *transport_options(settings), ("grpc.so_reuseport", 1 if shared else 0)]
        # Triton compresses infer responses alone at that level; grpc.aio sets compression
        # for the whole server (a call's own setting does not take), so every answer is
        # compressed, with gzip, which every gRPC client accepts.
        server = grpc.aio.server(options=options, compression=None if level == "none" else grpc.Compression.Gzip)
    service = InferenceService(
        gateway, settings.grpc_stream_max_inflight, HeaderForward(settings.grpc_header_forward_pattern)
    )
    handlers = method_handlers(gateway, restrictions, service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    health = HealthService(gateway, restriction=(restrictions or {}).get("health"))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return server


def own_server_serves(settings: GatewaySettings) -> bool:
    """Whether gateway.grpc_server serves the gRPC port: all but TLS, which grpc.aio serves."""
    return not settings.grpc_use_ssl


def own_transport(settings: GatewaySettings) -> Transport:
    """Triton's transport flags as gateway.grpc_server applies them (milliseconds to
    seconds; a connection age or grace of 0 is none, as Triton leaves it unset)."""
    return Transport(
        keepalive_time=settings.grpc_keepalive_time / 1000,
        keepalive_timeout=settings.grpc_keepalive_timeout / 1000,
        keepalive_permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        min_recv_ping_interval_without_data=settings.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        max_connection_age=settings.grpc_max_connection_age / 1000 if settings.grpc_max_connection_age else None,
        max_connection_age_grace=(
            settings.grpc_max_connection_age_grace / 1000 if settings.grpc_max_connection_age_grace else None
        ),
    )


def transport_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    """Triton's gRPC transport flags as the grpc server options they set (grpc_server.cc);
    a connection age is set only when given."""
    options = [
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms", settings.grpc_http2_min_recv_ping_interval_without_data),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
    ]
    if settings.grpc_max_connection_age:
        options.append(("grpc.max_connection_age_ms", settings.grpc_max_connection_age))
    if settings.grpc_max_connection_age_grace:
        options.append(("grpc.max_connection_age_grace_ms", settings.grpc_max_connection_age_grace))
    return options
