"""The sidecar's gRPC face: the v2 inference service for this framework's models and
grpc.health.v1, every RPC behind one error wrapper that maps TurnoutError to a status."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from protos.cnum import parse_version
from protos.identity import SIDECAR_EXTENSIONS, server_metadata
from protos.logs import REQUEST_ID, REQUEST_ID_PARAMETER, LogSettings, fill_log_response, log_updates
from protos.memo import Memo
from protos.rpc import METHODS, abort_call, parse_infer_request
from protos.status import Cause, TurnoutError, decoupled_refused, invalid_arg, not_found, unavailable, unsupported
from protos.trace import TRACE_PARAMETER, timestamps_text
from protos.validation import Answer, ValidRequest, form_of, validate, validate_known
from protos.wire import split_raw
from sidecars.batcher import BackendFailure, Result
from sidecars.config import parse_override, poll_failure
from sidecars.models import LoadedVersion, ModelManager
from sidecars.responses import build_response, encode_response, set_parameters
from sidecars.settings import ControlMode

log = logging.getLogger(__name__)

_NO_SHM = "client shared memory is handled by the turnout gateway, not by a sidecar"

Request = TypeVar("Request")
Response = TypeVar("Response")


def rpc(
    method: Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]],
) -> Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]:
    """The one error wrapper: every RPC ends through protos.rpc.abort_call."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_call(context, exc, method.__name__, log)

    wrapper.error_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _stream_failure(request: pb.ModelInferRequest, message: str, final: bool | None) -> pb.ModelStreamInferResponse:
    """An error on ModelStreamInfer, in-band as Triton sends it. The model's error response
    names the request's model, version and id, `final` when it ends the request; a request
    refused before it ran (`final` None) carries its id alone."""
    failed = pb.ModelStreamInferResponse(error_message=message)
    failed.infer_response.id = request.id
    if final is not None:
        failed.infer_response.model_name = request.model_name
        failed.infer_response.model_version = request.model_version
        failed.infer_response.parameters["triton_final_response"].bool_param = final
    return failed


def _stream_rpc(
    method: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Response]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Response]]:
    @functools.wraps(method)
    async def wrapper(self: Any, requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Response]:
        try:
            async for response in method(self, requests, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_call(context, exc, method.__name__, log)

    wrapper.error_wrapped = True  # type: ignore[attr-defined]
    return wrapper


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """inference.GRPCInferenceService for the models one ModelManager owns."""

    def __init__(self, manager: ModelManager, logs: LogSettings | None = None) -> None:
        self.manager = manager
        self.logs = logs or LogSettings()
        # The heads of lane requests found valid before (infer_encoded), with what parsing
        # one found; None for a head whose requests are parsed in full.
        self._known: Memo[bytes, _Known | None] = Memo(_KNOWN_HEADS)
        unwrapped = [m.name for m in METHODS if not getattr(getattr(self, m.name), "error_wrapped", False)]
        if unwrapped:
            raise TypeError(f"RPCs without the error wrapper: {unwrapped}")

    # -- health and metadata -----------------------------------------------------------

    @rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.manager.is_ready())

    @rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.manager.is_model_ready(request.name, request.version))

    @rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return server_metadata(SIDECAR_EXTENSIONS)

    @rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        loaded = self.manager.resolve(request.name, request.version)
        config = loaded.config
        if request.version:
            versions = [loaded.version_text]
        else:
            versions = [v.version_text for v in self.manager.ready_versions(request.name)]
        response = pb.ModelMetadataResponse(
            name=config.name, versions=versions, platform=config.platform or config.backend
        )
        signature = loaded.signature
        for spec in signature.inputs.values():
            response.inputs.add(name=spec.name, datatype=spec.datatype.name, shape=signature.full_dims(spec))
        for spec in signature.outputs.values():
            response.outputs.add(name=spec.name, datatype=spec.datatype.name, shape=signature.full_dims(spec))
        return response

    @rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        loaded = self.manager.resolve(request.name, request.version)
        return pb.ModelConfigResponse(config=loaded.config)

    # -- inference -----------------------------------------------------------------------

    @rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._infer(request)

    async def _infer(self, request: pb.ModelInferRequest, lane_id: str = "") -> pb.ModelInferResponse:
        answer = self._infer_now(request, lane_id)
        if not isinstance(answer, pb.ModelInferResponse | bytes):
            answer = await answer
        assert isinstance(answer, pb.ModelInferResponse)  # asked for a message, not `encoded`
        return answer

    def _infer_now(
        self, request: pb.ModelInferRequest, lane_id: str = "", encoded: bool = False
    ) -> pb.ModelInferResponse | bytes | Awaitable[pb.ModelInferResponse | bytes]:
        """The response, when the model ran at once (DynamicBatcher.run_now: no task, no
        queue); else the awaitable that queues the request and gives its response. With
        `encoded`, the response may come serialized (_respond)."""
        call = _Call(time.monotonic_ns())
        # The gateway's request id: the lane frame's, else the client's `id`, else one the
        # gateway passed as a parameter (over gRPC), stripped here so the model never sees
        # it. Every log line carries it.
        request_id = lane_id or request.id
        parameters = request.parameters
        if REQUEST_ID_PARAMETER in parameters:
            request_id = request_id or parameters[REQUEST_ID_PARAMETER].string_param
            del parameters[REQUEST_ID_PARAMETER]
        REQUEST_ID.set(request_id)
        call.request_id = request_id
        # A request the gateway traces asks for this sidecar's timestamps (protos.trace).
        call.traced = TRACE_PARAMETER in parameters
        call.verbose = log.isEnabledFor(logging.DEBUG)
        if call.traced:
            traceparent = parameters[TRACE_PARAMETER].string_param
            del parameters[TRACE_PARAMETER]
            if call.verbose:
                log.debug("traced request (traceparent '%s')", traceparent)
        if call.verbose:
            log.debug("infer model '%s' version '%s'", request.model_name, request.model_version)
        loaded: LoadedVersion = self.manager.resolve(request.model_name, request.model_version)
        if loaded.config.model_transaction_policy.decoupled:
            raise decoupled_refused()
        try:
            valid = call.valid = validate(request, loaded.signature)
        except TurnoutError as exc:
            _failed(loaded, call, exc, "REJECTED")
            raise
        return self._run(loaded, call, valid, encoded)

    def _infer_known(
        self, known: _Known, raw: list[memoryview], lane_id: str
    ) -> pb.ModelInferResponse | bytes | Awaitable[pb.ModelInferResponse | bytes] | None:
        """_infer_now for a lane request whose head was seen before, given its raw buffers
        where they lie: no parse, no checks but the buffers' sizes. None where that is not
        enough (the model is gone or decoupled, the form was refused, a size differs):
        _infer_now of the parsed request then answers, or refuses in its words."""
        call = _Call(time.monotonic_ns())
        try:
            loaded: LoadedVersion = self.manager.resolve(known.model_name, known.model_version)
        except TurnoutError:
            return None
        if loaded.config.model_transaction_policy.decoupled:
            return None
        valid = call.valid = validate_known(raw, known.form, loaded.signature)
        if valid is None:
            return None
        REQUEST_ID.set(lane_id)
        call.request_id = lane_id
        call.verbose = log.isEnabledFor(logging.DEBUG)
        if call.verbose:
            log.debug("infer model '%s' version '%s'", known.model_name, known.model_version)
        return self._run(loaded, call, valid, True)

    def _run(
        self, loaded: LoadedVersion, call: _Call, valid: ValidRequest, encoded: bool
    ) -> pb.ModelInferResponse | bytes | Awaitable[pb.ModelInferResponse | bytes]:
        try:
            result = loaded.batcher.run_now(valid)
        except TurnoutError as exc:
            _failed(loaded, call, exc, "REJECTED")
            raise
        if result is None:
            return self._queued(loaded, call, valid, encoded)
        return _respond(loaded, call, valid, result, encoded)

    async def _queued(
        self, loaded: LoadedVersion, call: _Call, valid: ValidRequest, encoded: bool
    ) -> pb.ModelInferResponse | bytes:
        REQUEST_ID.set(call.request_id)  # in this task's own context, whoever started it
        try:
            result = await loaded.batcher.submit(valid)
        except TurnoutError as exc:
            _failed(loaded, call, exc, "REJECTED")
            raise
        except asyncio.CancelledError:
            valid.cancelled = True  # a model still running it may ask (python's is_cancelled)
            loaded.stats.record_failure(time.monotonic_ns() - call.start, "CANCELED")
            log.debug("infer cancelled by its client")
            raise
        return _respond(loaded, call, valid, result, encoded)

    async def _infer_decoupled(
        self, request: pb.ModelInferRequest, request_id: str = ""
    ) -> AsyncIterator[tuple[pb.ModelInferResponse | TurnoutError | None, bool]]:
        """A request to a decoupled model: each response as the model sends it, with
        whether it is the last; an error response with more to follow as its TurnoutError
        (one that ends the request is raised); (None, True) when the model ended without one."""
        start = time.monotonic_ns()
        parameters = request.parameters
        if REQUEST_ID_PARAMETER in parameters:
            request_id = request_id or parameters[REQUEST_ID_PARAMETER].string_param
            del parameters[REQUEST_ID_PARAMETER]
        REQUEST_ID.set(request_id or request.id)
        if TRACE_PARAMETER in parameters:  # a traced stream request: no timestamps from here
            del parameters[TRACE_PARAMETER]
        loaded = self.manager.resolve(request.model_name, request.model_version)
        answers: asyncio.Queue[tuple[Answer | TurnoutError | None, bool]] = asyncio.Queue()
        valid = None
        done = False  # the model sent its last answer: counted once, before it leaves
        try:
            valid = validate(request, loaded.signature)
            valid.responses = lambda answer, last: answers.put_nowait((answer, last))
            result = await loaded.batcher.submit(valid)
            last = False
            while not last:
                answer, last = await answers.get()
                if isinstance(answer, TurnoutError):
                    if last:
                        raise BackendFailure(answer.status, answer.message)  # the model's last answer
                    yield answer, False  # an error response: the request goes on, as in Triton
                    continue
                if last:
                    # Its reader may stop at the last answer and close this generator.
                    done = True
                    loaded.stats.record_success(time.monotonic_ns() - start, result.queue_ns, result.times)
                if answer is None:
                    yield None, True
                    continue
                response = build_response(
                    loaded.name, loaded.version_text, loaded.signature, valid, answer.outputs, loaded.labels
                )
                set_parameters(response.parameters, answer.parameters)
                yield response, last
        except TurnoutError as exc:
            if valid is not None and valid.queued:  # else refused before any model saw it
                loaded.stats.record_failure(time.monotonic_ns() - start, "BACKEND")
            log.info("infer failed: %s", exc.message)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if not done:
                if valid is not None:
                    valid.cancelled = True  # the model's response sender says so from now on
                loaded.stats.record_failure(time.monotonic_ns() - start, "CANCELED")
            raise

    async def _stream_answers(
        self, request: pb.ModelInferRequest, request_id: str = ""
    ) -> AsyncIterator[tuple[pb.ModelInferResponse | TurnoutError | None, bool]]:
        """Every answer to one request of a stream: one for most models, as many as a
        decoupled model sends."""
        loaded = self.manager.resolve(request.model_name, request.model_version)
        if not loaded.config.model_transaction_policy.decoupled:
            yield await self._infer(request, request_id), True
            return
        async for answer in self._infer_decoupled(request, request_id):
            yield answer

    async def stream_encoded(
        self, encoded: memoryview, request_id: str
    ) -> AsyncIterator[tuple[bytes | TurnoutError, bool]]:
        """A STREAM call on the gateway's lane: serialized responses (an error response as
        its TurnoutError), the last one marked."""
        async for response, last in self._stream_answers(parse_infer_request(encoded), request_id):
            if isinstance(response, pb.ModelInferResponse):
                yield response.SerializeToString(), last
            else:
                yield (response if response is not None else b""), last

    def infer_encoded(self, encoded: memoryview, request_id: str) -> bytes | Awaitable[bytes]:
        """ModelInfer for the gateway's lane: a serialized request and the gateway's request
        id in, a serialized response out; at once where the model ran at once."""
        # Run in a context of its own: the lane's read callback must not keep this
        # request's id for whatever it logs next.
        context = contextvars.copy_context()
        answer = None
        head = b""  # one to learn, after its request was found valid
        split = split_raw(encoded, _HEAD_TAGS, _RAW_INPUT_TAG)
        if split is not None and split[0] <= _KNOWN_HEAD_BYTES:
            head = bytes(encoded[: split[0]])
            known = self._known.get(head, _UNSEEN)
            if known is not _UNSEEN:
                if known is not None:
                    answer = context.run(self._infer_known, known, split[1], request_id)
                head = b""
        if answer is None:
            request = parse_infer_request(encoded)
            answer = context.run(self._infer_now, request, request_id, True)
            if head:
                self._learn(head, request)
        if isinstance(answer, bytes):
            return answer
        if isinstance(answer, pb.ModelInferResponse):
            serialized: bytes = answer.SerializeToString()
            return serialized
        return _serialized(answer)

    def _learn(self, head: bytes, request: pb.ModelInferRequest) -> None:
        """Once the request of `head` was found valid: remember what it names and its form
        for the next request with the same head (a client sends one form again and again),
        or, where its form is not remembered (its elements, not its sizes, decide: BYTES),
        that a request of that head is parsed in full."""
        form = form_of(request)
        known = None
        if form is not None:
            with contextlib.suppress(TurnoutError):  # unloaded meanwhile: parsed in full for now
                if form in self.manager.resolve(request.model_name, request.model_version).signature.forms:
                    known = _Known(request.model_name, request.model_version, form)
        self._known.remember(head, known)

    @_stream_rpc
    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        # Requests run concurrently (so a stream can fill batches); responses leave in
        # request order (a decoupled model's several in the order it sent them), the last
        # of each marked final, errors in-band so the stream stays open.
        answers: asyncio.Queue[asyncio.Queue[pb.ModelStreamInferResponse | None] | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def read() -> None:
            async for request in requests:
                own: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
                answers.put_nowait(own)
                task = asyncio.create_task(self._stream_one(request, own))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (own := await answers.get()) is not None:
                while (response := await own.get()) is not None:
                    yield response
            await reader
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _stream_one(
        self, request: pb.ModelInferRequest, out: asyncio.Queue[pb.ModelStreamInferResponse | None]
    ) -> None:
        empty_final = request.parameters.get("triton_enable_empty_final_response")
        try:
            async for response, last in self._stream_answers(request):
                if isinstance(response, TurnoutError):  # in-band, as Triton: the stream goes on
                    out.put_nowait(_stream_failure(request, response.message, final=False))
                    continue
                if response is None:
                    if not (empty_final is not None and empty_final.bool_param):
                        continue  # as Triton: an empty final response only where the client asked
                    response = pb.ModelInferResponse(
                        id=request.id, model_name=request.model_name, model_version=request.model_version
                    )
                response.parameters["triton_final_response"].bool_param = last
                out.put_nowait(pb.ModelStreamInferResponse(infer_response=response))
        except Exception as exc:
            message = exc.message if isinstance(exc, TurnoutError) else str(exc) or type(exc).__name__
            answered = isinstance(exc, TurnoutError) and exc.cause is Cause.RESPONSE
            out.put_nowait(_stream_failure(request, message, final=True if answered else None))
        finally:
            out.put_nowait(None)

    # -- statistics and repository -------------------------------------------------------

    @rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        if request.name:
            # Triton's order and words: the version's text, then whether any version is ready.
            wanted = parse_version(request.version)
            versions = self.manager.ready_versions(request.name)
            if not versions:
                raise invalid_arg(f"requested model '{request.name}' is not available")
            if wanted >= 0:
                versions = [v for v in versions if v.version == wanted]
                if not versions:
                    raise invalid_arg(f"requested model version is not available for model '{request.name}'")
        else:
            versions = [v for name in self.manager.model_names() for v in self.manager.ready_versions(name)]
        response = pb.ModelStatisticsResponse()
        for loaded in versions:
            entry = response.model_stats.add(name=loaded.name, version=loaded.version_text)
            loaded.stats.fill(entry)
        return response

    @rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for entry in await self.manager.index(request.ready):
            response.models.add(name=entry.name, version=entry.version, state=entry.state, reason=entry.reason)
        return response

    def _check_control(self, repository_name: str) -> None:
        if self.manager.settings.model_control_mode is not ControlMode.EXPLICIT:
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")
        if repository_name:
            raise unsupported("'repository_name' specification is not supported")

    @rpc
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        self._check_control(request.repository_name)
        override = None
        files: dict[str, bytes] = {}
        for key, parameter in request.parameters.items():
            if key == "config":
                try:
                    override = parse_override(parameter.string_param)
                except TurnoutError as exc:  # as Triton: its repository poll refuses it
                    log.error("Poll failed for model directory '%s': %s", request.model_name, exc.message)
                    raise poll_failure(request.model_name, exc.message) from None
            elif key.startswith("file:"):
                files[key.removeprefix("file:")] = parameter.bytes_param
            else:
                raise invalid_arg(f"unrecognized load parameter '{key}'.")
        await self.manager.load(request.model_name, override, files)
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        # unload_dependents is accepted: the gateway unloads the ensembles that depend on a model.
        self._check_control(request.repository_name)
        await self.manager.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- owned by the gateway ------------------------------------------------------------

    @rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        raise unsupported(_NO_SHM)

    @rpc
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        raise unsupported("trace settings are served by the turnout gateway")

    @rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        # The gateway forwards its clients' changes here, so both processes log alike.
        current = self.logs.update(log_updates(request)) if request.settings else self.logs.as_dict()
        response = pb.LogSettingsResponse()
        fill_log_response(current, response)
        return response


# A lane request's head: its fields before its raw contents, as wire tags. Only model_name
# (1), model_version (2), inputs (5) and outputs (6): one with an id (3) or parameters
# (4) is parsed in full. raw_input_contents (7) follow, each input's bytes.
_HEAD_TAGS = frozenset((0x0A, 0x12, 0x2A, 0x32))
_RAW_INPUT_TAG = 0x3A
_KNOWN_HEADS = 64
_KNOWN_HEAD_BYTES = 4096  # a longer head is parsed every time, never remembered
_UNSEEN: Any = object()  # a head not in the memo (None there: one parsed in full)


class _Known(NamedTuple):
    """What parsing a request of one head found: the model it names and its form."""

    model_name: str
    model_version: str
    form: tuple[Any, ...]


class _Call:
    """One infer request's bookkeeping, from its arrival to its response."""

    __slots__ = ("request_id", "start", "traced", "valid", "verbose")

    def __init__(self, start: int) -> None:
        self.start = start
        self.request_id = ""
        self.traced = False
        self.verbose = False
        self.valid: ValidRequest | None = None


def _respond(
    loaded: LoadedVersion, call: _Call, valid: ValidRequest, result: Result, encoded: bool = False
) -> pb.ModelInferResponse | bytes:
    """The response, counted; with `encoded`, serialized, where nothing is added to it after
    its outputs (parameters, a trace's timestamps, classification)."""
    response: pb.ModelInferResponse | bytes | None = None
    try:
        if encoded and not result.parameters and not call.traced:
            response = encode_response(loaded.name, loaded.version_text, loaded.signature, valid, result.outputs)
        if response is None:
            response = build_response(
                loaded.name, loaded.version_text, loaded.signature, valid, result.outputs, loaded.labels
            )
            if result.parameters:
                set_parameters(response.parameters, result.parameters)
    except TurnoutError as exc:
        _failed(loaded, call, exc, "OTHER")
        raise
    end = time.monotonic_ns()
    loaded.stats.record_success(end - call.start, result.queue_ns, result.times)
    if call.traced and isinstance(response, pb.ModelInferResponse):
        response.parameters[TRACE_PARAMETER].string_param = _timestamps(call.start, end, result)
    if call.verbose:
        log.debug("infer done in %d us", (time.monotonic_ns() - call.start) // 1000)
    return response


def _failed(loaded: LoadedVersion, call: _Call, exc: TurnoutError, reason: str) -> None:
    """Count and log a failed request by Triton's rules: a backend's failure as BACKEND; a
    refusal no model saw counted nowhere; else `reason` (the step that failed)."""
    if isinstance(exc, BackendFailure):
        loaded.stats.record_failure(time.monotonic_ns() - call.start, "BACKEND")
        # Failures are logged at default level, with the request id both processes share.
        log.warning("infer failed in the backend: %s", exc.message)
    elif call.valid is None or not call.valid.queued:
        log.info("infer failed (refused before it ran): %s", exc.message)
    else:
        loaded.stats.record_failure(time.monotonic_ns() - call.start, reason)
        log.info("infer failed (%s): %s", reason, exc.message)


async def _serialized(answer: Awaitable[pb.ModelInferResponse | bytes]) -> bytes:
    response = await answer
    if isinstance(response, bytes):
        return response
    serialized: bytes = response.SerializeToString()
    return serialized


def _timestamps(start_ns: int, end_ns: int, result: Result) -> str:
    """A traced request's protos.trace.SIDECAR_TIMESTAMPS, from its batch's times."""
    times = result.times
    compute_start = times.start_ns
    input_end = compute_start + times.input_ns
    output_start = input_end + times.infer_ns
    compute_end = output_start + times.output_ns
    return timestamps_text(
        (start_ns, compute_start - result.queue_ns, compute_start, input_end, output_start, compute_end, end_ns)
    )


FLEET_HEALTH_SERVICE = "turnout.Sidecar"


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1: SERVING iff the sidecar is ready, for "" and the inference service;
    for FLEET_HEALTH_SERVICE, iff it is not exiting."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def _status(self, service: str) -> int:
        serving: int = health_pb2.HealthCheckResponse.SERVING
        not_serving: int = health_pb2.HealthCheckResponse.NOT_SERVING
        if service == FLEET_HEALTH_SERVICE:
            # Consul's check: a replica loading or unloading one model still serves the
            # others (the registration's meta says which), so only exiting fails it.
            return not_serving if self.manager.exiting else serving
        if service not in ("", "inference.GRPCInferenceService"):
            raise not_found(f"unknown service '{service}'")
        return serving if self.manager.is_ready() else not_serving

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        try:
            status = self._status(request.service)
        except TurnoutError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            try:
                status = self._status(request.service)
            except TurnoutError:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(0.5)


def add_services(server: grpc.aio.Server, manager: ModelManager, logs: LogSettings | None = None) -> InferenceService:
    service = InferenceService(manager, logs)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(manager), server)
    return service
