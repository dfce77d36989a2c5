"""The HTTP/REST front end: Triton's routes on the raw request path, each turned into
one `Gateway` call; TurnoutError becomes `{"error": msg}` with Triton's HTTP status.
Every body is read here, within --http-max-input-size (`encoding.read_body`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.context import RequestContext
from gateway.header_forward import HeaderForward, set_parameters
from gateway.http import messages
from gateway.http.encoding import (
    as_utf8,
    check_encoding,
    compress,
    json_compact,
    json_too_large,
    parse_json,
    raw_input_too_large,
    read_body,
    refuse_too_big_number,
    request_too_large,
    response_encoding,
)
from gateway.http.generate import generate_request, generate_response
from gateway.http.parsing import INFER_HEADER, OutputRendering, header_length, parse_infer_request, raw_binary_request
from gateway.http.protocol import EXCHANGE, HEAD, Exchange, Head
from gateway.http.rendering import render_encoded
from gateway.restrictions import Restriction, http_refusal, parse_restrictions
from gateway.settings import GatewaySettings
from gateway.tracing.trace import (
    HTTP_RECV_END,
    HTTP_RECV_START,
    HTTP_SEND_END,
    HTTP_SEND_START,
    INFER_RESPONSE_COMPLETE,
    Trace,
)
from protos.grpc_service_pb2 import (
    CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest,
    LogSettingsRequest,
    ModelConfigRequest,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStatisticsRequest,
    RepositoryIndexRequest,
    SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
    TraceSettingRequest,
)
from protos.memo import Memo
from protos.status import Cause, TurnoutError, invalid_arg, unsupported

TooLarge = Callable[[int], TurnoutError]

if TYPE_CHECKING:
    from gateway.core import Gateway

logger = logging.getLogger(__name__)

_JSON = "application/json"
_JSON_BYTES = _JSON.encode()
QUEUE_FULL_SUFFIX = "Exceeds maximum queue size"
RETRY_AFTER_SECS = "1"

# Triton's route expressions (src/http_server.cc), matched in Triton's order against
# the raw, undecoded path.
_MODEL = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SYSTEM_SHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_CUDA_SHM = re.compile(r"/v2/cudasharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_TRACE_PATH = "/v2/trace/setting"
_TRACE = "turnout.trace"  # the scope key under which a traced request's Trace waits for its send
# The scope key that says whether Triton would have typed this request's answer JSON by now:
# its handlers do as they start, errors included, but for health, readiness and infer (until
# the body is parsed); a restricted API's refusal and a path no handler takes are never
# typed. An untyped answer carries libevhtp's default `text/plain`.
_TYPED = "turnout.typed"
# Model routes whose handlers do not type their answers as they start.
_UNTYPED_MODEL_KINDS = frozenset(("infer", "ready"))
_TEXT = {"Content-Type": "text/plain"}


class _InferPlan(NamedTuple):
    """What an infer request's path and headers decided, once they passed every check
    made before its body is read: a request with the same path and the same headers
    (one Head, so one Content-Length) needs only its body read."""

    head: Head
    name: str
    version: str
    json_length: int | None  # from Inference-Header-Content-Length and the body's length
    answer_encoding: str | None
    context: RequestContext  # for a request not traced


# Infer paths and heads remembered, at most this many (a client sends one of each).
_PLANS = 64


class _MethodNotAllowed(Exception):
    """Triton's 405 body; the methods the route takes go in the Allow header."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        super().__init__(", ".join(allowed))
        self.allowed = allowed


class _NotFound(Exception):
    pass


class _UnreadBody(Exception):
    """A body refused before it was read from a client waiting for `100 Continue`: the
    connection closes, since the client may never send the bytes its Content-Length
    promised."""

    def __init__(self, error: TurnoutError) -> None:
        self.error = error
        super().__init__(error.message)


class _Restricted(Exception):
    def __init__(self, restriction: Restriction) -> None:
        self.message = http_refusal(restriction)
        super().__init__(self.message)


# The API group (gateway.restrictions) of each kind of model route.
_MODEL_GROUPS = {
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "ready": "health",
    "config": "model-config",
    "stats": "statistics",
    "trace/setting": "trace",
    "": "metadata",
}


class _ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready, or while its
    body was being read."""


class Request:
    """What the front reads of one HTTP request: its scope, its method, its headers by
    lower-case name (ASGI servers give names lower-cased; of a repeated one, the first,
    as starlette's Headers) and its body's chunks. Made for every request, so it does
    no more than that."""

    __slots__ = ("headers", "method", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        # The gateway's own connection has read them; under another server, read them here.
        head: Head | None = scope.get(HEAD)
        self.headers: dict[str, str] = (head or Head.of(tuple(scope["headers"]))).by_name

    def header_pairs(self) -> list[tuple[str, str]]:
        """Every header, repeated ones included, in the order they came."""
        return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in self.scope["headers"]]

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks as the server hands them over (none empty)."""
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                raise _ClientGone
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return


class _Answer(Response):
    """A 200 whose headers are given as sent (lowercase names, bytes, no Content-Length):
    what an infer answer needs. The gateway's own connection writes it in one call; any
    other ASGI server gets its two messages."""

    def __init__(self, body: bytes, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = scope.get(EXCHANGE)
        if exchange is not None:
            await exchange.answer(200, self.raw_headers, self.body)
        else:
            headers = [*self.raw_headers, (b"content-length", str(len(self.body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})
        if self.background is not None:
            await self.background()


def _json(value: Any, status: int = 200) -> Response:
    return Response(json_compact(value), status_code=status, media_type=_JSON)


def _error(message: str, status: int, headers: dict[str, str] | None = None, typed: bool = True) -> Response:
    body = json_compact({"error": message})
    if typed:
        return Response(body, status_code=status, media_type=_JSON, headers=headers)
    return Response(body, status_code=status, headers={**_TEXT, **(headers or {})})


def _empty(status: int = 200, typed: bool = False) -> Response:
    return Response(status_code=status, media_type=_JSON) if typed else Response(status_code=status, headers=_TEXT)


def _need(request: Request, *methods: str) -> None:
    if request.method not in methods:
        raise _MethodNotAllowed(methods)


def _declared_length(request: Request) -> int | None:
    """The Content-Length (the connection's parser has checked that it is a number), None
    when chunked."""
    value = request.headers.get("content-length")
    return int(value) if value is not None else None


def _infer_too_large(request: Request, header: str | None, limit: int) -> TooLarge:
    """How Triton words an infer body over the limit, by what the body holds: all JSON,
    a JSON header of its own size (Inference-Header-Content-Length), or raw binary. Triton
    refuses the size as it parses the body, so the answer is typed."""
    try:
        json_length = int(header) if header is not None else None
    except ValueError:
        json_length = -1

    def refuse(size: int) -> TurnoutError:
        request.scope[_TYPED] = True
        if json_length is None:
            return json_too_large(size, limit)
        if json_length == 0:
            return raw_input_too_large(size, limit)
        if json_length > limit:
            return json_too_large(json_length, limit)  # the header alone is too large
        return request_too_large(size, limit)

    return refuse


async def _read(request: Request, limit: int, encoding: str | None, too_large: TooLarge) -> bytes:
    """The request body, never more than `limit` bytes of it held (encoding.read_body).
    What is left of a refused body, the connection reads and drops, so the client still gets
    the answer and the connection stays usable."""
    declared = _declared_length(request)
    exchange: Exchange | None = request.scope.get(EXCHANGE)
    if exchange is not None and encoding is None and (declared is None or declared <= limit):
        body = exchange.whole_body()  # most bodies have arrived with their head
        if body is not None:
            if len(body) > limit:  # chunked
                raise too_large(len(body))
            return body
    try:
        return await read_body(request.stream(), declared, encoding, limit, too_large)
    except TurnoutError as error:
        if declared is not None and declared > limit and request.headers.get("expect", "").lower() == "100-continue":
            raise _UnreadBody(error) from None
        raise


_T = TypeVar("_T")


class _Refusal:
    """A generate_stream request's error that no model sent: it was refused before it ran."""

    def __init__(self, error: TurnoutError) -> None:
        self.error = error


async def _while_connected(request: Request, work: Coroutine[Any, Any, _T]) -> _T:
    """Await `work` unless the client goes away first; then cancel it, which tells the
    sidecar to drop the request (the lane's CANCEL frame, or the gRPC call's cancel), and
    raise _ClientGone. The gateway's connections (gateway.http.protocol) say at once when
    a client leaves; under an ASGI server that does not (uvicorn's own protocols), `work`
    runs to its end."""
    exchange: Exchange | None = request.scope.get(EXCHANGE)
    if exchange is None:
        return await work
    handler = asyncio.current_task(exchange.connection.loop)  # given the loop: no getpid() call
    assert handler is not None
    if exchange.disconnected:
        work.close()
        raise _ClientGone
    exchange.on_gone = handler.cancel
    try:
        return await work
    except asyncio.CancelledError:
        # Only the connection's cancel means the client left; any other (shutdown) goes on up.
        if exchange.disconnected and handler.uncancel() == 0:
            raise _ClientGone from None
        raise
    finally:
        exchange.on_gone = None


_HTTP_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
_GENERATE_NOT_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)


class HttpFront:
    """Triton's HTTP API over one Gateway; `app` is the ASGI endpoint for every path."""

    def __init__(self, gateway: Gateway, settings: GatewaySettings) -> None:
        self._gateway = gateway
        self._settings = settings
        self._restrictions = parse_restrictions(settings.http_restricted_api)
        self._forward = HeaderForward(settings.http_header_forward_pattern)
        self._plans: Memo[tuple[bytes, int], _InferPlan] = Memo(_PLANS)

    async def _document(self, request: Request, required: bool = False) -> Any:
        """The request's JSON body, or None when the body is empty and not `required` (the
        trace and logging updates parse even an empty one, as Triton). As Triton, only an
        infer body is decompressed; any other is JSON as it came."""
        limit = self._settings.http_max_input_size
        body = await _read(request, limit, None, partial(json_too_large, limit=limit))
        if not required and not body.strip():
            return None
        # Strings may hold bytes that are not UTF-8: rapidjson takes them, so Triton answers
        # such a body as any other; here each becomes U+FFFD.
        document = parse_json(body, raw_strings=True)
        # Python reads a number too big for a double as infinity (or an integer of any
        # size); rapidjson refuses it. Unlike an infer body, asked of every document.
        refuse_too_big_number(body)
        return document if body.isascii() else as_utf8(document)

    def _allow(self, request: Request, group: str) -> None:
        """Refuse a restricted API unless the request carries its header and value."""
        restriction = self._restrictions.get(group)
        if restriction is not None and request.headers.get(restriction.key) != restriction.value:
            raise _Restricted(restriction)

    async def handle(self, request: Request) -> Response:
        response = await self._answer(request)
        trace: Trace | None = request.scope.get(_TRACE)
        if trace is not None:
            # Sent by starlette once returned; its background runs after the body is sent.
            trace.stamp(HTTP_SEND_START)
            response.background = BackgroundTask(_sent, trace)
        return response

    async def _answer(self, request: Request) -> Response:
        scope = request.scope
        raw_path = scope.get("raw_path")
        path = raw_path.decode("utf-8", errors="replace") if raw_path else scope["path"]
        path = path.partition("?")[0]
        scope[_TYPED] = True  # as most of Triton's handlers; _route says where not
        try:
            return await self._route(request, path)
        except TurnoutError as exc:
            headers = None
            if exc.message == "Unsupported compression type":
                headers = {"Accept-Encoding": "gzip, deflate"}
            elif exc.message.endswith(QUEUE_FULL_SUFFIX):
                headers = {"Retry-After": RETRY_AFTER_SECS}  # overload: tell the client when to come back
            return _error(exc.message, exc.http_status, headers, scope[_TYPED])
        except _UnreadBody as exc:
            return _error(exc.error.message, exc.error.http_status, {"Connection": "close"}, scope[_TYPED])
        except _MethodNotAllowed as exc:
            return _error("Method Not Allowed", 405, {"Allow": ", ".join(exc.allowed)}, scope[_TYPED])
        except _Restricted as exc:
            return _error(exc.message, 403, typed=False)
        except _NotFound:
            return _error("Not Found", 404, typed=False)
        except _ClientGone:  # gone while we waited for its answer or its body
            logger.info("HTTP %s %s: the client went away; its request was cancelled", request.method, path)
            return _error("Request cancelled", 400)  # written nowhere: the connection drops it
        except Exception as exc:  # the client still gets Triton's error shape
            logger.exception("HTTP %s %s failed", request.method, path)
            return _error(f"internal error: {exc}", 500, typed=scope[_TYPED])

    async def _route(self, request: Request, path: str) -> Response:
        scope = request.scope
        head = scope.get(HEAD)
        plan = self._plans.get((scope["raw_path"], id(head))) if head is not None else None
        if plan is not None and plan.head is head and request.method == "POST":
            scope[_TYPED] = False
            return await self._infer(request, plan.name, plan.version, plan)
        if path == "/v2/models/stats":
            self._allow(request, "statistics")
            _need(request, "GET")
            return await self._statistics("", "")
        if path == "/v2/logging":
            self._allow(request, "logging")
            return await self._logging(request)
        if match := _MODEL.fullmatch(path):
            name, version, kind = match.group(1), match.group(2) or "", match.group(3) or ""
            self._allow(request, _MODEL_GROUPS[kind])
            request.scope[_TYPED] = kind not in _UNTYPED_MODEL_KINDS
            return await self._model(request, name, version, kind)
        if match := _SERVER.fullmatch(path):
            self._allow(request, "metadata" if match.group(1) is None else "health")
            request.scope[_TYPED] = match.group(1) is None  # metadata; health is untyped
            return await self._server(request, match.group(1))
        if match := _SYSTEM_SHM.fullmatch(path):
            self._allow(request, "shared-memory")
            return await self._system_shm(request, match.group(1) or "", match.group(2))
        if match := _CUDA_SHM.fullmatch(path):
            self._allow(request, "shared-memory")
            return await self._cuda_shm(request, match.group(1) or "", match.group(2))
        if match := _REPOSITORY.fullmatch(path):
            self._allow(request, "model-repository")
            return await self._repository(request, match.group(1), match.group(3), match.group(4))
        if path == _TRACE_PATH:
            self._allow(request, "trace")
            return await self._trace(request, "")
        raise _NotFound

    # --- server ---

    async def _server(self, request: Request, kind: str | None) -> Response:
        _need(request, "GET")
        if kind is None:
            return _json(messages.server_metadata(self._gateway.server_metadata()))
        ok = await (self._gateway.server_live() if kind == "live" else self._gateway.server_ready())
        return _empty(200 if ok else 400)

    # --- models ---

    async def _model(self, request: Request, name: str, version: str, kind: str) -> Response:
        if kind == "infer":
            _need(request, "POST")
            return await self._infer(request, name, version)
        if kind == "trace/setting":
            return await self._trace(request, name)
        if kind in ("generate", "generate_stream"):
            _need(request, "POST")
            return await self._generate(request, name, version, stream=kind == "generate_stream")
        _need(request, "GET")
        if kind == "ready":
            if await self._gateway.model_ready(ModelReadyRequest(name=name, version=version)):
                return _empty()
            return _error("Model version not ready", 400, typed=False)
        if kind == "config":
            response = await self._gateway.model_config(ModelConfigRequest(name=name, version=version))
            return _json(messages.model_config(response.config))
        if kind == "stats":
            return await self._statistics(name, version)
        metadata = await self._gateway.model_metadata(ModelMetadataRequest(name=name, version=version))
        return _json(messages.model_metadata(metadata))

    async def _statistics(self, name: str, version: str) -> Response:
        response = await self._gateway.model_statistics(ModelStatisticsRequest(name=name, version=version))
        return _json(messages.statistics(response))

    async def _infer(self, request: Request, name: str, version: str, plan: _InferPlan | None = None) -> Response:
        trace = self._gateway.tracer.sample(name, request.headers)
        if trace is not None:
            trace.stamp(HTTP_RECV_START)
            request.scope[_TRACE] = trace  # `handle` stamps the send, whatever the answer
        try:
            if plan is not None:
                infer_request, rendering = await self._planned_request(request, plan)
            else:
                infer_request, rendering = await self._infer_request(request, name, version)
        except TurnoutError:
            # Triton looks the model up before it reads the body: its refusal comes first.
            # Asked only here, so a well-formed request pays no extra round trip for it.
            await self._refuse_model(request, name, version)
            raise
        except _UnreadBody:
            try:
                await self._refuse_model(request, name, version)
            except TurnoutError as refusal:
                raise _UnreadBody(refusal) from None
            raise
        if trace is not None:
            trace.stamp(HTTP_RECV_END)
        if self._forward:  # as Triton: once the request is parsed, before it runs
            set_parameters(infer_request, self._forward.matching(request.header_pairs()))
        # Routing reads its sticky key in the headers (by lower-case name).
        context = plan.context if plan is not None and trace is None else RequestContext(request.headers, trace=trace)
        try:
            encoded = await _while_connected(request, self._gateway.infer(infer_request, None, context))
        except TurnoutError as exc:
            if exc.cause is Cause.UNKNOWN_MODEL:
                request.scope[_TYPED] = False  # Triton looks the model up before it parses the body
            elif exc.cause is Cause.DECOUPLED:
                request.scope[_TYPED] = False
                raise unsupported(_HTTP_DECOUPLED) from None
            raise
        content, binary_header = render_encoded(encoded, rendering)
        if trace is not None:
            trace.stamp(INFER_RESPONSE_COMPLETE)
        headers: list[tuple[bytes, bytes]] = []
        if binary_header is not None:
            media_type = b"application/octet-stream"
            headers.append((b"inference-header-content-length", str(binary_header).encode()))
        else:
            media_type = _JSON_BYTES
        if plan is not None:
            encoding = plan.answer_encoding
        else:
            encoding = response_encoding(request.headers.get("accept-encoding"))
            if trace is None:
                self._learn(request, name, version, encoding, context)
        if encoding is not None:
            content = compress(content, encoding)
            headers.append((b"content-encoding", encoding.encode()))
        headers.append((b"content-type", media_type))
        return _Answer(content, headers)

    def _learn(self, request: Request, name: str, version: str, encoding: str | None, context: RequestContext) -> None:
        """Remember what an infer request answered without an error decided before its
        body was read, when a request with its path and headers will decide the same: its
        body not compressed, its length given in its head, no header forwarded."""
        head: Head | None = request.scope.get(HEAD)
        declared = _declared_length(request)
        if head is None or declared is None or self._forward or "content-encoding" in request.headers:
            return
        json_length = header_length(request.headers.get(INFER_HEADER), declared)
        plan = _InferPlan(head, name, version, json_length, encoding, context)
        self._plans.remember((request.scope["raw_path"], id(head)), plan)

    async def _planned_request(self, request: Request, plan: _InferPlan) -> tuple[ModelInferRequest, OutputRendering]:
        """_infer_request for a request whose path and headers were planned: only its
        body is read and parsed."""
        exchange: Exchange | None = request.scope.get(EXCHANGE)
        body = exchange.whole_body() if exchange is not None else None
        if body is None:
            return await self._infer_request(request, plan.name, plan.version)
        request.scope[_TYPED] = True
        return self._parsed(body, plan.json_length, plan.name, plan.version)

    async def _infer_request(
        self, request: Request, name: str, version: str
    ) -> tuple[ModelInferRequest, OutputRendering]:
        """The infer body read and parsed, in Triton's order of checks: the encoding, the
        header length's range, the body's size, then its contents."""
        limit = self._settings.http_max_input_size
        encoding = check_encoding(request.headers.get("content-encoding"))
        header = request.headers.get(INFER_HEADER)
        declared = _declared_length(request)
        if encoding is None and declared is not None:
            header_length(header, declared)  # Triton checks the header's range before the body's size
        body = await _read(request, limit, encoding, _infer_too_large(request, header, limit))
        json_length = header_length(header, len(body))
        request.scope[_TYPED] = True  # Triton's errors from parsing the body on are typed
        return self._parsed(body, json_length, name, version)

    def _parsed(
        self, body: bytes, json_length: int | None, name: str, version: str
    ) -> tuple[ModelInferRequest, OutputRendering]:
        """The request of an infer body whose JSON header's length is known."""
        if json_length == 0:
            # The raw binary form names no input: gateway.core gives it the model's only one.
            return raw_binary_request(body, name, version)
        limit = self._settings.http_max_input_size
        return parse_infer_request(body, json_length, name, version, limit, self._gateway.locate_shared_memory)

    async def _refuse_model(self, request: Request, name: str, version: str) -> None:
        """Raise what Triton answers an HTTP infer for this model before it reads the
        body, untyped as Triton answers it: an unknown model or version, or a decoupled model."""
        try:
            answer = await self._gateway.model_config(ModelConfigRequest(name=name, version=version))
            if answer.config.model_transaction_policy.decoupled:
                raise unsupported(_HTTP_DECOUPLED)
        except TurnoutError:
            request.scope[_TYPED] = False
            raise

    async def _generate(self, request: Request, name: str, version: str, stream: bool) -> Response:
        """Triton's generate extension: a flat JSON body in, the response as flat JSON; with
        `stream`, each response of the model (a decoupled one sends several) as one
        server-sent event, an error as an event with an `error` key."""
        # Triton's order: the model first, then the encoding (generate takes no compressed
        # body), then the body.
        answer = await self._gateway.model_config(ModelConfigRequest(name=name, version=version))
        if request.headers.get("content-encoding", "identity") not in ("", "identity"):
            raise invalid_arg("Unsupported content-encoding, only 'identity' is supported.")
        document = await self._document(request, required=True)
        limit = self._settings.http_max_input_size
        infer_request = generate_request(document, name, version, answer.config, limit)
        context = RequestContext(request.headers)
        if not stream:
            parts: list[bytes | TurnoutError] = []
            last: bytes | TurnoutError
            try:
                last = await _while_connected(
                    request, self._gateway.infer(infer_request, None, replace(context, responses=parts.append))
                )
            except TurnoutError as exc:
                if exc.cause is not Cause.RESPONSE:  # refused before it ran: an error as any other
                    raise
                last = exc  # the model's error response, its last
            answers = [*parts, last] if last else parts
            # Triton's status is set by the first response: 400 when it is an error.
            status = 400 if answers and isinstance(answers[0], TurnoutError) else 200
            if len(answers) != 1:
                return _error(_GENERATE_NOT_ONE, status)  # Triton's words, as the body
            if isinstance(answers[0], TurnoutError):
                return _error(answers[0].message, status)
            return _json(generate_response(ModelInferResponse.FromString(answers[0])))
        events: asyncio.Queue[bytes | TurnoutError | _Refusal | None] = asyncio.Queue()

        async def run() -> None:
            try:
                last = await self._gateway.infer(infer_request, None, replace(context, responses=events.put_nowait))
                if last:
                    events.put_nowait(last)
            except TurnoutError as exc:
                # Refused before it ran, or the model's own last word.
                events.put_nowait(exc if exc.cause is Cause.RESPONSE else _Refusal(exc))
            finally:
                events.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            first = await _while_connected(request, events.get())
        except BaseException:
            task.cancel()
            raise
        if isinstance(first, _Refusal):
            # Refused before it ran: Triton answers that as any request, not as a stream.
            raise first.error

        async def send() -> AsyncIterator[bytes]:
            event: bytes | TurnoutError | _Refusal | None = first
            try:
                while event is not None:
                    if isinstance(event, (TurnoutError, _Refusal)):
                        error = event.error if isinstance(event, _Refusal) else event
                        body: dict[str, Any] = {"error": error.message}
                    else:
                        body = generate_response(ModelInferResponse.FromString(event))
                    yield b"data: " + json_compact(body) + b"\n\n"
                    event = await events.get()
            finally:
                task.cancel()  # the client left before the model finished

        # Triton's status is set by the first response: 400 when it is an error.
        status = 400 if isinstance(first, TurnoutError) else 200
        return StreamingResponse(send(), status_code=status, media_type="text/event-stream")

    # --- repository ---

    async def _repository(
        self, request: Request, repository: str | None, model: str | None, action: str | None
    ) -> Response:
        _need(request, "POST")
        if repository:
            raise unsupported("'repository_name' specification is not supported")
        document = await self._document(request)
        if model is not None and action == "unload":
            await self._gateway.unload_model(messages.unload_request(model, document))
            return _empty(typed=True)
        if model is None:
            index = RepositoryIndexRequest()
            if isinstance(document, dict) and "ready" in document:
                ready = document["ready"]
                if type(ready) is not bool:  # current Triton's words (2.51 said TritonJson's, with a 500)
                    raise invalid_arg("Invalid value for 'ready': expected a boolean")
                index.ready = ready
            response = await self._gateway.repository_index(index)
            return _json(messages.repository_index(response))
        await self._gateway.load_model(messages.load_request(model, document))
        return _empty(typed=True)

    # --- shared memory ---

    async def _system_shm(self, request: Request, region: str, action: str) -> Response:
        if action == "status":
            _need(request, "GET")
            status = self._gateway.system_shm_status(SystemSharedMemoryStatusRequest(name=region))
            return _json(messages.system_shm_status(status))
        _need(request, "POST")
        self._gateway.check_client_shm()
        if action == "register":
            if not region:
                raise invalid_arg("'region name' is necessary to register system shared memory region")
            document = await self._document(request, required=True)
            await self._gateway.system_shm_register(messages.system_shm_register(region, document))
        else:
            await self._gateway.system_shm_unregister(SystemSharedMemoryUnregisterRequest(name=region))
        return _empty(typed=True)

    async def _cuda_shm(self, request: Request, region: str, action: str) -> Response:
        if action == "status":
            _need(request, "GET")
            status = self._gateway.cuda_shm_status(CudaSharedMemoryStatusRequest(name=region))
            return _json(messages.cuda_shm_status(status))
        _need(request, "POST")
        self._gateway.check_client_shm()
        if action == "register":
            if not region:
                raise invalid_arg("'region name' is necessary to register cuda shared memory region")
            await self._gateway.cuda_shm_register(messages.cuda_shm_register(region, await self._document(request)))
        else:
            await self._gateway.cuda_shm_unregister(CudaSharedMemoryUnregisterRequest(name=region))
        return _empty(typed=True)

    # --- trace and logging ---

    async def _trace(self, request: Request, model: str) -> Response:
        _need(request, "GET", "POST")
        await self._gateway.check_trace_model(model)
        if request.method == "GET":
            trace = TraceSettingRequest(model_name=model)
        else:
            trace = messages.trace_request(model, await self._document(request, required=True))
        return _json(messages.trace_settings(await self._gateway.trace_setting(trace, checked=True)))

    async def _logging(self, request: Request) -> Response:
        _need(request, "GET", "POST")
        get = request.method == "GET"
        log = LogSettingsRequest() if get else messages.log_request(await self._document(request, required=True))
        answer = await self._gateway.log_settings(log)
        await self._gateway.forward_log_settings(log)
        return _json(messages.log_settings(answer))


async def _sent(trace: Trace) -> None:
    trace.stamp(HTTP_SEND_END)
    trace.finish()


class HttpApp:
    """The ASGI app serving Triton's HTTP API. Routing is Triton's own, on the raw path
    (model names are not URL-decoded), so every request goes straight to the front end:
    no framework router or middleware between the connection (gateway.http.protocol) and
    `HttpFront.handle`, which answers every error itself. Only HTTP is served (uvicorn's
    server runs without lifespan and websockets)."""

    def __init__(self, front: HttpFront) -> None:
        self._front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        response = await self._front.handle(Request(scope, receive))
        await response(scope, receive, send)


def build_http_app(gateway: Gateway, settings: GatewaySettings) -> HttpApp:
    return HttpApp(HttpFront(gateway, settings))
