"""A gRPC server that runs on the gateway's own event loop, over our own HTTP/2 (gateway.http2).

grpc.aio hands every call between grpc's core threads and the event loop; on a small host
that hand-off is most of a call's cost (about ten context switches and three tasks a call).
This server reads and answers calls where their bytes arrive, one task a call, and serves
the same method handlers (`grpc.RpcMethodHandler`, as gateway.grpc_front builds them) with
a context that answers what those handlers ask of grpc.aio's. What it speaks is gRPC over
HTTP/2 as grpc's own servers speak it: messages with their 5-byte prefixes, gzip and
deflate both ways, `grpc-timeout`, metadata (`-bin` keys in base64), trailers-only
answers, a client's RST_STREAM cancelling its call, flow control both ways, GOAWAY in two
steps before a graceful stop, and Triton's transport flags (`Transport`: keepalive PINGs,
the client's PINGs policed, a connection's age). TLS is grpc.aio's to serve
(gateway.grpc_front.build_grpc_server picks).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import random
import socket
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, NamedTuple

import grpc

from gateway import http2
from protos.memo import Memo
from protos.rpc import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

# Per stream and per connection: what a client may send before it waits for our
# WINDOW_UPDATE. Large enough that a 1 MiB tensor crosses without waiting on a round trip.
_STREAM_WINDOW = 4 << 20
_CONNECTION_WINDOW = 64 << 20
_MAX_FRAME = 1 << 20  # the largest frame we accept (what we send follows the client's setting)
# A bidi stream's messages read and not yet taken by its handler, past which the client's
# data is left unacknowledged: its flow control then holds it back, not our memory.
_QUEUED_MESSAGES = 16

_RESPONSE_HEAD = (
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", b"identity,deflate,gzip"),
)
# Every answer's head, encoded once: as it is, and saying its messages are compressed.
_HEAD: dict[bytes | None, bytes] = {None: http2.encode_headers(_RESPONSE_HEAD)}
_HEAD.update({e: http2.encode_headers((*_RESPONSE_HEAD, (b"grpc-encoding", e))) for e in (b"gzip", b"deflate")})
_OK_TRAILERS = http2.encode_headers(((b"grpc-status", b"0"),))
# Request headers that are the transport's, not the call's metadata (grpc hands the
# application the rest, user-agent included, in the order they came).
_TRANSPORT_HEADERS = frozenset(
    {b"te", b"content-type", b"grpc-encoding", b"grpc-accept-encoding", b"grpc-timeout", b"grpc-message-type"}
)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# The PING that follows a first GOAWAY: once it is acknowledged, every stream the client
# opened before it saw that GOAWAY has arrived, and the final GOAWAY can name the last.
_GOAWAY_PING = b"goaway\x00\x00"
_GOAWAY_PING_TIMEOUT = 20.0  # past this unanswered, the final GOAWAY goes anyway
_CLOSE_AFTER_GRACE = 1.0  # a connection past its age and grace, its calls ended, closes within this
_PING_ID = struct.Struct(">Q")
# What grpc reads as "never" for a keepalive time (INT_MAX milliseconds).
_NEVER = (2**31 - 1) / 1000


class Transport(NamedTuple):
    """Triton's gRPC transport flags (`--grpc-keepalive-*`, `--grpc-http2-*`,
    `--grpc-max-connection-age*`), in seconds, as grpc's servers apply them; Triton's
    defaults.

    Keepalive: a connection with calls open (or any, with `keepalive_permit_without_calls`)
    is sent a PING every `keepalive_time`, and closed when one goes unacknowledged for
    `keepalive_timeout`. The client's PINGs are policed as http2.PingPolicy says. A
    connection older than `max_connection_age` (give or take 10%) is told GOAWAY
    "max_age", and closed once its calls are over or `max_connection_age_grace` has passed
    (None: no limit). (`--grpc-http2-max-pings-without-data` bounds a client's own PINGs;
    grpc's servers send keepalive PINGs without regard to it, and so does this one.)"""

    keepalive_time: float = 7200.0
    keepalive_timeout: float = 20.0
    keepalive_permit_without_calls: bool = False
    min_recv_ping_interval_without_data: float = 300.0
    max_ping_strikes: int = 2
    max_connection_age: float | None = None
    max_connection_age_grace: float | None = None

    @property
    def pings(self) -> http2.PingPolicy:
        return http2.PingPolicy(
            self.min_recv_ping_interval_without_data, self.max_ping_strikes, self.keepalive_permit_without_calls
        )


TRITON_DEFAULTS = Transport()


class _Details(NamedTuple):
    """What grpc.GenericRpcHandler.service is asked (grpc.HandlerCallDetails)."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class _Ended(Exception):
    """The call is over: its status is set, or its client has gone."""


def _percent_encoded(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as it is, every other byte %XX."""
    raw = text.encode()
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def _timeout(value: bytes) -> float | None:
    """A grpc-timeout value (up to 8 digits and a unit) in seconds; None when malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


class _Head(NamedTuple):
    """What a call's request headers say, as the server reads them."""

    path: bytes
    content_type: bytes
    timeout: float | None  # seconds
    encoding: bytes
    accepts: bytes
    metadata: tuple[tuple[str, str | bytes], ...]

    @classmethod
    def of(cls, headers: tuple[tuple[bytes, bytes], ...]) -> _Head:
        path = content_type = accepts = b""
        timeout = None
        encoding = b"identity"
        for key, value in headers:
            if key == b":path":
                path = value
            elif key == b"content-type":
                content_type = value
            elif key == b"grpc-timeout":
                timeout = _timeout(value)
            elif key == b"grpc-encoding":
                encoding = value
            elif key == b"grpc-accept-encoding":
                accepts = value
        return cls(path, content_type, timeout, encoding, accepts, _metadata(headers))


# A client's calls of one method send the same headers again and again (gateway.http2
# hands such a block's headers over as one tuple): each is read once.
_heads: Memo[tuple[tuple[bytes, bytes], ...], _Head] = Memo(64)


def _metadata(headers: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    pairs: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key[:1] == b":" or key in _TRANSPORT_HEADERS:
            continue
        name = key.decode("latin-1")
        if name.endswith("-bin"):
            pairs.append((name, base64.b64decode(value + b"=" * (-len(value) % 4))))
        else:
            pairs.append((name, value.decode("latin-1")))
    return tuple(pairs)


def _trailers(code: grpc.StatusCode, details: str, trailing: Any, head_sent: bool) -> bytes:
    """A call's status and trailing metadata, encoded; with the response head first when
    no head was sent (trailers-only)."""
    fields = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        fields.append((b"grpc-message", _percent_encoded(details)))
    for key, value in trailing:
        if isinstance(value, bytes):
            fields.append((key.encode(), base64.b64encode(value).rstrip(b"=")))
        else:
            fields.append((key.encode(), value.encode()))
    if not head_sent:
        fields[:0] = _RESPONSE_HEAD
    return http2.encode_headers(fields)


def _compress(data: bytes, encoding: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=31 if encoding == b"gzip" else 15)
    return compressor.compress(data) + compressor.flush()


class _Context:
    """A call's side of grpc.aio.ServicerContext: what the handlers read and set."""

    def __init__(self, call: _Call) -> None:
        self._call = call

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._call.metadata

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def peer(self) -> str:
        return self._call.connection.peer

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self._call.code, self._call.details = code, details
        self._call.trailing = tuple(trailing_metadata or ())
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._call.code = code

    def set_details(self, details: str) -> None:
        self._call.details = details

    def code(self) -> grpc.StatusCode | None:
        return self._call.code

    def details(self) -> str:
        return self._call.details

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._call.trailing = tuple(trailing_metadata)

    def add_done_callback(self, callback: Callable[[_Context], None]) -> None:
        self._call.done_callbacks.append(callback)

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._call.ended


class _Call:
    """One stream: its request's headers, the bytes of messages not yet whole, and what is
    still to be sent of its answer while the client's window is closed."""

    __slots__ = (
        "buffer",
        "cancelled",
        "code",
        "connection",
        "deadline",
        "details",
        "done_callbacks",
        "drained",
        "encoding",
        "ended",
        "handler",
        "head_sent",
        "messages",
        "metadata",
        "method",
        "pending",
        "request",
        "respond_encoding",
        "stream_id",
        "task",
        "timer",
        "trailers",
        "trailing",
        "unacknowledged",
    )

    def __init__(self, connection: _Connection, method: str, stream_id: int, handler: grpc.RpcMethodHandler) -> None:
        self.connection = connection
        self.method = method
        self.stream_id = stream_id
        self.handler = handler
        self.metadata: tuple[tuple[str, str | bytes], ...] = ()
        self.deadline: float | None = None
        self.encoding = b"identity"
        self.respond_encoding: bytes | None = None
        self.buffer = bytearray()
        self.messages: asyncio.Queue[bytes | None] | None = None
        self.request: bytes | None = None
        self.unacknowledged = 0
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple[tuple[str, str | bytes], ...] = ()
        self.done_callbacks: list[Callable[[_Context], None]] = []
        self.cancelled = False
        self.ended = False
        self.head_sent = False
        self.pending = bytearray()
        self.trailers: bytes | None = None  # encoded, waiting for the answer's last bytes
        self.drained: asyncio.Event | None = None


class _Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._http2 = http2.Connection(
            self,
            stream_window=_STREAM_WINDOW,
            connection_window=_CONNECTION_WINDOW,
            max_frame=_MAX_FRAME,
            pings=server.transport.pings,
        )
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, _Call] = {}
        self._flush_scheduled = False
        self.peer = ""
        self.closing = False  # a GOAWAY sent or received: no new calls
        self._goaway_sent = False
        self._goaway_debug = b""
        self._final_goaway = False  # the GOAWAY naming the last stream is still to be sent
        self.aged = False  # past its age: closed once idle
        self._timers: dict[str, asyncio.TimerHandle] = {}  # by purpose, at most one each
        self._pings_sent = 0

    # -- transport ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        host, port = transport.get_extra_info("peername")[:2]
        self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self._server.connections.add(self)
        self._flush()  # our SETTINGS
        settings = self._server.transport
        if settings.keepalive_time < _NEVER:
            self._later("keepalive", settings.keepalive_time, self._keepalive)
        if settings.max_connection_age is not None:
            self._later("age", settings.max_connection_age * random.uniform(0.9, 1.1), self._age)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        for timer in self._timers.values():
            timer.cancel()
        calls = list(self._calls.values())
        self._calls.clear()
        for call in calls:
            call.cancelled = True
            call.ended = True
            self._cancel(call)
            self._done(call)

    def pause_writing(self) -> None:
        # The client is not reading what we send (PING and SETTINGS acknowledgements, answers
        # outside flow control): what it sends waits in the socket until it does.
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        try:
            self._http2.receive(data)
        except http2.ConnectionFault as fault:
            logger.debug("gRPC connection from %s closed: %s", self.peer, fault)
            if fault.code == http2.ENHANCE_YOUR_CALM:
                self._end_calls("Too many pings")  # as grpc's servers end them
            else:
                self.close()
            return
        if self._final_goaway and _GOAWAY_PING not in self._http2.pings_unanswered:
            self._goaway_final()
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self._http2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _schedule_flush(self) -> None:
        # Answers finishing in one turn of the loop leave in one write.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def goaway(self, debug: bytes = b"") -> None:
        """Tells the client to open no more calls here; those open go on. As grpc's servers
        do, in two steps: a GOAWAY that names no last stream, with a PING; once the PING is
        acknowledged, the client has seen the GOAWAY, and a second one names the last
        stream it opened (what it opens past that is not served, and it retries elsewhere)."""
        self.closing = True
        if not self._goaway_sent:
            self._goaway_sent = self._final_goaway = True
            self._goaway_debug = debug
            self._http2.goaway(last_stream_id=http2.LAST_STREAM, debug=debug)
            self._http2.ping(_GOAWAY_PING)
            self._later("goaway", _GOAWAY_PING_TIMEOUT, self._goaway_unanswered)
        self._flush()

    def _goaway_final(self) -> None:
        self._final_goaway = False
        self._http2.goaway(debug=self._goaway_debug)
        if self.aged_out:
            self.close()

    def _goaway_unanswered(self) -> None:
        if self._final_goaway and self._transport is not None:
            self._goaway_final()
            self._flush()

    @property
    def aged_out(self) -> bool:
        """Past its age, told so in full, and no call open: to be closed."""
        return self.aged and not self._final_goaway and not self._calls

    # -- keepalive and age -----------------------------------------------------------

    def _later(self, purpose: str, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self._timers[purpose] = self._loop.call_later(delay, callback, *args)

    def _keepalive(self) -> None:
        if self._transport is None:
            return
        settings = self._server.transport
        if self._calls or settings.keepalive_permit_without_calls:
            self._pings_sent += 1
            payload = _PING_ID.pack(self._pings_sent)
            self._http2.ping(payload)
            self._flush()
            self._later("keepalive", settings.keepalive_timeout, self._keepalive_due, payload)
        else:
            self._later("keepalive", settings.keepalive_time, self._keepalive)

    def _keepalive_due(self, payload: bytes) -> None:
        if self._transport is None:
            return
        settings = self._server.transport
        if payload in self._http2.pings_unanswered:
            logger.debug("gRPC connection from %s closed: keepalive watchdog timeout", self.peer)
            self._transport.abort()
            return
        self._later("keepalive", max(settings.keepalive_time - settings.keepalive_timeout, 0.0), self._keepalive)

    def _age(self) -> None:
        if self._transport is None:
            return
        self.aged = True
        self.goaway(b"max_age")
        grace = self._server.transport.max_connection_age_grace
        if grace is not None:
            self._later("grace", grace, self._grace_over)

    def _grace_over(self) -> None:
        # The client, its calls ended and told GOAWAY, closes the connection itself; closed
        # at once here, what it still sent could reset the connection and lose the trailers.
        self._end_calls("max connection age", close=False)
        self._later("close", _CLOSE_AFTER_GRACE, self.close)

    def _end_calls(self, details: str, close: bool = True) -> None:
        """Ends every open call with UNAVAILABLE `details`, then (with `close`) the connection."""
        for call in list(self._calls.values()):
            self._finish(call, grpc.StatusCode.UNAVAILABLE, details)
        if close:
            self.close()
        else:
            self._flush()

    def close(self) -> None:
        """Closes the connection once what is to be sent has been written."""
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # -- what the HTTP/2 connection reads -------------------------------------------

    def on_window(self, stream_id: int) -> None:
        self._resume(stream_id)

    def on_goaway(self) -> None:
        self.closing = True

    @property
    def idle(self) -> bool:
        return not self._calls

    # -- requests ----------------------------------------------------------------

    def on_headers(self, stream_id: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        head = _heads.get(headers)
        if head is None:
            head = _heads.remember(headers, _Head.of(headers))
        path, content_type, timeout, encoding, accepts, metadata = head
        if not content_type.startswith(b"application/grpc"):
            self._http2.send_headers(stream_id, http2.encode_headers(((b":status", b"415"),)), end_stream=True)
            return
        method = path.decode("latin-1")
        handler = self._server.handler(method, metadata)
        call = _Call(self, method, stream_id, handler)
        self._calls[stream_id] = call
        call.metadata = metadata
        call.encoding = encoding
        compression = self._server.compression
        if compression is not None and method in self._server.compressed and compression in accepts:
            call.respond_encoding = compression
        if handler is None:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if encoding not in (b"identity", b"gzip", b"deflate"):
            self._finish(
                call,
                grpc.StatusCode.UNIMPLEMENTED,
                f"Compression algorithm '{encoding.decode('latin-1')}' is disabled.",
            )
            return
        if timeout is not None:
            call.deadline = time.monotonic() + timeout
            call.timer = self._loop.call_later(timeout, self._expire, call)
        if handler.request_streaming:
            # Its handler starts with its first message (or the client's end of sending):
            # grpc's aio client, still writing when a call ends at once, reports INTERNAL.
            call.messages = asyncio.Queue()

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.ended:
            self._http2.acknowledge(stream_id, flow_length)
            return
        streaming = call.messages is not None
        if streaming:
            call.unacknowledged += flow_length
        else:
            self._http2.acknowledge(stream_id, flow_length)
        # Messages are cut from the data itself (a unary request's usually comes whole in
        # one DATA frame), or from the bytes held from frames before once one is whole.
        buffer = call.buffer
        held = bool(buffer)
        if held:
            buffer += data
        source = buffer if held else data
        at = 0
        end = len(source)
        while end - at >= 5:
            length = int.from_bytes(source[at + 1 : at + 5], "big")
            if length > self._server.max_receive:
                # Refused from its prefix, before its bytes are held.
                self._finish(
                    call,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self._server.max_receive})",
                )
                return
            stop = at + 5 + length
            if stop > end:
                break
            compressed = source[at]
            message = bytes(memoryview(buffer)[at + 5 : stop]) if held else data[at + 5 : stop]
            at = stop
            if compressed:
                try:
                    message = self._decompressed(call, message)
                except _Ended:
                    return
            if streaming:
                call.messages.put_nowait(message)  # type: ignore[union-attr]
                if call.task is None:
                    call.task = self._loop.create_task(self._run(call))
            elif call.request is None:
                call.request = message
            else:
                self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "Too many requests for a unary call")
                return
        if held:
            del buffer[:at]
        elif at < end:
            buffer += memoryview(data)[at:]  # the start of a message still arriving
        if streaming:
            self._acknowledge(call)

    def _decompressed(self, call: _Call, message: bytes) -> bytes:
        if call.encoding == b"identity":
            self._finish(call, grpc.StatusCode.INTERNAL, "Compressed message with no grpc-encoding")
            raise _Ended
        try:
            data = zlib.decompressobj(wbits=47 if call.encoding == b"gzip" else 15)
            result = data.decompress(message, self._server.max_receive + 1)
        except zlib.error:
            self._finish(call, grpc.StatusCode.INTERNAL, "Failed to decompress message")
            raise _Ended from None
        if len(result) > self._server.max_receive:
            self._finish(
                call,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max (more than {self._server.max_receive} bytes once decompressed)",
            )
            raise _Ended
        return result

    def _acknowledge(self, call: _Call) -> None:
        if call.unacknowledged and call.messages is not None and call.messages.qsize() < _QUEUED_MESSAGES:
            self._http2.acknowledge(call.stream_id, call.unacknowledged)
            call.unacknowledged = 0

    def on_end(self, stream_id: int) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        if call.ended:
            return
        if call.messages is not None:
            if call.buffer:
                self._finish(call, grpc.StatusCode.INTERNAL, "Incomplete message")
                return
            call.messages.put_nowait(None)
            if call.task is None:
                call.task = self._loop.create_task(self._run(call))
        elif call.request is None or call.buffer:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "Missing request message")
        else:
            call.task = self._loop.create_task(self._run(call))

    def on_reset(self, stream_id: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is not None and not call.ended:
            call.cancelled = True
            call.ended = True
            self._cancel(call)
            self._done(call)

    def _expire(self, call: _Call) -> None:
        call.timer = None
        if call.ended:
            return
        self._cancel(call)
        self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _cancel(self, call: _Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.drained is not None:
            call.drained.set()

    # -- running a call ----------------------------------------------------------

    async def _requests(self, call: _Call) -> AsyncIterator[Any]:
        deserialize = call.handler.request_deserializer
        messages = call.messages
        assert messages is not None
        while (message := await messages.get()) is not None:
            self._acknowledge(call)
            self._schedule_flush()
            yield deserialize(message) if deserialize else message

    async def _run(self, call: _Call) -> None:
        handler = call.handler
        context = _Context(call)
        deserialize = handler.request_deserializer
        serialize = handler.response_serializer
        code, details = grpc.StatusCode.OK, ""
        try:
            if handler.request_streaming:
                request: Any = self._requests(call)
            else:
                request = deserialize(call.request) if deserialize else call.request
                call.request = None
            if handler.response_streaming:
                behaviour = handler.stream_stream if handler.request_streaming else handler.unary_stream
                async for response in behaviour(request, context):
                    await self._send_message(call, serialize(response) if serialize else response)
            else:
                behaviour = handler.stream_unary if handler.request_streaming else handler.unary_unary
                response = behaviour(request, context)
                if inspect.isawaitable(response):
                    response = await response
                self._send_message_now(call, serialize(response) if serialize else response)
        except grpc.aio.AbortError:
            code, details = call.code or grpc.StatusCode.UNKNOWN, call.details
        except _Ended:
            return
        except asyncio.CancelledError:
            return  # reset by the client, past its deadline, or the server stopping
        except Exception as exc:
            logger.exception("%s failed", call.method)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        else:
            if call.code is not None:
                code, details = call.code, call.details
        if not call.ended:
            self._finish(call, code, details)

    def _send_message_now(self, call: _Call, payload: bytes) -> None:
        if call.ended:
            raise _Ended
        connection = self._http2
        stream_id = call.stream_id
        if call.respond_encoding is not None:
            payload = _compress(payload, call.respond_encoding)
            prefix = b"\x01" + len(payload).to_bytes(4, "big")
        else:
            prefix = b"\x00" + len(payload).to_bytes(4, "big")
        try:
            if not call.head_sent:
                call.head_sent = True
                connection.send_headers(stream_id, _HEAD[call.respond_encoding])
            data = prefix + payload
            if not call.pending and len(data) <= connection.window(stream_id):
                connection.send_data(stream_id, data)
                self._schedule_flush()
                return
        except http2.StreamClosed:
            raise _Ended from None
        else:
            call.pending += data
            self._pump(call)
            self._schedule_flush()

    async def _send_message(self, call: _Call, payload: bytes) -> None:
        self._send_message_now(call, payload)
        if call.pending:
            # Streamed answers wait for the client's window, as grpc's writes do.
            call.drained = call.drained or asyncio.Event()
            call.drained.clear()
            await call.drained.wait()
            if call.ended:
                raise _Ended

    def _pump(self, call: _Call) -> None:
        connection = self._http2
        stream_id = call.stream_id
        pending = call.pending
        try:
            while pending:
                room = min(connection.window(stream_id), len(pending))
                if room <= 0:
                    return
                connection.send_data(stream_id, bytes(pending[:room]))
                del pending[:room]
            if call.trailers is not None:
                self._close(call, call.trailers)
        except http2.StreamClosed:
            pending.clear()
            self._forget(call)
            return
        if call.drained is not None:
            call.drained.set()

    def _resume(self, stream_id: int) -> None:
        calls = self._calls.values() if stream_id == 0 else [self._calls[stream_id]] if stream_id in self._calls else ()
        for call in list(calls):
            if call.pending:
                self._pump(call)

    def _finish(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """Ends the call with its status, in the trailers (or alone, trailers-only)."""
        if call.ended:
            return
        call.ended = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if code is grpc.StatusCode.OK and not details and not call.trailing and call.head_sent:
            trailers = _OK_TRAILERS
        else:
            try:
                trailers = _trailers(code, details, call.trailing, call.head_sent)
            except Exception as exc:  # trailing metadata that is not str or bytes pairs
                logger.exception("%s: its trailing metadata cannot be sent", call.method)
                trailers = _trailers(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}", (), call.head_sent)
            call.head_sent = True
        call.trailers = trailers
        if not call.pending:
            try:
                self._close(call, trailers)
            except http2.StreamClosed:
                self._forget(call)
        self._schedule_flush()

    def _close(self, call: _Call, trailers: bytes) -> None:
        call.trailers = None
        # A client still sending learns from these trailers that its call is over; what it
        # sends meanwhile is dropped (the stream is forgotten here). No RST_STREAM: grpc's
        # clients may fail a write racing one as INTERNAL, not with the status sent here.
        self._http2.send_headers(call.stream_id, trailers, end_stream=True)
        self._forget(call)

    def _forget(self, call: _Call) -> None:
        self._calls.pop(call.stream_id, None)
        task = call.task
        if task is not None and not task.done() and task is not asyncio.current_task(self._loop):
            task.cancel()  # ended from outside its handler: too large, malformed, expired
        self._done(call)

    def _done(self, call: _Call) -> None:
        callbacks, call.done_callbacks = call.done_callbacks, []
        if callbacks:
            context = _Context(call)
            for callback in callbacks:
                try:
                    callback(context)
                except Exception:
                    logger.exception("a call's done callback failed")
        self._server.call_ended(self)


class Server:
    """The part of grpc.aio.Server the gateway uses: handlers added, one port bound, started
    and stopped with a grace period. `compression`: b"gzip" to compress the answers of the
    `compressed` methods (paths) for clients that accept it, else None."""

    def __init__(
        self,
        compression: bytes | None = None,
        compressed: frozenset[str] = frozenset(),
        max_receive: int = MAX_MESSAGE_BYTES,
        shared: bool = False,
        transport: Transport = TRITON_DEFAULTS,
    ) -> None:
        self.compression = compression
        self.compressed = compressed
        self.max_receive = max_receive
        self.transport = transport
        self._shared = shared
        self._generic: list[Any] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._sockets: list[socket.socket] = []
        self._servers: list[asyncio.Server] = []
        self.connections: set[_Connection] = set()
        self._idle: asyncio.Event | None = None
        self._stopped = asyncio.Event()

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def handler(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> grpc.RpcMethodHandler | None:
        found = self._registered.get(method)
        if found is not None:
            return found
        details = _Details(method, metadata)
        for generic in self._generic:
            found = generic.service(details)
            if found is not None:
                self._registered[method] = found  # one lookup per method, not per call
                return found
        return None

    def add_insecure_port(self, address: str) -> int:
        """Binds `address` ("host:port", "[v6]:port") now, as grpc does; RuntimeError when
        it cannot be bound, as grpc raises."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self._shared:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, int(port)))
            sock.listen(2048)
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"Failed to bind to address {address}: {exc.strerror}") from None
        self._sockets.append(sock)
        bound: int = sock.getsockname()[1]
        return bound

    def add_secure_port(self, address: str, credentials: Any) -> int:
        raise NotImplementedError("TLS is served by grpc.aio (gateway.grpc_front.build_grpc_server)")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            self._servers.append(await loop.create_server(lambda: _Connection(self), sock=sock))

    def call_ended(self, connection: _Connection) -> None:
        if self._idle is not None and connection.idle and connection.closing:
            connection.close()
            if all(c.idle for c in self.connections):
                self._idle.set()
        elif connection.aged and connection.aged_out:
            connection.close()

    async def stop(self, grace: float | None) -> None:
        """Stops accepting, tells every client (GOAWAY), lets calls in flight finish within
        `grace` seconds, then cancels the rest and closes."""
        if self._stopped.is_set():
            return
        for server in self._servers:
            server.close()
        self._idle = asyncio.Event()
        for connection in list(self.connections):
            connection.goaway()
            if connection.idle:
                connection.close()
        if grace and any(not c.idle for c in self.connections):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for connection in list(self.connections):
            connection.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()
