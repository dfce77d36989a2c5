"""The infer lane over a real Unix socket and a real TCP socket, plain and with TLS."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from protos.lane import (
    LANE_PROTOCOL,
    MAX_FRAME,
    TLS_HANDSHAKE_TIMEOUT_SECS,
    Kind,
    LaneClient,
    LaneMismatch,
    LaneServer,
    decode_error,
    encode_error,
    hello,
    read_hello,
)
from protos.rpc import MAX_MESSAGE_BYTES
from protos.status import Status, TurnoutError
from tests.pki import Pki


async def _handler(view: memoryview, request_id: str) -> bytes:
    payload = bytes(view)
    if payload == b"whose":
        return request_id.encode()
    if payload == b"missing":
        raise TurnoutError(Status.NOT_FOUND, "Request for unknown model: 'missing' is not found")
    if payload == b"boom":
        raise RuntimeError("exploded")
    if payload.startswith(b"grow:"):
        return bytes(int(payload[5:]))
    if payload.startswith(b"slow"):
        await asyncio.sleep(0.05)
    return payload[::-1]


def server_context(pki: Pki, mutual: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if mutual:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(pki: Pki, certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if certificate:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


async def start(server: LaneServer, kind: str, folder: Path, tls: ssl.SSLContext | None = None) -> str:
    if kind == "unix":
        return await server.start_unix(str(folder / "lane.sock"), tls)
    return await server.start_tcp("127.0.0.1", 0, tls)


@pytest.fixture(params=["unix", "tcp", "unix+mtls", "tcp+mtls"])
async def lane(request: pytest.FixtureRequest, tmp_path, pki):
    kind, _, tls = request.param.partition("+")
    server = LaneServer(_handler)
    if tls:
        address = await start(server, kind, tmp_path, server_context(pki, mutual=True))
        client = LaneClient(address, client_context(pki), "127.0.0.1")
    else:
        client = LaneClient(await start(server, kind, tmp_path))
    yield server, client
    client.close()
    server.stop_accepting()


async def test_replies_match_their_requests_under_concurrency(lane) -> None:
    _, client = lane
    payloads = [f"request-{i}".encode() * (i + 1) for i in range(200)]
    replies = await asyncio.gather(*(client.call(p) for p in payloads))
    assert replies == [p[::-1] for p in payloads]


async def test_the_request_id_rides_the_frame_beside_the_payload(lane) -> None:
    _, client = lane
    assert await client.call(b"whose", "gw-1-42") == b"gw-1-42"
    assert await client.call(b"whose") == b""
    assert await client.call(b"whose", "\u00e9" * 200) == ("\u00e9" * 127).encode()  # cut at 255 bytes, whole chars
    assert await client.call(b"plain", "id-7") == b"nialp"


async def test_large_payload_crosses_intact(lane) -> None:
    _, client = lane
    payload = bytes(range(256)) * 40_000  # 10 MB, many reads
    assert await client.call(payload) == payload[::-1]


async def test_errors_keep_status_and_text_and_the_lane_keeps_serving(lane) -> None:
    _, client = lane
    with pytest.raises(TurnoutError) as caught:
        await client.call(b"missing")
    assert caught.value.status is Status.NOT_FOUND
    assert caught.value.message == "Request for unknown model: 'missing' is not found"
    with pytest.raises(TurnoutError) as caught:
        await client.call(b"boom")
    assert caught.value.status is Status.INTERNAL
    assert caught.value.message == "exploded"
    assert await client.call(b"ok") == b"ko"


def _handler_at_once(view: memoryview, request_id: str) -> bytes | Awaitable[bytes]:
    """Answers "now:..." at once (bytes, or an error raised before any await), the rest as
    _handler does; records the task each call began on (None: the lane's read callback)."""
    began.append(asyncio.current_task())
    payload = bytes(view)
    if payload == b"now:missing":
        raise TurnoutError(Status.NOT_FOUND, "Request for unknown model: 'missing' is not found")
    if payload == b"now:boom":
        raise RuntimeError("exploded")
    if payload.startswith(b"now:grow:"):
        return bytes(int(payload[9:]))
    if payload.startswith(b"now:"):
        return payload[::-1]
    return _handler(view, request_id)


began: list[asyncio.Task[object] | None] = []


async def test_a_handler_may_answer_at_once_without_a_task(tmp_path) -> None:
    server = LaneServer(_handler_at_once)
    client = LaneClient(await start(server, "unix", tmp_path), max_frame=SMALL_FRAME)
    began.clear()
    try:
        assert await asyncio.gather(client.call(b"now:1"), client.call(b"slow"), client.call(b"now:2")) == [
            b"1:won",
            b"wols",
            b"2:won",
        ]
        assert began == [None, None, None]  # each began in the read callback; "slow" then ran as a task
        for payload, status, text in (
            (b"now:missing", Status.NOT_FOUND, "Request for unknown model: 'missing' is not found"),
            (b"now:boom", Status.INTERNAL, "exploded"),
            (
                b"now:grow:%d" % (SMALL_FRAME + 1),
                Status.INTERNAL,
                f"Sent message larger than max ({SMALL_FRAME + 1} vs. {SMALL_FRAME})",
            ),
        ):
            with pytest.raises(TurnoutError) as caught:
                await client.call(payload)
            assert (caught.value.status, caught.value.message) == (status, text)
        assert await client.call(b"now:ok") == b"ko:won"
    finally:
        client.close()
        server.stop_accepting()


async def test_drain_waits_for_in_flight_answers(lane) -> None:
    server, client = lane
    call = asyncio.ensure_future(client.call(b"slow-1"))
    await asyncio.sleep(0.01)
    server.stop_accepting()
    await server.drain(timeout=5)
    assert await call == b"1-wols"


async def test_unreachable_sidecar_is_unavailable(tmp_path) -> None:
    client = LaneClient(f"unix:{tmp_path / 'nobody.sock'}")
    with pytest.raises(TurnoutError) as caught:
        await client.call(b"x")
    assert caught.value.status is Status.UNAVAILABLE


@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path, pki, kind) -> None:
    server = LaneServer(_handler)
    client = LaneClient(
        await start(server, kind, tmp_path, server_context(pki, mutual=True)), client_context(pki, False)
    )
    try:
        # TLS 1.3 finishes the client's side of the handshake first; the refusal ends the
        # connection under the request.
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"x")
        assert caught.value.status is Status.UNAVAILABLE
        assert caught.value.message.startswith("connection to sidecar lost")
        welcome = LaneClient(client.address, client_context(pki))
        assert await welcome.call(b"x") == b"x"
        welcome.close()
    finally:
        client.close()
        server.stop_accepting()


async def test_a_certificate_from_another_ca_fails_the_handshake(tmp_path, pki, tmp_path_factory) -> None:
    other = Pki(tmp_path_factory.mktemp("other_pki"))
    server = LaneServer(_handler)
    client = LaneClient(await start(server, "tcp", tmp_path, server_context(other, mutual=False)), client_context(pki))
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"x")
        assert caught.value.status is Status.UNAVAILABLE
        assert "TLS handshake with the sidecar at" in caught.value.message
        assert "CERTIFICATE_VERIFY_FAILED" in caught.value.message
        assert isinstance(caught.value.__cause__, ssl.SSLError)  # the connect failed: a replica may retry it
    finally:
        client.close()
        server.stop_accepting()


async def test_a_plain_client_gets_no_answer_from_a_tls_lane(tmp_path, pki) -> None:
    server = LaneServer(_handler)
    client = LaneClient(await start(server, "unix", tmp_path, server_context(pki, mutual=False)))
    try:
        with pytest.raises(TurnoutError) as caught:
            await asyncio.wait_for(client.call(b"x"), 10)
        assert caught.value.message.startswith("connection to sidecar lost")
    finally:
        client.close()
        server.stop_accepting()


async def test_a_tls_client_of_a_plain_lane_gives_up_after_the_handshake_timeout(tmp_path, pki) -> None:
    server = LaneServer(_handler)
    client = LaneClient(await start(server, "tcp", tmp_path), client_context(pki))
    started = time.monotonic()
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"x")
        assert caught.value.message.endswith("did not answer the TLS handshake; does it serve TLS?")
        assert time.monotonic() - started < TLS_HANDSHAKE_TIMEOUT_SECS + 3
    finally:
        client.close()
        server.stop_accepting()


# --- frame limits ---

SMALL_FRAME = 64 * 1024
HEADER = struct.Struct("<IQB")


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    length, call_id, kind = HEADER.unpack(await asyncio.wait_for(reader.readexactly(HEADER.size), 10))
    return call_id, kind, await reader.readexactly(length)


def frame(call_id: int, kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), call_id, kind) + payload


async def greeted(address: str, version: int = LANE_PROTOCOL) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw peer of a LaneServer that has said HELLO (and read the answer)."""
    reader, writer = await asyncio.open_unix_connection(address[5:])
    writer.write(frame(0, Kind.HELLO, hello(MAX_FRAME, version)))
    call_id, kind, payload = await read_frame(reader)
    assert (call_id, kind, read_hello(payload)) == (0, Kind.HELLO, (LANE_PROTOCOL, MAX_FRAME))
    return reader, writer


async def test_the_limit_carries_the_largest_grpc_message_and_its_request_id() -> None:
    assert MAX_FRAME == MAX_MESSAGE_BYTES + 1 + 255
    assert MAX_FRAME < 2**32  # the header's u32 length can say it


@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_a_client_refuses_a_frame_over_the_limit_its_sidecar_stated(tmp_path, kind) -> None:
    server = LaneServer(_handler, max_frame=SMALL_FRAME)
    client = LaneClient(await start(server, kind, tmp_path))  # a larger limit of its own
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(bytes(SMALL_FRAME), "id")
        assert caught.value.status is Status.INVALID_ARG
        assert caught.value.message == f"Sent message larger than max ({SMALL_FRAME + 3} vs. {SMALL_FRAME})"
        # Nothing was sent: the connection serves on, up to the limit itself.
        replies = await asyncio.gather(*(client.call(b"after-%d" % i) for i in range(20)))
        assert replies == [(b"after-%d" % i)[::-1] for i in range(20)]
        assert await client.call(bytes(SMALL_FRAME - 1)) == bytes(SMALL_FRAME - 1)
    finally:
        client.close()
        server.stop_accepting()


async def test_a_frame_that_claims_4_gib_closes_that_connection_from_its_header_alone(tmp_path, caplog) -> None:
    server = LaneServer(_handler)
    address = await start(server, "unix", tmp_path)
    bystander = LaneClient(address)
    assert await bystander.call(b"before") == b"erofeb"
    reader, writer = await greeted(address)
    try:
        # The length says 4 GiB - 1 and no payload follows: the answer cannot wait for it.
        with caplog.at_level(logging.ERROR, "protos.lane"):
            writer.write(HEADER.pack(2**32 - 1, 7, Kind.INFER) + b"\0" * 1000)
            call_id, kind, payload = await read_frame(reader)
            assert await asyncio.wait_for(reader.read(), 10) == b""  # and then the connection closes
        error = decode_error(payload)
        assert (call_id, kind) == (7, Kind.ERROR)
        assert (error.status, error.message) == (
            Status.INVALID_ARG,
            f"Received message larger than max ({2**32 - 1} vs. {MAX_FRAME})",
        )
        assert f"closing the lane connection from {address}" in caplog.text
        assert f"it sent a frame of {2**32 - 1} bytes, over the limit of {MAX_FRAME}" in caplog.text
        assert await bystander.call(b"after") == b"retfa"  # other connections never noticed
    finally:
        writer.close()
        bystander.close()
        server.stop_accepting()


async def test_a_reply_over_the_gateways_stated_limit_becomes_an_error(tmp_path) -> None:
    server = LaneServer(_handler)
    client = LaneClient(await start(server, "unix", tmp_path), max_frame=SMALL_FRAME)
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"grow:%d" % (SMALL_FRAME + 1))
        assert (caught.value.status, caught.value.message) == (
            Status.INTERNAL,
            f"Sent message larger than max ({SMALL_FRAME + 1} vs. {SMALL_FRAME})",
        )
        assert await client.call(b"ok") == b"ko"
    finally:
        client.close()
        server.stop_accepting()


class RawSidecar:
    """A lane peer that answers as `script` says: (call_id, kind, payload) in, bytes out."""

    def __init__(self, script) -> None:
        self.script = script
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                length, call_id, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
                writer.write(self.script(call_id, kind, await reader.readexactly(length)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


def answers_hello(version: int = LANE_PROTOCOL):
    def script(call_id: int, kind: int, payload: bytes) -> bytes:
        if kind == Kind.HELLO:
            return frame(0, Kind.HELLO, hello(MAX_FRAME, version))
        payload = payload[1 + payload[0] :]  # past the request id
        if payload == b"huge":  # a header over the gateway's limit, and never its payload
            return HEADER.pack(SMALL_FRAME + 1, call_id, Kind.REPLY)
        if payload == b"slow":
            return b""
        return frame(call_id, Kind.REPLY, payload[::-1])

    return script


async def test_a_sidecar_frame_over_the_gateways_limit_closes_the_connection(caplog) -> None:
    fake = RawSidecar(answers_hello())
    address = await fake.start()
    client = LaneClient(address, max_frame=SMALL_FRAME)
    try:
        waiting = asyncio.ensure_future(client.call(b"slow"))
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.ERROR, "protos.lane"), pytest.raises(TurnoutError) as caught:
            await client.call(b"huge")
        assert (caught.value.status, caught.value.message) == (
            Status.INTERNAL,
            f"Received message larger than max ({SMALL_FRAME + 1} vs. {SMALL_FRAME})",
        )
        size = SMALL_FRAME + 1
        why = f"the sidecar at {address} sent a frame of {size} bytes, over this gateway's limit of {SMALL_FRAME}"
        assert why in caplog.text
        # The other call in flight on that connection learns why it was lost.
        with pytest.raises(TurnoutError) as lost:
            await asyncio.wait_for(waiting, 10)
        assert lost.value.status is Status.UNAVAILABLE
        assert lost.value.message == f"connection to sidecar lost: {why}; the connection was closed"
        assert await client.call(b"again") == b"niaga"  # a fresh connection
        assert fake.connections == 2
    finally:
        client.close()
        fake.close()


# --- the handshake ---


@pytest.mark.parametrize("theirs, upgrade", [(LANE_PROTOCOL + 1, "gateway"), (LANE_PROTOCOL - 1, "sidecar")])
async def test_a_sidecar_of_another_version_is_refused_in_clear_words(theirs: int, upgrade: str) -> None:
    server = RawSidecar(answers_hello(theirs))
    address = await server.start()
    client = LaneClient(address)
    try:
        for _ in range(2):  # every connection attempt says the same
            with pytest.raises(LaneMismatch) as caught:
                await client.call(b"x")
            assert caught.value.status is Status.UNAVAILABLE
            assert caught.value.message.startswith(f"the sidecar at {address} speaks lane protocol {theirs}")
            assert caught.value.message.endswith(
                f", this gateway speaks {LANE_PROTOCOL}; upgrade the {upgrade} so both speak the same version"
            )
    finally:
        client.close()
        server.close()


async def test_a_sidecar_from_before_the_handshake_is_named_as_such() -> None:
    # Such a sidecar takes the HELLO for a request and answers it with an error.
    def before(call_id: int, kind: int, payload: bytes) -> bytes:
        return frame(call_id, Kind.ERROR, encode_error(TurnoutError(Status.INTERNAL, "Error parsing message")))

    server = RawSidecar(before)
    address = await server.start()
    client = LaneClient(address)
    try:
        with pytest.raises(LaneMismatch) as caught:
            await client.call(b"x")
        assert caught.value.message == (
            f"the sidecar at {address} speaks lane protocol 1 (it predates the lane handshake), this gateway "
            f"speaks {LANE_PROTOCOL}; upgrade the sidecar so both speak the same version"
        )
    finally:
        client.close()
        server.close()


async def test_a_sidecar_refuses_a_gateway_of_another_version(tmp_path, caplog) -> None:
    server = LaneServer(_handler)
    address = await start(server, "unix", tmp_path)
    try:
        with caplog.at_level(logging.ERROR, "protos.lane"):
            for _ in range(3):  # a gateway's readiness probes try again and again
                reader, writer = await asyncio.open_unix_connection(address[5:])
                writer.write(frame(0, Kind.HELLO, hello(MAX_FRAME, LANE_PROTOCOL + 1)))
                call_id, kind, payload = await read_frame(reader)
                assert (call_id, kind, read_hello(payload)) == (0, Kind.HELLO, (LANE_PROTOCOL, MAX_FRAME))  # its own
                assert await asyncio.wait_for(reader.read(), 10) == b""  # ...and closes
                writer.close()
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert said == [
            f"refusing a lane connection: the gateway at {address} speaks lane protocol {LANE_PROTOCOL + 1}, "
            f"this sidecar speaks {LANE_PROTOCOL}; upgrade the sidecar so both speak the same version"
        ]  # once, not once per attempt
    finally:
        server.stop_accepting()


async def test_a_gateway_from_before_the_handshake_gets_its_request_refused_in_words(tmp_path) -> None:
    server = LaneServer(_handler)
    address = await start(server, "unix", tmp_path)
    try:
        reader, writer = await asyncio.open_unix_connection(address[5:])
        writer.write(frame(3, Kind.INFER, b"\0ping"))  # no HELLO: straight to a request
        call_id, kind, payload = await read_frame(reader)
        error = decode_error(payload)
        assert (call_id, kind, error.status) == (3, Kind.ERROR, Status.UNAVAILABLE)
        assert error.message == (
            f"the gateway at {address} speaks lane protocol 1 (it predates the lane handshake), this sidecar "
            f"speaks {LANE_PROTOCOL}; upgrade the gateway so both speak the same version"
        )
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        server.stop_accepting()


async def test_a_sidecar_that_never_answers_the_handshake_is_given_up_on(monkeypatch) -> None:
    server = RawSidecar(lambda *frame: b"")
    address = await server.start()
    monkeypatch.setattr("protos.lane.HELLO_TIMEOUT_SECS", 0.2)
    client = LaneClient(address)
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"x")
        assert caught.value.message == f"the sidecar at {address} did not answer the lane handshake"
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_the_lane_serves_on_uvloop(tmp_path, kind) -> None:
    # uvloop's transports are not asyncio.Transport subclasses; the lane must not ask.
    uvloop = pytest.importorskip("uvloop")

    async def exchange() -> list[bytes]:
        server = LaneServer(_handler)
        client = LaneClient(await start(server, kind, tmp_path))
        try:
            return await asyncio.wait_for(asyncio.gather(client.call(b"abc"), client.call(b"slow")), 5)
        finally:
            client.close()
            server.stop_accepting()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(exchange()) == [b"cba", b"wols"]


async def _streamer(view: memoryview, request_id: str) -> AsyncIterator[tuple[bytes | TurnoutError, bool]]:
    """Answers `n:<count>[:last|:fail|:wrong]` with <count> parts, then the ending it names
    (`wrong`: an error answer with more to follow, then a last one)."""
    _, count, ending = (bytes(view).decode() + ":").split(":")[:3]
    for index in range(int(count)):
        await asyncio.sleep(0)
        yield f"{request_id}-{index}".encode(), False
    if ending == "last":
        yield b"last", True
    elif ending == "fail":
        raise TurnoutError(Status.INTERNAL, "the model failed mid-stream")
    elif ending == "wrong":
        yield TurnoutError(Status.INVALID_ARG, "one answer went wrong"), False
        yield b"after", True
    elif ending.startswith("big"):
        yield bytes(int(ending[3:])), False


@pytest.fixture
async def stream_lane(tmp_path: Path):
    server = LaneServer(_handler, stream_handler=_streamer)
    client = LaneClient(await start(server, "unix", tmp_path))
    yield client
    client.close()
    server.stop_accepting()


async def _answers(client: LaneClient, payload: bytes, request_id: str) -> list[tuple[bytes | TurnoutError, bool]]:
    return [answer async for answer in client.stream(payload, request_id)]


async def test_a_stream_call_gets_its_parts_in_order_then_its_last(stream_lane) -> None:
    assert await _answers(stream_lane, b"n:3:last", "a") == [
        (b"a-0", False),
        (b"a-1", False),
        (b"a-2", False),
        (b"last", True),
    ]
    # A stream that ends without a last answer ends with an empty one.
    assert await _answers(stream_lane, b"n:2", "b") == [(b"b-0", False), (b"b-1", False), (b"", True)]


async def test_concurrent_streams_and_calls_keep_their_answers_apart(stream_lane) -> None:
    streams = [_answers(stream_lane, b"n:5:last", f"s{i}") for i in range(20)]
    calls = [stream_lane.call(f"call-{i}".encode()) for i in range(20)]
    results = await asyncio.gather(*streams, *calls)
    for i, answers in enumerate(results[:20]):
        assert answers == [(f"s{i}-{k}".encode(), False) for k in range(5)] + [(b"last", True)]
    assert results[20:] == [f"call-{i}".encode()[::-1] for i in range(20)]


async def test_a_stream_error_ends_the_stream_after_its_parts(stream_lane) -> None:
    got = []
    with pytest.raises(TurnoutError) as caught:
        async for answer in stream_lane.stream(b"n:1:fail", "c"):
            got.append(answer)
    assert got == [(b"c-0", False)]
    assert caught.value.message == "the model failed mid-stream"


async def test_an_error_answer_with_more_to_follow_keeps_the_stream_going(stream_lane) -> None:
    (first, more), (error, also_more), after = await _answers(stream_lane, b"n:1:wrong", "w")
    assert (first, more, also_more, after) == (b"w-0", False, False, (b"after", True))
    assert isinstance(error, TurnoutError)
    assert (error.status, error.message) == (Status.INVALID_ARG, "one answer went wrong")


async def test_a_stream_to_a_server_without_a_stream_handler_gets_one_reply(lane) -> None:
    _, client = lane
    assert [answer async for answer in client.stream(b"abc")] == [(b"cba", True)]


async def test_a_stream_answer_over_the_clients_limit_ends_the_stream_with_an_error(tmp_path: Path) -> None:
    server = LaneServer(_handler, stream_handler=_streamer)
    client = LaneClient(await start(server, "unix", tmp_path), max_frame=SMALL_FRAME)
    try:
        got = []
        with pytest.raises(TurnoutError) as caught:
            async for answer in client.stream(f"n:1:big{SMALL_FRAME + 1}".encode(), "d"):
                got.append(answer)
        assert got == [(b"d-0", False)]
        assert caught.value.message == f"Received message larger than max ({SMALL_FRAME + 1} vs. {SMALL_FRAME})"
        assert [answer async for answer in client.stream(b"n:0:last")] == [(b"last", True)]  # the lane serves on
    finally:
        client.close()
        server.stop_accepting()
