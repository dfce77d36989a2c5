"""The gateway's HTTP/1.1 connections (gateway.http.protocol) under uvicorn's server, talked
to over raw sockets: keep-alive and its timeout, pipelining, `Expect: 100-continue`,
chunked answers, bodies past the read buffer, a client that leaves, an app that fails,
a request the parser refuses, the graceful stop, and requests whose head was seen before
(read without the parser)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvicorn

from gateway.http import protocol
from gateway.http.protocol import BODY_HIGH_WATER, EXCHANGE, HEAD, HttpProtocol

App = Callable[[dict[str, Any], Any, Any], Any]


class Recorder:
    """An ASGI app whose answer depends on the path; it records what it saw."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.scopes: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    async def body(self, receive: Any) -> bytes:
        parts = []
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] == "http.disconnect":
                break
            parts.append(message["body"])
            if not message["more_body"]:
                break
        return b"".join(parts)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        self.started.append(path)
        self.scopes.append(scope)
        if path == "/fail":
            raise ValueError("the app failed")
        if path == "/held":
            await self.release.wait()
        if path == "/disconnect":
            await self.body(receive)
            self.messages.append(await receive())  # waits for the client to leave
            self.started.append("disconnected")
            return
        body = await self.body(receive)
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for part in (b"one", b"two"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        answer = b"%s %s %d" % (scope["method"].encode(), scope["raw_path"], len(body))
        headers = [(b"content-length", b"%d" % len(answer)), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


class Running:
    def __init__(self, server: uvicorn.Server, port: int, app: Recorder) -> None:
        self.server = server
        self.port = port
        self.app = app

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def running(request: pytest.FixtureRequest) -> AsyncIterator[Running]:
    keep_alive: Any = getattr(request, "param", 5.0)  # seconds; uvicorn takes a float too
    app = Recorder()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=HttpProtocol,
        lifespan="off",
        log_config=None,
        timeout_keep_alive=keep_alive,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    yield Running(server, sock.getsockname()[1], app)
    server.should_exit = True
    await asyncio.wait_for(serving, 10)


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One answer: its status line, headers and body (by Content-Length, or its chunks)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, body
        body += chunk[:-2]


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % (path.encode(), len(body))
    return head + b"".join(line + b"\r\n" for line in extra) + b"\r\n" + body


async def test_requests_on_one_connection_are_answered_in_turn(running: Running) -> None:
    reader, writer = await running.connect()
    for body in (b"abc", b"", b"x" * 1000):
        writer.write(post("/echo", body))
        status, headers, answer = await read_answer(reader)
        assert status == b"HTTP/1.1 200 OK"
        assert answer == b"POST /echo %d" % len(body)
        assert b"connection" not in headers
    writer.close()


async def test_pipelined_requests_run_one_after_another_and_answer_in_order(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(post("/held", b"1") + post("/second", b"22") + post("/third", b"333"))
    await asyncio.sleep(0.2)
    assert running.app.started == ["/held"]  # the others wait for the first answer
    running.app.release.set()
    answers = [await read_answer(reader) for _ in range(3)]
    assert [body for _, _, body in answers] == [b"POST /held 1", b"POST /second 2", b"POST /third 3"]
    assert running.app.started == ["/held", "/second", "/third"]
    writer.close()


async def test_expect_continue_is_answered_when_the_app_reads_the_body(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    assert (await read_answer(reader))[2] == b"POST /echo 5"
    writer.close()


async def test_an_answer_without_a_length_is_chunked(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    _status, headers, body = await read_answer(reader)
    assert headers[b"transfer-encoding"] == b"chunked"
    assert body == b"onetwo"
    writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")  # the connection is still usable
    assert (await read_answer(reader))[2] == b"onetwo"
    writer.close()


async def test_http_1_0_and_connection_close_end_the_connection_after_the_answer(running: Running) -> None:
    for request in (b"GET /a HTTP/1.0\r\n\r\n", b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"):
        reader, writer = await running.connect()
        writer.write(request)
        _status, headers, body = await read_answer(reader)
        assert headers[b"connection"] == b"close"
        assert body == b"GET /a 0"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_body_longer_than_the_read_buffer_arrives_whole(running: Running) -> None:
    reader, writer = await running.connect()
    body = bytes(range(256)) * (4 * BODY_HIGH_WATER // 256)
    writer.write(post("/echo", body))
    assert (await read_answer(reader))[2] == b"POST /echo %d" % len(body)
    assert len(running.app.messages) > 1  # read in parts, reading paused between them
    writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "body"),
    [
        pytest.param(
            b"POST /echo HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
            b"HTTP/1.1 400 Bad Request",
            b"Invalid HTTP request received.",
            id="the parser refuses it",
        ),
        pytest.param(
            b"GET /fail HTTP/1.1\r\nHost: t\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error",
            b"Internal Server Error",
            id="the app fails before answering",
        ),
    ],
)
async def test_a_request_that_cannot_be_answered_gets_an_error_and_its_connection_closes(
    running: Running, request_bytes: bytes, status: bytes, body: bytes
) -> None:
    reader, writer = await running.connect()
    writer.write(request_bytes)
    answer = await read_answer(reader)
    assert (answer[0], answer[1][b"connection"], answer[2]) == (status, b"close", body)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_the_app_hears_when_its_client_leaves(running: Running) -> None:
    _reader, writer = await running.connect()
    writer.write(post("/disconnect", b"abc"))
    await asyncio.sleep(0.2)
    writer.close()
    for _ in range(100):
        if "disconnected" in running.app.started:
            break
        await asyncio.sleep(0.05)
    assert running.app.started == ["/disconnect", "disconnected"]
    assert running.app.messages[-1] == {"type": "http.disconnect"}


@pytest.mark.parametrize("running", [0.5], indirect=True)
async def test_an_idle_connection_closes_after_the_keep_alive_timeout_but_not_while_busy(running: Running) -> None:
    reader, writer = await running.connect()
    writer.write(post("/held", b""))
    await asyncio.sleep(1.0)  # in flight for twice the timeout: the connection stays
    running.app.release.set()
    assert (await read_answer(reader))[2] == b"POST /held 0"
    for _ in range(3):  # requests within the timeout keep it open
        await asyncio.sleep(0.3)
        writer.write(post("/echo", b"x"))
        assert (await read_answer(reader))[2] == b"POST /echo 1"
    loop = asyncio.get_running_loop()
    idle = loop.time()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert 0.4 <= loop.time() - idle < 2.0
    writer.close()


async def test_stopping_lets_the_answer_in_flight_finish_and_closes_its_connection(running: Running) -> None:
    reader, writer = await running.connect()
    idle_reader, idle_writer = await running.connect()
    writer.write(post("/held", b"abc"))
    await asyncio.sleep(0.2)
    running.server.should_exit = True
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # an idle connection closes at once
    await asyncio.sleep(0.2)
    running.app.release.set()
    _status, headers, body = await read_answer(reader)
    assert body == b"POST /held 3"
    assert headers[b"connection"] == b"close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    idle_writer.close()


def _seen(scope: dict[str, Any]) -> dict[str, Any]:
    """What an app reads of a scope, less the request's own objects."""
    return {key: value for key, value in scope.items() if key not in (EXCHANGE, HEAD)}


async def test_a_head_seen_before_is_read_without_the_parser_and_gives_the_app_the_same_scope(
    running: Running,
) -> None:
    request = post("/known?x=1", b"abcd", b"X-Seen: once")
    protocol._known_heads.clear()
    reader, writer = await running.connect()
    for _ in range(3):
        writer.write(request)
        assert (await read_answer(reader))[2] == b"POST /known 4"
    assert request[: request.index(b"\r\n\r\n")] in protocol._known_heads
    first, *others = [_seen(scope) for scope in running.app.scopes]
    assert first["headers"] == [(b"host", b"t"), (b"content-length", b"4"), (b"x-seen", b"once")]
    assert (first["path"], first["query_string"], first["method"]) == ("/known", b"x=1", "POST")
    assert others == [first, first]
    scopes = running.app.scopes
    assert scopes[1] is not scopes[2] and scopes[1]["headers"] is not scopes[2]["headers"]  # each the app's own
    writer.close()


async def test_a_known_head_on_another_connection_gives_that_connection_s_client(running: Running) -> None:
    request = post("/known", b"ab")
    clients = []
    for _ in range(2):
        reader, writer = await running.connect()
        writer.write(request)
        assert (await read_answer(reader))[2] == b"POST /known 2"
        clients.append(writer.get_extra_info("sockname"))
        writer.close()
    assert request[: request.index(b"\r\n\r\n")] in protocol._known_heads
    assert [scope["client"] for scope in running.app.scopes] == [tuple(client) for client in clients]


async def test_known_heads_pipelined_or_cut_short_are_answered_as_any_other(running: Running) -> None:
    request = post("/known", b"abc")
    reader, writer = await running.connect()
    writer.write(request)
    assert (await read_answer(reader))[2] == b"POST /known 3"
    # Three in one read: each runs after the answer before it, in order.
    writer.write(post("/held", b"1") + request + request)
    await asyncio.sleep(0.2)
    assert running.app.started == ["/known", "/held"]
    running.app.release.set()
    assert [(await read_answer(reader))[2] for _ in range(3)] == [b"POST /held 1", b"POST /known 3", b"POST /known 3"]
    # A known head whose body comes in a later read, and one cut in the middle of its head.
    for cut in (len(request) - 2, 10):
        writer.write(request[:cut])
        await asyncio.sleep(0.05)
        writer.write(request[cut:])
        assert (await read_answer(reader))[2] == b"POST /known 3"
    # A known request followed in its read by the start of another.
    writer.write(request + request[:20])
    assert (await read_answer(reader))[2] == b"POST /known 3"
    writer.write(request[20:])
    assert (await read_answer(reader))[2] == b"POST /known 3"
    writer.close()


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(b"Expect: 100-continue", id="Expect"),
        pytest.param(b"Connection: close", id="Connection-close"),
        pytest.param(b"Upgrade: something", id="Upgrade"),
    ],
)
async def test_a_head_that_asks_more_than_an_answer_is_never_remembered(running: Running, extra: bytes) -> None:
    request = post("/asks", b"abc", extra)
    for _ in range(2):
        reader, writer = await running.connect()
        writer.write(request)
        if extra.startswith(b"Expect"):
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert (await read_answer(reader))[2] == b"POST /asks 3"
        writer.close()
    assert request[: request.index(b"\r\n\r\n")] not in protocol._known_heads


UPGRADE = (b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA")


async def test_an_upgrade_nobody_takes_is_ignored_as_triton_ignores_it(running: Running) -> None:
    # What `curl --http2` sends to an http:// address. The parser stops at the end of such
    # a head; the body and what follows it are still read, as any request's.
    reader, writer = await running.connect()
    writer.write(post("/up", b"hello", *UPGRADE) + post("/after", b"22"))
    assert (await read_answer(reader))[2] == b"POST /up 5"
    assert (await read_answer(reader))[2] == b"POST /after 2"
    request = post("/split", b"x" * 3000, *UPGRADE)
    cut = request.index(b"\r\n\r\n") + 10
    writer.write(request[:cut])
    await asyncio.sleep(0.1)
    writer.write(request[cut:] + b"GET /last HTTP/1.1\r\nHost: t\r\n" + b"\r\n".join(UPGRADE) + b"\r\n\r\n")
    assert (await read_answer(reader))[2] == b"POST /split 3000"
    assert (await read_answer(reader))[2] == b"GET /last 0"
    writer.close()
    seen = dict(running.app.scopes[0]["headers"])
    assert b"upgrade" not in seen and seen[b"connection"] == b"HTTP2-Settings"
