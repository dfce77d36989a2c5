"""The gateway's HTTP/1.1 connections: an asyncio protocol over httptools' parser that
serves the HTTP front (an ASGI app) for uvicorn's server, which still owns the listening
sockets, TLS and the graceful stop (`uvicorn.Config(http=HttpProtocol)`).

It stands where uvicorn's own httptools protocol would, and behaves as it does towards the
app and the client (keep-alive, pipelining, `Expect: 100-continue`, flow control both
ways, chunked answers, a 400 for what the parser refuses), minus what the gateway never
asks of it (websockets, access logs, a concurrency limit, a root path). What it does less
of per request: an answer whose body comes in one message leaves in one write, head and
body together; no event and no timer a request (one keep-alive timer a connection,
re-armed only when it fires); headers taken as the front builds them. Two more rules:
a request head may take at most MAX_HEAD_BYTES (httptools gathers a head with no bound of
its own), and a body that carries both Content-Length and `Transfer-Encoding: chunked`
is read by its chunks, as Triton reads it, and its connection closes after the answer.
The app finds each request's Exchange in its scope (EXCHANGE), through which it can ask
to hear at once of a client that leaves.

A client sends the same request head again and again (an infer of one model and shape
repeats its request line and headers byte for byte), so a head the parser has read once,
framed by its Content-Length alone, is remembered by its bytes (KnownHead): a request
that arrives whole, at the start of a read, with a head seen before, is cut from the read
by that length, without the parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import re
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import httptools

from protos.memo import Memo

logger = logging.getLogger(__name__)

# The most a request's head (request line and headers) may take. Bodies have
# --http-max-input-size (gateway.http.front); a head is held as many small Python objects,
# so its bound is smaller and fixed. Triton (libevhtp) closes on one header over 8 KiB.
MAX_HEAD_BYTES = 1 << 20
HEAD_REFUSAL_LINGER_SECS = 2.0
# A request body buffered past this, reading stops until the app takes it.
BODY_HIGH_WATER = 1 << 16

_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: 43\r\nconnection: close\r\n\r\n"
    b'{"error":"Request Header Fields Too Large"}'
)
_INVALID = b"Invalid HTTP request received."
_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_INVALID), _INVALID)
)
_INTERNAL_ERROR_HEADERS = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
]
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# The scope key under which the app finds the request's Exchange: setting its `on_gone`
# has the connection call it the moment the client leaves before its answer is sent whole
# (an ASGI app would otherwise learn it only from a `receive` it must keep waiting on).
EXCHANGE = "turnout.exchange"
# The scope's key for its request's Head.
HEAD = "turnout.head"
_UNSAFE_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


def _plain(method: str, head: Head, head_bytes: bytes) -> bool:
    """Whether a request head the parser has read (`head_bytes`, up to the blank line
    that ends it, found within KNOWN_HEAD_BYTES) can be remembered by its bytes: its body
    framed by Content-Length alone, nothing asked but an answer (no 100 Continue, no
    upgrade), and every line ended by CRLF, so that the first blank line in a read is
    where the parser found the head's end."""
    names = head.by_name
    return (
        method != "CONNECT"
        and not head.expect_continue
        and "transfer-encoding" not in names
        and "upgrade" not in names
        and names.get("content-length", "0").isdigit()
        and head_bytes.count(b"\n") == head_bytes.count(b"\r\n")
    )


def _parser(protocol: HttpProtocol) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(protocol)
    # An answer may go out before the rest of a pipelined request is read; and a body
    # with both Content-Length and chunks is read by its chunks (RFC 9112, and Triton).
    with contextlib.suppress(AttributeError):  # httptools < 0.6.3
        parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
    return parser


def _without_upgrade(method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request head as sent, less its Upgrade header and Connection's "upgrade"."""
    lines = [b"%s %s HTTP/%s" % (method, url, version.encode("ascii"))]
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"upgrade":
            continue
        if lowered == b"connection":
            value = b", ".join(t for t in (t.strip() for t in value.split(b",")) if t.lower() != b"upgrade")
            if not value:
                continue
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class Head(NamedTuple):
    """What a request's headers say, read once for every request that sends the same."""

    headers: tuple[tuple[bytes, bytes], ...]  # names lower-cased, values' trailing white space dropped
    by_name: dict[str, str]  # of a repeated name, the first; shared: read it, never change it
    expect_continue: bool
    framing_doubt: bool  # both Transfer-Encoding and Content-Length

    @classmethod
    def of(cls, sent: tuple[tuple[bytes, bytes], ...]) -> Head:
        headers = tuple((name.lower(), value.rstrip(b" \t")) for name, value in sent)  # llhttp keeps it
        by_name: dict[str, str] = {}
        for name, value in headers:
            by_name.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        expect = by_name.get("expect", "").lower() == "100-continue"
        return cls(headers, by_name, expect, "transfer-encoding" in by_name and "content-length" in by_name)


# Clients send the same headers again and again (a body of another size changes them).
_heads: Memo[tuple[tuple[bytes, bytes], ...], Head] = Memo(64)


class KnownHead(NamedTuple):
    """What the parser read of a request head: all a request with the same bytes needs."""

    scope: dict[str, Any]  # copied for each request; the connection's own keys added
    head: Head
    length: int  # the body's, from Content-Length


# Heads up to this long are remembered by their bytes, at most 64 of them.
KNOWN_HEAD_BYTES = 2048
_known_heads: Memo[bytes, KnownHead] = Memo(64)


class Exchange:
    """One request and its answer: the ASGI `receive` and `send` of one app call."""

    def __init__(self, connection: HttpProtocol, scope: dict[str, Any], expect_continue: bool, keep_alive: bool):
        self.connection = connection
        self.scope = scope
        self.expect_continue = expect_continue
        self.keep_alive = keep_alive
        self.body: list[bytes] = []  # what has arrived and not been read, as the parser gave it
        self.held = 0  # its bytes
        self.more_body = True
        self.read = False  # some of the body has been handed to the app
        self.news = False  # something `receive` has not yet reported (body, its end, a disconnect)
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False
        self.complete = False
        self.head: bytes | None = None  # written with the body's first message
        self.chunked: bool | None = None
        self.remaining = 0  # of the declared Content-Length
        self.on_gone: Callable[[], object] | None = None

    def wake(self) -> None:
        self.news = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run(self, app: Callable[..., Awaitable[None]]) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self.connection.transport.close()
        else:
            if not self.started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.connection.transport.close()

    async def _internal_error(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _INTERNAL_ERROR_HEADERS})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        if self.expect_continue and not connection.transport.is_closing():
            connection.transport.write(_CONTINUE)
            self.expect_continue = False
        if not self.news and not self.disconnected and not self.complete:
            connection.resume_reading()
            self.waiter = connection.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        self.news = False
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        self.read = True
        body = self._take()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    def whole_body(self) -> bytes | None:
        """The whole body, where all of it has arrived, none of it has been read and no
        100 Continue is owed: what one `receive` would return, without a message. None
        otherwise (read it through `receive`)."""
        if self.more_body or self.read or self.expect_continue or self.disconnected or self.complete:
            return None
        self.read = True
        self.news = False
        return self._take()

    def _take(self) -> bytes:
        body = b"".join(self.body)  # one chunk is itself, not a copy
        self.body = []
        self.held = 0
        return body

    async def send(self, message: dict[str, Any]) -> None:
        connection = self.connection
        if connection.writable is not None and not self.disconnected:
            await connection.writable
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._start(message["status"], message.get("headers", ()))
        elif not self.complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer in one call, its headers as the gateway's own code builds them
        (lower-case names, values without control bytes, no Content-Length: `body` gives
        it): what `send`'s two messages do, without checking each header."""
        connection = self.connection
        if connection.writable is not None and not self.disconnected:
            await connection.writable
        if self.disconnected:
            return
        if self.started:
            raise RuntimeError("Unexpected answer: the response has already started.")
        self.started = True
        self.expect_continue = False
        lines = [_STATUS_LINES[status]]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)
        self.chunked = False
        self.remaining = len(body)
        self._body(body, False)

    def _start(self, status: int, headers: Any) -> None:
        self.started = True
        self.expect_continue = False
        lines = [_STATUS_LINES[status]]
        closes = False
        for name, value in headers:
            if _UNSAFE_VALUE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked is None:
                self.remaining = int(value)
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.chunked = True
            elif name == b"connection" and b"close" in [token.strip().lower() for token in value.split(b",")]:
                self.keep_alive = False
                closes = True
            lines += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closes:
            lines.append(b"connection: close\r\n")
        if self.chunked is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)

    def _body(self, body: bytes, more: bool) -> None:
        if self.scope["method"] == "HEAD":
            data = b""
            self.remaining = 0
        elif self.chunked:
            data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.remaining:
                raise RuntimeError("Response content longer than Content-Length")
            self.remaining -= len(body)
            data = body
        if self.head is not None:
            data, self.head = self.head + data, None
        transport = self.connection.transport
        if data:
            transport.write(data)
        if more:
            return
        if self.remaining:
            raise RuntimeError("Response content shorter than Content-Length")
        self.complete = True
        self.wake()  # a `receive` waiting for a disconnect returns now
        if not self.keep_alive:
            transport.close()
        self.connection.answered()


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection; constructed by uvicorn's server, as its own protocols are."""

    def __init__(
        self, config: Any, server_state: Any, app_state: Any = None, _loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.keep_alive_secs: float = config.timeout_keep_alive
        self.parser = _parser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.reading: Exchange | None = None  # the request being read, or the last one read
        self.running: Exchange | None = None  # the request the app is answering, or the last one
        self.pipeline: deque[Exchange] = deque()  # read, waiting for the answers before them
        self.read_paused = False
        self.writable: asyncio.Future[None] | None = None  # while the transport's buffer is full
        self.idle_since: float | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.head_room: int | None = MAX_HEAD_BYTES  # None while a body is read
        self.refused = False
        # The request being parsed.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []  # as sent, of the request being read
        self.between = True  # the parser has no part of a request: the next read starts one
        self.unupgraded: bytes | None = None  # a head that asked for an upgrade, without the ask
        self.head_bytes: bytes | None = None  # the parsed request's head, when a read began with all of it

    # -- the transport's side --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server_state.connections.add(self)
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        if transport.get_extra_info("sslcontext"):
            self.scheme = "https"

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        for exchange in {self.running, self.reading, *self.pipeline}:
            if exchange is not None:
                exchange.disconnected = not exchange.complete
                exchange.wake()
                if exchange.disconnected and exchange.on_gone is not None:
                    exchange.on_gone()
        self.resume_writing()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        # Not while pipelined requests wait for their turn: each read could queue as many
        # again, and a client that never reads its answers would be read without end.
        if self.read_paused and not self.pipeline:
            self.read_paused = False
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # what the client still sends after its 431, dropped
        self.idle_since = None
        while self.between and data:
            end = data.find(b"\r\n\r\n", 0, KNOWN_HEAD_BYTES)
            if end < 0:
                break
            head_bytes = data[:end]
            known = _known_heads.get(head_bytes)
            body_end = end + 4 + (known.length if known is not None else 0)
            if known is None or len(data) < body_end:
                self.head_bytes = head_bytes  # learned if the parser finds it plain
                break
            self._begin(dict(known.scope), known.head, True)
            if body_end > end + 4:
                self.on_body(data[end + 4 : body_end])
            self.on_message_complete()
            data = data[body_end:]
            if self.transport.is_closing():
                return
        while data:
            room = self.head_room
            if room is None:
                self._feed(data)
                return
            if room == 0:
                self._refuse_head()
                return
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self.head_room = room - len(piece)
            self._feed(piece)
            if self.transport.is_closing():
                return

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # No protocol to upgrade to, and Triton ignores the ask: the parser, which stops
            # at the end of the head (before any body), is replaced by one that reads the
            # head again without the ask, and then the rest as the request's body and beyond.
            head, self.unupgraded = self.unupgraded, None
            if head is None:  # CONNECT: answered as any other request, and nothing more read
                self.between = False
                return
            self.parser = _parser(self)
            self._feed(head + data[upgrade.args[0] :])
        except httptools.HttpParserError:
            logger.warning("Invalid HTTP request received.")
            self.transport.write(_BAD_REQUEST)
            self.transport.close()

    def _refuse_head(self) -> None:
        logger.warning("HTTP request head over %d bytes refused", MAX_HEAD_BYTES)
        self.refused = True
        self.transport.write(_HEAD_TOO_LARGE)
        if not self.transport.can_write_eof():  # TLS
            self.transport.close()
            return
        # Closing with the client's bytes unread would reset the connection, and the reset
        # can overtake the 431. Send the end of our side instead, drop what still comes,
        # and close when the client does, or after a short while.
        self.transport.write_eof()
        self.loop.call_later(HEAD_REFUSAL_LINGER_SECS, self.transport.close)

    # -- the parser's callbacks --

    def on_message_begin(self) -> None:
        self.between = False
        self.url = b""
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))  # as sent: read in on_headers_complete

    def on_headers_complete(self) -> None:
        self.head_room = None
        parser = self.parser
        version = parser.get_http_version()
        url = self.url
        if url[:1] == b"/":
            raw_path, _, query = url.partition(b"?")
            raw_path = raw_path.partition(b"#")[0]
        else:  # absolute form, or `*`
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
        }
        if parser.should_upgrade() and parser.get_method() != b"CONNECT":
            # Read again without the ask (see _feed); what is read now is not the request.
            self.unupgraded = _without_upgrade(parser.get_method(), url, version, self.headers)
            self.head_bytes = None
            return
        sent = tuple(self.headers)
        head = _heads.get(sent)
        if head is None:
            head = _heads.remember(sent, Head.of(sent))
        keep_alive = version != "1.0" and parser.should_keep_alive() and not head.framing_doubt
        head_bytes, self.head_bytes = self.head_bytes, None
        if head_bytes is not None and keep_alive and _plain(scope["method"], head, head_bytes):
            known = KnownHead(dict(scope), head, int(head.by_name.get("content-length", "0")))
            _known_heads.remember(head_bytes, known)
        self._begin(scope, head, keep_alive)

    def _begin(self, scope: dict[str, Any], head: Head, keep_alive: bool) -> None:
        """A request's head has been read: run it, or queue it behind the one running."""
        scope["server"] = self.server
        scope["client"] = self.client
        scope["scheme"] = self.scheme
        scope["headers"] = list(head.headers)  # the app's to change
        scope[HEAD] = head
        self.reading = scope[EXCHANGE] = Exchange(self, scope, head.expect_continue, keep_alive)
        if self.running is None or self.running.complete:
            self._start(self.reading)
        else:
            self.pause_reading()  # a pipelined request waits for the answers before it
            self.pipeline.append(self.reading)

    def on_body(self, body: bytes) -> None:
        exchange = self.reading
        assert exchange is not None
        if exchange.complete:
            return  # answered already: the rest of its body is dropped
        exchange.body.append(body)
        exchange.held += len(body)
        if exchange.held > BODY_HIGH_WATER:
            self.pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        if self.unupgraded is not None:
            return  # the end the parser gives a head that asked for an upgrade: not the request's
        self.between = True
        self.head_room = MAX_HEAD_BYTES
        exchange = self.reading
        assert exchange is not None
        if exchange.complete:
            return
        exchange.more_body = False
        exchange.wake()

    # -- requests and answers --

    def _start(self, exchange: Exchange) -> None:
        self.running = exchange
        task = self.loop.create_task(exchange.run(self.app))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def answered(self) -> None:
        """An answer has been sent whole: start the next pipelined request, or wait idle."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:
            self._start(self.pipeline.popleft())
            self.resume_reading()  # once the last request read is the one answering
            return
        self.resume_reading()
        self.idle_since = self.loop.time()
        if self.idle_timer is None:
            self.idle_timer = self.loop.call_later(self.keep_alive_secs, self._idle_check)

    def _idle_check(self) -> None:
        """Close a connection idle for the keep-alive timeout. One timer a connection: while
        requests keep coming it only re-arms itself for what is left of the timeout."""
        self.idle_timer = None
        if self.idle_since is None or self.transport.is_closing():
            return  # busy: the next answer arms it again
        left = self.idle_since + self.keep_alive_secs - self.loop.time()
        if left <= 0:
            self.transport.close()
        else:
            self.idle_timer = self.loop.call_later(left, self._idle_check)

    def shutdown(self) -> None:
        """uvicorn's server stopping: close now if idle, else after the answer in flight."""
        if self.reading is None or self.reading.complete:
            self.transport.close()
        else:
            self.reading.keep_alive = False  # the last request read closes the connection
