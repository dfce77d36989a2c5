"""Triton's gRPC transport flags on the wire: keepalive PINGs, the client's PINGs policed,
a connection's age. Each case runs against the gateway's own server (gateway.grpc_server)
and against grpc.aio's, which is grpc's core as Triton runs it, with the same options,
driven by a client that writes HTTP/2 frames itself and records every frame it reads."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from hpack import Decoder, Encoder

from gateway import grpc_server, http2
from gateway.grpc_front import own_transport
from gateway.grpc_server import Server
from gateway.settings import GatewaySettings

METHOD = "/test.Echo/Echo"
GOAWAY_TOO_MANY_PINGS = (http2.ENHANCE_YOUR_CALM, b"too_many_pings")


class Frame:
    def __init__(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        self.kind, self.flags, self.stream_id, self.payload = kind, flags, stream_id, payload

    @property
    def goaway(self) -> tuple[int, int, bytes]:
        """(last stream id, error code, debug data) of a GOAWAY."""
        last, code = struct.unpack_from(">LL", self.payload)
        return last, code, self.payload[8:]


class RawClient:
    """A gRPC client of bare HTTP/2 frames: it answers SETTINGS, answers PINGs when
    `acknowledge`, and keeps every other frame it reads, in order."""

    def __init__(self, port: int, acknowledge: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
        self.acknowledge = acknowledge
        self.frames: list[Frame] = []
        self.closed = False
        self._buffer = b""
        self._encoder = Encoder()
        self._next_stream = 1

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def pings(self, count: int, gap: float, first: int = 0) -> None:
        """Sends `count` PINGs ("ping 000", ...), reading for `gap` seconds after each."""
        for n in range(first, first + count):
            self.send(http2.frame(http2.PING, 0, 0, b"ping %03d" % n))
            self.read(gap)

    def open_call(self, message: bytes | None = b"hello") -> int:
        """Opens a call of METHOD; with a message, the client's side of it ends there."""
        stream_id, self._next_stream = self._next_stream, self._next_stream + 2
        headers = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "test")]
        block = self._encoder.encode([*headers, ("content-type", "application/grpc"), ("te", "trailers")])
        frames = http2.frame(http2.HEADERS, http2.END_HEADERS, stream_id, block)
        if message is not None:
            prefixed = b"\0" + struct.pack(">L", len(message)) + message
            frames += http2.frame(http2.DATA, http2.END_STREAM, stream_id, prefixed)
        self.send(frames)
        return stream_id

    def read(self, seconds: float) -> list[Frame]:
        """What arrives within `seconds` (less, if the server closes the connection)."""
        start = len(self.frames)
        deadline = time.monotonic() + seconds
        while not self.closed and (left := deadline - time.monotonic()) > 0:
            if not select.select([self.sock], [], [], left)[0]:
                continue
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                break
            self._buffer += data
            self._take_frames()
        return self.frames[start:]

    def _take_frames(self) -> None:
        while len(self._buffer) >= 9:
            length = int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < 9 + length:
                return
            kind, flags = self._buffer[3], self._buffer[4]
            stream_id = int.from_bytes(self._buffer[5:9], "big") & 0x7FFFFFFF
            payload, self._buffer = self._buffer[9 : 9 + length], self._buffer[9 + length :]
            if kind == http2.SETTINGS:
                if not flags & http2.ACK:
                    self.send(http2.frame(http2.SETTINGS, http2.ACK, 0))
                continue
            if kind == http2.WINDOW_UPDATE:
                continue
            if kind == http2.PING and not flags & http2.ACK and self.acknowledge:
                self.send(http2.frame(http2.PING, http2.ACK, 0, payload))
            self.frames.append(Frame(kind, flags, stream_id, payload))

    def of(self, kind: int, flags: int | None = None) -> list[Frame]:
        return [f for f in self.frames if f.kind == kind and (flags is None or f.flags & http2.ACK == flags)]

    def status(self) -> tuple[bytes, bytes]:
        """grpc-status and grpc-message of the one call's trailers-only answer."""
        (trailers,) = self.of(http2.HEADERS)
        headers = dict(Decoder().decode(trailers.payload, raw=True))
        return headers[b"grpc-status"], headers[b"grpc-message"]

    def close(self) -> None:
        self.sock.close()


async def _echo(request: bytes, context: Any) -> bytes:
    return request


@pytest.fixture(params=["own", "grpc"])
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Any]]:
    """Starts a server of METHOD with Triton's transport flags (GatewaySettings fields);
    returns its port. "own": gateway.grpc_server; "grpc": grpc.aio with the same options."""
    servers: list[Any] = []

    async def start(**flags: Any) -> int:
        settings = GatewaySettings(**flags)
        server: Any
        if request.param == "own":
            server = Server(transport=own_transport(settings))
        else:
            from gateway.grpc_front import transport_options

            server = grpc.aio.server(options=transport_options(settings))
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
        port: int = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return port

    yield start
    for server in servers:
        await server.stop(None)


async def _client(work: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, work)


async def test_pings_on_an_idle_connection_past_the_strikes_end_it(serve: Any) -> None:
    # Without calls, a PING within two hours of the one before is a strike; the third
    # strike (Triton's --grpc-http2-max-ping-strikes=2) ends the connection.
    port = await serve()

    def work() -> RawClient:
        client = RawClient(port)
        client.pings(5, 0.1)
        client.read(0.3)
        client.close()
        return client

    client = await _client(work)
    assert [f.payload for f in client.of(http2.PING, http2.ACK)] == [b"ping %03d" % n for n in range(4)]
    (goaway,) = client.of(http2.GOAWAY)
    assert goaway.goaway[1:] == GOAWAY_TOO_MANY_PINGS
    assert client.frames[-1] is goaway and client.closed


async def test_an_answer_forgives_the_strikes(serve: Any) -> None:
    port = await serve()

    def work() -> RawClient:
        client = RawClient(port)
        client.pings(3, 0.1)  # two strikes
        client.open_call()
        client.read(0.5)
        client.pings(3, 0.1, first=3)  # two strikes again, not four
        client.close()
        return client

    client = await _client(work)
    assert len(client.of(http2.PING, http2.ACK)) == 6
    assert not client.of(http2.GOAWAY) and not client.closed
    assert len(client.of(http2.DATA)) == 1


async def test_a_call_cut_off_by_too_many_pings_ends_unavailable(serve: Any) -> None:
    port = await serve(grpc_http2_min_recv_ping_interval_without_data=10_000)

    def work() -> RawClient:
        client = RawClient(port)
        client.open_call(message=None)  # open, waiting for its message
        client.read(0.2)
        client.pings(6, 0.05)
        client.read(0.5)
        client.close()
        return client

    client = await _client(work)
    assert client.of(http2.GOAWAY)[0].goaway == (1, *GOAWAY_TOO_MANY_PINGS)
    assert client.status() == (b"14", b"Too many pings")
    assert client.closed


async def test_pings_as_often_as_allowed_are_answered(serve: Any) -> None:
    port = await serve(grpc_keepalive_permit_without_calls=True, grpc_http2_min_recv_ping_interval_without_data=200)

    def work() -> RawClient:
        client = RawClient(port)
        client.pings(4, 0.3)
        client.close()
        return client

    client = await _client(work)
    assert len(client.of(http2.PING, http2.ACK)) == 4
    assert not client.of(http2.GOAWAY) and not client.closed


def _listen(port: int, seconds: float, call: bool = False, acknowledge: bool = True) -> tuple[RawClient, float]:
    """A client that connects (and opens a call that waits for its message, with `call`),
    reads for `seconds` or until the server closes, and leaves: (it, the seconds it read)."""
    client = RawClient(port, acknowledge)
    if call:
        client.open_call(message=None)
    started = time.monotonic()
    client.read(seconds)
    elapsed = time.monotonic() - started
    client.close()
    return client, elapsed


async def test_keepalive_pings_a_client_that_answers(serve: Any) -> None:
    port = await serve(grpc_keepalive_time=200, grpc_keepalive_timeout=200, grpc_keepalive_permit_without_calls=True)
    client, _ = await _client(lambda: _listen(port, 1.5))
    assert 3 <= len(client.of(http2.PING, 0)) <= 8
    assert not client.closed


async def test_keepalive_leaves_a_connection_without_calls_alone(serve: Any) -> None:
    port = await serve(grpc_keepalive_time=200, grpc_keepalive_timeout=200)
    client, _ = await _client(lambda: _listen(port, 1.0))
    assert not client.of(http2.PING, 0) and not client.closed


async def test_a_connection_past_its_age_is_told_in_two_goaways(serve: Any) -> None:
    # GOAWAY naming no last stream, a PING; once it is answered, GOAWAY naming the last
    # stream opened; then, its calls over, the connection is closed.
    port = await serve(grpc_max_connection_age=300, grpc_max_connection_age_grace=5000)

    def work() -> RawClient:
        client = RawClient(port)
        client.open_call()
        client.read(1.5)
        client.close()
        return client

    client = await _client(work)
    kinds = [f.kind for f in client.frames if f.kind in (http2.GOAWAY, http2.DATA)]
    assert kinds == [http2.DATA, http2.GOAWAY, http2.GOAWAY]
    first, final = (f.goaway for f in client.of(http2.GOAWAY))
    assert first == (http2.LAST_STREAM, http2.NO_ERROR, b"max_age")
    assert final == (1, http2.NO_ERROR, b"max_age")
    assert client.closed


async def test_calls_still_open_at_the_end_of_the_grace_are_unavailable(serve: Any) -> None:
    port = await serve(grpc_max_connection_age=300, grpc_max_connection_age_grace=500)
    client, elapsed = await _client(lambda: _listen(port, 4.0, call=True))
    assert client.status() == (b"14", b"max connection age")
    assert client.closed and 0.5 < elapsed < 3.5


async def _unanswering_client_of_own_server(settings: GatewaySettings) -> tuple[RawClient, float]:
    """_listen's client that answers no PING, of gateway.grpc_server alone."""
    server = Server(transport=own_transport(settings))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        result: tuple[RawClient, float] = await _client(lambda: _listen(port, 4.0, acknowledge=False))
        return result
    finally:
        await server.stop(None)


async def test_keepalive_closes_a_connection_whose_client_does_not_answer() -> None:
    # The own server alone: grpc.aio (grpc 1.85) was seen to keep such a connection open
    # for seconds past --grpc-keepalive-timeout, which says it is closed then.
    settings = GatewaySettings(
        grpc_keepalive_time=200, grpc_keepalive_timeout=300, grpc_keepalive_permit_without_calls=True
    )
    client, elapsed = await _unanswering_client_of_own_server(settings)
    assert len(client.of(http2.PING, 0)) == 1
    assert client.closed and 0.4 < elapsed < 3.5


async def test_the_final_goaway_goes_even_if_its_ping_is_never_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_server, "_GOAWAY_PING_TIMEOUT", 0.3)
    client, elapsed = await _unanswering_client_of_own_server(GatewaySettings(grpc_max_connection_age=300))
    assert [f.goaway[0] for f in client.of(http2.GOAWAY)] == [http2.LAST_STREAM, 0]
    assert client.closed and 0.5 < elapsed < 3.5
