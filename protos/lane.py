"""The infer lane: a framed, multiplexed byte stream between gateway and sidecar.

One gRPC call costs the gateway about ten times what a frame on a Unix socket does, so
ModelInfer travels here; everything else stays on the sidecar's gRPC service. A frame
is `u32 payload length | u64 call id | u8 kind | payload`. Requests carry the request id
(`u8 length | id`, at most 255 bytes of UTF-8, so every log line on both sides names the
request without touching the protobuf) and then a serialized ModelInferRequest;
replies carry a serialized ModelInferResponse or an error (status name, NUL, message, and
NUL and its cause where it has one: protos.status.Cause).
A CANCEL frame (empty payload) says the caller gave up on a call (its deadline passed,
its client went away): the sidecar cancels it, which drops it from its batcher's queue
if it has not run yet, and sends no reply. Writes made in one turn
of the event loop leave in one syscall, so concurrent calls share the hop's cost.
Either end may put TLS under the frames (an `ssl.SSLContext`), on TCP or a Unix socket.

A connection opens with a handshake: the gateway's first frame is a HELLO (call id 0)
stating its lane protocol version and the largest frame it takes; the sidecar answers with
its own. Versions must match: where they do not, both ends refuse the connection with a
text that names both versions and which side to upgrade (a peer that predates the handshake
counts as version 1), and the gateway reports that sidecar not ready.

Several answers to one request (a decoupled model's): a STREAM request is an INFER that
accepts them. Its answers are PART frames, each a response with more to follow, or
PART_ERROR frames, each an error response with more to follow (Triton passes a decoupled
model's error in-band and the stream goes on), then one REPLY (the last response; an empty
payload when the model ended without one) or ERROR. An INFER call never sees either.

A frame may carry at most `max_frame` payload bytes (MAX_FRAME: the largest gRPC message
Triton takes, plus the request id). A sender checks against the limit its peer stated and
refuses a larger frame with an error to its caller alone. A receiver checks every header
against its own limit before it holds any of the payload: a peer that sends a larger frame
has broken the protocol, so the connection is closed, with a log line naming the peer, the
size and the limit, and the calls in flight on it fail; other connections are untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from enum import IntEnum
from functools import partial
from typing import Any, cast

from protos.rpc import MAX_MESSAGE_BYTES
from protos.status import Status, TurnoutError, cause_named

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IQB")
MAX_REQUEST_ID = 255
MAX_FRAME = MAX_MESSAGE_BYTES + 1 + MAX_REQUEST_ID
# A peer that never answers the handshake (a plain lane, most often) must not stall a call.
TLS_HANDSHAKE_TIMEOUT_SECS = 5.0

# The lane's wire version, stated in the HELLO each end sends first. Version 1 was the lane
# before the handshake. Bump it for any change an older peer would misread.
LANE_PROTOCOL = 3  # 3: PART_ERROR
# HELLO payload: magic | u16 version | u64 largest frame taken; later versions may append
# fields, which a reader ignores. The version's place never moves.
_HELLO = struct.Struct("<8sHQ")
_MAGIC = b"turnlane"
HELLO_TIMEOUT_SECS = 5.0


class Kind(IntEnum):
    INFER = 1
    REPLY = 2
    ERROR = 3
    CANCEL = 4
    HELLO = 5  # the handshake, on call id 0
    STREAM = 6  # an INFER whose answers may be several PART frames before the REPLY
    PART = 7  # one answer of a STREAM call, more to follow
    PART_ERROR = 8  # one error answer of a STREAM call (an encoded TurnoutError), more to follow


def encode_error(error: TurnoutError) -> bytes:
    encoded = error.status.name.encode() + b"\0" + error.message.encode()
    return encoded + b"\0" + error.cause.value.encode() if error.cause is not None else encoded


def decode_error(payload: bytes) -> TurnoutError:
    status, _, rest = payload.partition(b"\0")
    # A message may hold a NUL itself: only a known cause after the last one is a cause.
    message, _, tail = rest.rpartition(b"\0")
    cause = cause_named(tail.decode(errors="replace"))
    return TurnoutError(Status[status.decode()], (message if cause else rest).decode(errors="replace"), cause)


def too_large(size: int, limit: int, sent: bool) -> str:
    """gRPC's own words for a message over its limit, which a lane frame shares."""
    return f"{'Sent' if sent else 'Received'} message larger than max ({size} vs. {limit})"


class LaneMismatch(TurnoutError):
    """The sidecar speaks another lane protocol version: no call can succeed on it until
    one side is upgraded (status UNAVAILABLE; nothing was sent)."""


def hello(max_frame: int, version: int = LANE_PROTOCOL) -> bytes:
    """A HELLO frame's payload: our version and the largest frame we take."""
    return _HELLO.pack(_MAGIC, version, max_frame)


def read_hello(payload: bytes) -> tuple[int, int] | None:
    """(version, largest frame) of a HELLO payload; None when it is not one."""
    if len(payload) < _HELLO.size or not payload.startswith(_MAGIC):
        return None
    _, version, max_frame = _HELLO.unpack_from(payload)
    return version, max_frame


def mismatch(peer: str, where: str, theirs: int, me: str) -> str:
    """Both ends' words for a version mismatch: who speaks what, and which to upgrade."""
    older = me if theirs > LANE_PROTOCOL else peer
    before = " (it predates the lane handshake)" if theirs == 1 else ""
    return (
        f"the {peer} at {where} speaks lane protocol {theirs}{before}, this {me} speaks {LANE_PROTOCOL}; "
        f"upgrade the {older} so both speak the same version"
    )


class _Framer(asyncio.Protocol):
    """Splits the byte stream into frames and batches outgoing writes per loop turn."""

    def __init__(self, max_frame: int) -> None:
        self._buffer = bytearray()
        self._pending: list[bytes] = []
        self.max_frame = max_frame  # the largest payload we take
        self.peer_max_frame = max_frame  # the largest the peer takes, from its HELLO
        self.transport: asyncio.Transport | None = None
        # Set once connected. Kept, as asking for the running loop costs a getpid() call.
        self.loop: asyncio.AbstractEventLoop = cast(asyncio.AbstractEventLoop, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports have the asyncio.Transport
        # methods but are not its subclasses, and an exception raised here leaves uvloop's
        # create_connection waiting forever.
        self.transport = cast(asyncio.Transport, transport)
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        # Frames are cut from where they arrived, each payload copied once: from `data` itself
        # when nothing is held over (whole frames per read, the common case), else from the
        # buffer that joins the pieces of a frame read in parts, through a memoryview.
        buffer = self._buffer
        held = bool(buffer)
        if held:
            buffer += data
        source = buffer if held else data
        offset = 0
        size = len(source)
        while size - offset >= _HEADER.size:
            length, call_id, kind = _HEADER.unpack_from(source, offset)
            start = offset + _HEADER.size
            if length > self.max_frame:
                self.frame_refused(call_id, kind, length)  # it closes the connection
                return
            end = start + length
            if end > size:
                break
            self.frame_received(call_id, kind, bytes(memoryview(buffer)[start:end]) if held else data[start:end])
            offset = end
        if held:
            del buffer[:offset]
        elif offset < size:
            buffer += memoryview(data)[offset:] if offset else data  # the start of a frame still arriving

    def send(self, call_id: int, kind: int, payload: bytes, prefix: bytes = b"") -> None:
        """Queue one frame; `prefix` (a few bytes) joins the header, so the payload is never
        copied to lead it."""
        if not self._pending:
            self.loop.call_soon(self._flush)
        self._pending.append(_HEADER.pack(len(prefix) + len(payload), call_id, kind) + prefix)
        self._pending.append(payload)

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(self._pending)
        self._pending = []

    def close_now(self) -> None:
        """Close the connection once what is queued (a refusal, a HELLO) has left."""
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def frame_received(self, call_id: int, kind: int, payload: bytes) -> None:
        raise NotImplementedError

    def frame_refused(self, call_id: int, kind: int, length: int) -> None:
        """A frame over max_frame arrived (only its header was read): close the connection."""
        raise NotImplementedError


# An INFER call's answer: at once (bytes), or an awaitable run as a task of its own.
Handler = Callable[[memoryview, str], bytes | Awaitable[bytes]]
# A STREAM call's answers: (payload, last), a TurnoutError for an error answer with more to
# follow; a stream that ends without a last one ends empty, one that raises ends with its error.
StreamHandler = Callable[[memoryview, str], AsyncIterator[tuple[bytes | TurnoutError, bool]]]


def request_id_prefix(request_id: str) -> bytes:
    """An INFER frame's leading `u8 length | id`; an id too long for it is cut at a
    character boundary."""
    tag = request_id.encode()
    if len(tag) > MAX_REQUEST_ID:
        tag = tag[:MAX_REQUEST_ID].decode(errors="ignore").encode()
    return bytes((len(tag),)) + tag


class _ServerConnection(_Framer):
    def __init__(
        self,
        handler: Handler,
        tasks: set[asyncio.Task[None]],
        max_frame: int,
        refused: set[tuple[str, int]],
        stream_handler: StreamHandler | None = None,
    ) -> None:
        super().__init__(max_frame)
        self._handler = handler
        self._stream_handler = stream_handler
        self._tasks = tasks
        self._refused = refused  # (peer host, version) pairs already logged, shared by the server's connections
        self._calls: dict[int, asyncio.Task[None]] = {}  # in-flight answers of this connection, by call id
        # The first frame goes to the handshake; once it passes, the instance attribute is
        # deleted and frames reach the class's frame_received with no test per frame.
        self.frame_received = self._greet  # type: ignore[method-assign]

    def _peer(self) -> str:
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
        where = transport.get_extra_info("sockname") if transport is not None else ""
        return f"unix:{where}"  # a Unix socket's peer has no name: say which lane it came in on

    def _refuse(self, version: int) -> str:
        """Log a refused handshake, at error level once per peer host and version (a gateway
        retries every readiness probe), and close the connection; returns the reason."""
        peer = self._peer()
        message = mismatch("gateway", peer, version, "sidecar")
        key = (peer.rpartition(":")[0] if not peer.startswith("unix:") else peer, version)
        level = logging.DEBUG if key in self._refused else logging.ERROR
        self._refused.add(key)
        log.log(level, "refusing a lane connection: %s", message)
        return message

    def _greet(self, call_id: int, kind: int, payload: bytes) -> None:
        if self.transport is not None and self.transport.is_closing():
            return  # frames that came with a refused one
        stated = read_hello(payload) if kind == Kind.HELLO else None
        if stated is None:
            # A gateway that predates the handshake sent a request first: refuse it in words
            # it can show its caller.
            message = self._refuse(1)
            if kind == Kind.INFER:
                self.send(call_id, Kind.ERROR, encode_error(TurnoutError(Status.UNAVAILABLE, message)))
            self.close_now()
            return
        version, peer_max_frame = stated
        self.send(0, Kind.HELLO, hello(self.max_frame))  # our version, whatever theirs
        if version != LANE_PROTOCOL:
            self._refuse(version)
            self.close_now()
            return
        self.peer_max_frame = peer_max_frame
        del self.frame_received

    def frame_received(self, call_id: int, kind: int, payload: bytes) -> None:
        if kind == Kind.CANCEL:
            call = self._calls.pop(call_id, None)
            if call is not None:
                call.cancel()
            return
        # A view past the id: the request is parsed where it lies, with no copy.
        length = payload[0] if payload else 0
        request_id = payload[1 : 1 + length].decode(errors="replace") if length else ""
        request = memoryview(payload)[1 + length :]
        answer: Coroutine[Any, Any, None]
        if kind == Kind.STREAM and self._stream_handler is not None:
            answer = self._answer_stream(call_id, request, request_id, self._stream_handler)
        else:
            try:
                reply = self._handler(request, request_id)
            except Exception as error:  # the peer must always get an answer
                self._send_error(call_id, error)
                return
            if isinstance(reply, bytes):  # answered at once: no task
                self._send_reply(call_id, reply)
                return
            answer = self._answer(call_id, reply)
        task = self.loop.create_task(answer)
        self._tasks.add(task)
        self._calls[call_id] = task
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._calls.pop(call_id, None))

    def frame_refused(self, call_id: int, kind: int, length: int) -> None:
        log.error(
            "closing the lane connection from %s: it sent a frame of %d bytes, over the limit of %d",
            self._peer(),
            length,
            self.max_frame,
        )
        if kind in (Kind.INFER, Kind.STREAM):  # the caller learns why, if its peer still reads
            message = too_large(length, self.max_frame, sent=False)
            self.send(call_id, Kind.ERROR, encode_error(TurnoutError(Status.INVALID_ARG, message)))
        self.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        # The gateway is gone: nobody waits for these answers any more.
        for call in list(self._calls.values()):
            call.cancel()
        self._calls.clear()

    async def _answer(self, call_id: int, reply: Awaitable[bytes]) -> None:
        try:
            payload = await reply
        except Exception as error:  # the peer must always get an answer
            self._send_error(call_id, error)
        else:
            self._send_reply(call_id, payload)

    def _send_reply(self, call_id: int, reply: bytes) -> None:
        if len(reply) > self.peer_max_frame:  # the gateway would close the connection on it
            message = too_large(len(reply), self.peer_max_frame, sent=True)
            self.send(call_id, Kind.ERROR, encode_error(TurnoutError(Status.INTERNAL, message)))
        else:
            self.send(call_id, Kind.REPLY, reply)

    def _send_error(self, call_id: int, error: Exception) -> None:
        if not isinstance(error, TurnoutError):
            error = TurnoutError(Status.INTERNAL, str(error))
        self.send(call_id, Kind.ERROR, encode_error(error))

    async def _answer_stream(self, call_id: int, request: memoryview, request_id: str, handler: StreamHandler) -> None:
        try:
            async for payload, last in handler(request, request_id):
                if isinstance(payload, TurnoutError):
                    if last:
                        raise payload
                    self.send(call_id, Kind.PART_ERROR, encode_error(payload))
                    continue
                if len(payload) > self.max_frame:
                    message = too_large(len(payload), self.max_frame, sent=True)
                    self.send(call_id, Kind.ERROR, encode_error(TurnoutError(Status.INTERNAL, message)))
                    return
                self.send(call_id, Kind.REPLY if last else Kind.PART, payload)
                if last:
                    return
        except TurnoutError as error:
            self.send(call_id, Kind.ERROR, encode_error(error))
            return
        except Exception as error:  # the peer must always get an answer
            self.send(call_id, Kind.ERROR, encode_error(TurnoutError(Status.INTERNAL, str(error))))
            return
        self.send(call_id, Kind.REPLY, b"")


class LaneServer:
    """Serves the lane on a Unix socket path or a TCP host:port; `handler` answers one
    request, given the serialized request and its request id ("" when none came).
    Frames over `max_frame` bytes are refused both ways."""

    def __init__(
        self, handler: Handler, max_frame: int = MAX_FRAME, stream_handler: StreamHandler | None = None
    ) -> None:
        self._handler = handler
        self._stream_handler = stream_handler
        self._max_frame = max_frame
        self._server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # in-flight answers, for draining
        self._refused: set[tuple[str, int]] = set()

    async def start_unix(self, path: str, tls: ssl.SSLContext | None = None) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _ServerConnection(self._handler, self.tasks, self._max_frame, self._refused, self._stream_handler),
            path,
            ssl=tls,
        )
        return f"unix:{path}"

    async def start_tcp(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self._handler, self.tasks, self._max_frame, self._refused, self._stream_handler),
            host,
            port,
            ssl=tls,
        )
        bound = self._server.sockets[0].getsockname()
        return f"{bound[0]}:{bound[1]}"

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for in-flight answers."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)


class _ClientConnection(_Framer):
    def __init__(self, max_frame: int, address: str) -> None:
        super().__init__(max_frame)
        self.address = address
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.streams: dict[int, asyncio.Queue[tuple[int, bytes]]] = {}  # STREAM calls' answers
        self.closed = False
        self._lost_because = ""  # why we closed it, for the calls it takes down

    def frame_received(self, call_id: int, kind: int, payload: bytes) -> None:
        # Checked only while a STREAM call is open: plain calls pay one empty-dict test.
        if self.streams and (stream := self.streams.get(call_id)) is not None:
            stream.put_nowait((kind, payload))
            return
        future = self.waiting.pop(call_id, None)
        if future is None or future.done():
            return  # the caller gave up on it
        if kind == Kind.REPLY or kind == Kind.HELLO:
            future.set_result(payload)
        else:
            future.set_exception(decode_error(payload))

    def frame_refused(self, call_id: int, kind: int, length: int) -> None:
        self._lost_because = (
            f"the sidecar at {self.address} sent a frame of {length} bytes, over this gateway's limit of "
            f"{self.max_frame}; the connection was closed"
        )
        log.error("%s", self._lost_because)
        stream = self.streams.get(call_id)
        if stream is not None:
            error = TurnoutError(Status.INTERNAL, too_large(length, self.max_frame, sent=False))
            stream.put_nowait((Kind.ERROR, encode_error(error)))
        future = self.waiting.pop(call_id, None)
        if future is not None and not future.done():
            future.set_exception(TurnoutError(Status.INTERNAL, too_large(length, self.max_frame, sent=False)))
        self.closed = True  # now, not when the transport reports it: the next call connects afresh
        self.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # A TLS sidecar that wanted our certificate resets the connection after the handshake.
        detail = f": {self._lost_because or exc}" if self._lost_because or exc is not None else ""
        error = TurnoutError(Status.UNAVAILABLE, f"connection to sidecar lost{detail}")
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(error)
        self.waiting.clear()
        for stream in self.streams.values():
            stream.put_nowait((Kind.ERROR, encode_error(error)))


class LaneClient:
    """A connection to one sidecar's lane (`unix:/path` or `host:port`), opened on first use.

    With `tls`, the connection is TLS and the sidecar's certificate must name
    `server_hostname` (for a TCP lane, its host when none is given). Frames over
    `max_frame` bytes are refused both ways."""

    def __init__(
        self, address: str, tls: ssl.SSLContext | None = None, server_hostname: str = "", max_frame: int = MAX_FRAME
    ) -> None:
        self.address = address
        self._max_frame = max_frame
        self._tls = tls
        self._server_hostname = server_hostname
        self._connection: _ClientConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._ids = itertools.count(1)

    async def _connect(self) -> _ClientConnection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._connection is not None and not self._connection.closed:
                return self._connection
            loop = asyncio.get_running_loop()
            tls = self._tls
            connection = partial(_ClientConnection, self._max_frame, self.address)
            timeout = TLS_HANDSHAKE_TIMEOUT_SECS if tls is not None else None
            try:
                if self.address.startswith("unix:"):
                    _, protocol = await loop.create_unix_connection(
                        connection,
                        self.address[5:],
                        ssl=tls,
                        server_hostname=self._server_hostname if tls is not None else None,
                        ssl_handshake_timeout=timeout,
                    )
                else:
                    host, _, port = self.address.rpartition(":")
                    host = host.strip("[]")
                    _, protocol = await loop.create_connection(
                        connection,
                        host,
                        int(port),
                        ssl=tls,
                        server_hostname=(self._server_hostname or host) if tls is not None else None,
                        ssl_handshake_timeout=timeout,
                    )
            except OSError as error:
                raise TurnoutError(Status.UNAVAILABLE, self._connect_failure(error)) from error
            try:
                await self._greet(protocol)
            except BaseException:
                protocol.close_now()
                raise
            self._connection = protocol
            return protocol

    async def _greet(self, connection: _ClientConnection) -> None:
        """The handshake: state our version and limit, learn the sidecar's. Raises
        LaneMismatch where the versions differ, TurnoutError where no answer comes."""
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        connection.waiting[0] = answer
        connection.send(0, Kind.HELLO, hello(self._max_frame))
        try:
            payload = await asyncio.wait_for(answer, HELLO_TIMEOUT_SECS)
        except TimeoutError:
            raise TurnoutError(
                Status.UNAVAILABLE, f"the sidecar at {self.address} did not answer the lane handshake"
            ) from None
        except TurnoutError as error:
            if connection.closed:  # lost, not answered: a refused client certificate, most often
                raise
            # An ERROR answer is a sidecar that took our HELLO for a request: it predates the handshake.
            raise LaneMismatch(Status.UNAVAILABLE, mismatch("sidecar", self.address, 1, "gateway")) from error
        stated = read_hello(payload)
        version, max_frame = stated if stated is not None else (1, 0)
        if version != LANE_PROTOCOL:
            raise LaneMismatch(Status.UNAVAILABLE, mismatch("sidecar", self.address, version, "gateway"))
        connection.peer_max_frame = max_frame

    async def connect(self) -> None:
        """Open the connection and pass the handshake now, if not yet done (a readiness
        check); raises as `call` would."""
        if self._connection is None or self._connection.closed:
            await self._connect()

    def _connect_failure(self, error: OSError) -> str:
        if isinstance(error, ssl.SSLError):
            return f"TLS handshake with the sidecar at {self.address} failed: {error}"
        if self._tls is not None and isinstance(error, ConnectionAbortedError):  # asyncio's handshake timeout
            return f"the sidecar at {self.address} did not answer the TLS handshake; does it serve TLS?"
        return f"sidecar at {self.address} is unreachable"

    async def _ready_for(self, payload: bytes, request_id: str) -> tuple[_ClientConnection, bytes]:
        """The open connection and the frame's id prefix for a request; raises for a
        request over the sidecar's stated limit (it would close the connection)."""
        prefix = request_id_prefix(request_id)
        connection = self._connection
        if connection is None or connection.closed:
            connection = await self._connect()
        size = len(prefix) + len(payload)
        if size > connection.peer_max_frame:
            raise TurnoutError(Status.INVALID_ARG, too_large(size, connection.peer_max_frame, sent=True))
        return connection, prefix

    async def call(self, payload: bytes, request_id: str = "") -> bytes:
        """Send one request, tagged with `request_id`; return the reply payload or raise
        the sidecar's TurnoutError."""
        connection, prefix = await self._ready_for(payload, request_id)
        call_id = next(self._ids)
        future: asyncio.Future[bytes] = connection.loop.create_future()
        connection.waiting[call_id] = future
        connection.send(call_id, Kind.INFER, payload, prefix)
        try:
            return await future
        except asyncio.CancelledError:
            # Our caller's deadline passed or its client went away: let the sidecar drop it.
            if not connection.closed:
                connection.send(call_id, Kind.CANCEL, b"")
            raise
        finally:
            connection.waiting.pop(call_id, None)

    async def stream(self, payload: bytes, request_id: str = "") -> AsyncIterator[tuple[bytes | TurnoutError, bool]]:
        """Send one STREAM request; yield its answers as (payload, last), an error answer
        with more to follow as (TurnoutError, False), or raise the sidecar's TurnoutError
        that ends it. The last may be empty: the model ended with no response."""
        connection, prefix = await self._ready_for(payload, request_id)
        call_id = next(self._ids)
        answers: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        connection.streams[call_id] = answers
        connection.send(call_id, Kind.STREAM, payload, prefix)
        finished = False
        try:
            while True:
                kind, answer = await answers.get()
                if kind == Kind.PART:
                    yield answer, False
                    continue
                if kind == Kind.PART_ERROR:
                    yield decode_error(answer), False
                    continue
                finished = True
                if kind == Kind.REPLY:
                    yield answer, True
                    return
                raise decode_error(answer)
        finally:
            connection.streams.pop(call_id, None)
            if not finished and not connection.closed:  # our caller gave up on it
                connection.send(call_id, Kind.CANCEL, b"")

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the calls in flight to be answered: a sidecar
        that left the fleet still owes the replies to requests it accepted."""
        connection = self._connection
        if connection is not None and connection.waiting:
            await asyncio.wait(list(connection.waiting.values()), timeout=timeout)

    def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None
