"""The gateway's own gRPC server (gateway.grpc_server), driven by grpc's own client: what a
grpc.aio server would answer, call by call."""

from __future__ import annotations

import asyncio
import os
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway import http2
from gateway.grpc_front import own_server_serves, own_transport
from gateway.grpc_server import Server, Transport, _percent_encoded, _timeout
from gateway.settings import GatewaySettings
from tests.harness import flood, loopback_bytes

SERVICE = "test.Echo"


class Handlers:
    """Echoes and misbehaviours, recording what each call saw."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self.cancelled = asyncio.Event()
        self.done: list[bool] = []

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.seen["metadata"] = context.invocation_metadata()
        self.seen["remaining"] = context.time_remaining()
        context.add_done_callback(lambda ctx: self.done.append(ctx.cancelled()))
        return request

    async def abort(self, request: bytes, context: Any) -> bytes:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, request.decode(), (("cause", "model"), ("raw-bin", b"\0\1"))
        )
        raise AssertionError("abort raises")

    async def fail(self, request: bytes, context: Any) -> bytes:
        raise ValueError("broken")

    async def bad_trailers(self, request: bytes, context: Any) -> bytes:
        context.set_trailing_metadata((("x-count", 5),))  # neither str nor bytes
        return request

    async def hang(self, request: bytes, context: Any) -> bytes:
        context.add_done_callback(lambda ctx: self.done.append(ctx.cancelled()))
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def chat(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.upper()

    async def stream_out(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        noise = os.urandom(65536)  # answers are compressed: these stay their size
        for count in range(int(request)):
            self.seen["streamed"] = count
            yield noise

    async def counted(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        count = 0
        async for _ in requests:
            count += 1
            self.seen["read"] = count
            if count == 1:
                yield b"first"
                await asyncio.sleep(60)  # never reads on: the client must be held back


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, grpc.aio.Channel, Handlers]]:
    handlers = Handlers()
    compressed = frozenset(f"/{SERVICE}/{name}" for name in ("Echo", "StreamOut"))
    server = Server(compression=b"gzip", compressed=compressed, max_receive=8 << 20)
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(handlers.echo),
        "Plain": grpc.unary_unary_rpc_method_handler(handlers.echo),  # answers never compressed
        "Abort": grpc.unary_unary_rpc_method_handler(handlers.abort),
        "Fail": grpc.unary_unary_rpc_method_handler(handlers.fail),
        "BadTrailers": grpc.unary_unary_rpc_method_handler(handlers.bad_trailers),
        "Hang": grpc.unary_unary_rpc_method_handler(handlers.hang),
        "Chat": grpc.stream_stream_rpc_method_handler(handlers.chat),
        "StreamOut": grpc.unary_stream_rpc_method_handler(handlers.stream_out),
        "Counted": grpc.stream_stream_rpc_method_handler(handlers.counted),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)])
    yield server, channel, handlers
    await channel.close()
    await server.stop(None)


def unary(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/{SERVICE}/{name}")


async def test_unary_echo_with_metadata_and_deadline(served: Any) -> None:
    _, channel, handlers = served
    metadata = (("x-key", "one"), ("x-blob-bin", b"\0\xff\1"), ("x-key", "two"))
    assert await unary(channel, "Echo")(b"hello", metadata=metadata, timeout=30) == b"hello"
    seen = handlers.seen["metadata"]
    # grpc's client sends a key's values together; each keeps its type (bytes for -bin keys).
    assert sorted(pair for pair in seen if pair[0].startswith("x-")) == sorted(metadata)
    assert seen[0][0] == "user-agent"
    # grpc's client rounds the timeout it sends up (to 100 ms steps here), so a little over 30.
    assert 25 < handlers.seen["remaining"] <= 31
    assert await unary(channel, "Echo")(b"") == b""
    assert handlers.seen["remaining"] is None
    await asyncio.sleep(0.05)
    assert handlers.done == [False, False]


@pytest.mark.parametrize("size", [0, 1, 65535, 70000, 1 << 20])
async def test_messages_cross_flow_control_both_ways(served: Any, size: int) -> None:
    _, channel, _ = served
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    assert await unary(channel, "Echo")(payload) == payload


async def test_many_calls_at_once(served: Any) -> None:
    _, channel, _ = served
    payloads = [str(i).encode() * (i % 7 * 5000) for i in range(300)]
    assert await asyncio.gather(*(unary(channel, "Echo")(p) for p in payloads)) == payloads


async def test_abort_answers_its_status_details_and_trailing_metadata(served: Any) -> None:
    _, channel, _ = served
    call = unary(channel, "Abort")("bad input: é 100%".encode())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "bad input: é 100%"
    assert ("cause", "model") in tuple(caught.value.trailing_metadata())
    assert ("raw-bin", b"\0\1") in tuple(caught.value.trailing_metadata())


async def test_an_unexpected_error_is_unknown(served: Any) -> None:
    _, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Fail")(b"")
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "Unexpected <class 'ValueError'>: broken"


async def test_trailing_metadata_that_cannot_be_sent_still_ends_the_call(served: Any) -> None:
    _, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "BadTrailers")(b"x", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert "AttributeError" in caught.value.details()
    assert await unary(channel, "Echo")(b"still serving") == b"still serving"


async def test_an_unknown_method_is_unimplemented(served: Any) -> None:
    _, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Nope")(b"x" * 100000)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert caught.value.details() == "Method not found!"
    assert await unary(channel, "Echo")(b"still") == b"still"


async def test_a_message_over_the_limit_is_refused_from_its_prefix(served: Any) -> None:
    _, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Echo")(b"x" * ((8 << 20) + 1))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == f"Received message larger than max ({(8 << 20) + 1} vs. {8 << 20})"
    assert await unary(channel, "Echo")(b"after") == b"after"


async def test_a_deadline_ends_the_call_and_cancels_its_handler(served: Any) -> None:
    _, channel, handlers = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Hang")(b"", timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_a_client_cancelling_cancels_the_handler(served: Any) -> None:
    _, channel, handlers = served
    call = unary(channel, "Hang")(b"")
    await asyncio.sleep(0.2)
    call.cancel()
    await asyncio.wait_for(handlers.cancelled.wait(), 5)
    await asyncio.sleep(0.05)
    assert handlers.done == [True]


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_compressed_requests_are_read(served: Any, compression: grpc.Compression) -> None:
    _, channel, _ = served
    payload = b"compress me " * 50000
    assert await unary(channel, "Echo")(payload, compression=compression) == payload


async def test_a_compressed_request_past_the_limit_once_decompressed_is_refused(served: Any) -> None:
    _, channel, _ = served
    bomb = b"\0" * (64 << 20)  # compresses to about 64 KiB
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Echo")(bomb, compression=grpc.Compression.Gzip)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await unary(channel, "Echo")(b"ok") == b"ok"


@pytest.mark.skipif(not Path("/proc/net/dev").exists(), reason="counts loopback bytes through /proc")
async def test_answers_are_compressed_for_clients_that_accept_gzip(served: Any) -> None:
    _, channel, _ = served
    zeros = b"\0" * (4 << 20)
    assert await unary(channel, "Echo")(zeros, compression=grpc.Compression.Gzip) == zeros
    before = loopback_bytes()
    assert await unary(channel, "Echo")(zeros, compression=grpc.Compression.Gzip) == zeros
    assert loopback_bytes() - before < 1 << 20
    # Only the methods named compressed (Triton: infer answers alone).
    before = loopback_bytes()
    assert await unary(channel, "Plain")(zeros, compression=grpc.Compression.Gzip) == zeros
    assert loopback_bytes() - before > len(zeros)


async def test_bidi_stream_answers_each_message(served: Any) -> None:
    _, channel, _ = served
    call = channel.stream_stream(f"/{SERVICE}/Chat")()
    for word in (b"one", b"two", b"x" * 200000):
        await call.write(word)
        assert await call.read() == word.upper()
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_streamed_answers_wait_for_a_client_that_reads(served: Any) -> None:
    _, channel, handlers = served
    call = channel.unary_stream(f"/{SERVICE}/StreamOut")(b"1000")  # 62.5 MiB in all
    first = await call.read()
    assert len(first) == 65536
    await asyncio.sleep(0.5)
    assert handlers.seen["streamed"] < 500  # held by the client's window
    count = 1
    while await call.read() != grpc.aio.EOF:
        count += 1
    assert count == 1000


async def test_a_stream_not_read_by_its_handler_holds_the_client_back(served: Any) -> None:
    _, channel, _ = served
    call = channel.stream_stream(f"/{SERVICE}/Counted")()
    written = 0

    async def write_many() -> None:
        nonlocal written
        for _ in range(2000):
            await call.write(b"y" * 65536)
            written += 1

    writer = asyncio.create_task(write_many())
    assert await call.read() == b"first"
    await asyncio.sleep(1.0)
    # Held by flow control: what the windows let through, not 2000 messages (125 MiB).
    assert not writer.done()
    assert written < 400, written
    call.cancel()
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def test_stop_lets_calls_in_flight_finish_within_grace(served: Any) -> None:
    server, channel, _ = served

    async def slow(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(0.5)
        return b"finished"

    server.add_registered_method_handlers("test.Slow", {"Slow": grpc.unary_unary_rpc_method_handler(slow)})
    call = channel.unary_unary("/test.Slow/Slow")(b"")
    await asyncio.sleep(0.1)
    await server.stop(5)
    assert await call == b"finished"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await unary(channel, "Echo")(b"", timeout=2)
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_port_in_use_is_refused_as_grpc_refuses_it() -> None:
    first = Server()
    port = first.add_insecure_port("127.0.0.1:0")
    with pytest.raises(RuntimeError, match="Failed to bind"):
        Server().add_insecure_port(f"127.0.0.1:{port}")
    await first.start()
    await first.stop(None)


def test_grpc_message_and_timeout_encodings() -> None:
    assert _percent_encoded("plain text") == b"plain text"
    assert _percent_encoded("100%\né") == b"100%25%0A%C3%A9"
    assert _timeout(b"250m") == pytest.approx(0.25)
    assert _timeout(b"3S") == 3.0
    assert _timeout(b"12345678n") == pytest.approx(0.012345678)
    assert _timeout(b"123456789S") is None
    assert _timeout(b"5x") is None


def test_the_own_server_serves_all_but_tls() -> None:
    assert own_server_serves(GatewaySettings())
    assert own_server_serves(GatewaySettings(grpc_infer_response_compression_level="high"))
    assert not own_server_serves(GatewaySettings(grpc_use_ssl=True))
    assert own_server_serves(GatewaySettings(grpc_max_connection_age=1000))
    assert own_server_serves(GatewaySettings(grpc_keepalive_time=1000))


def test_tritons_transport_flags_in_seconds() -> None:
    assert own_transport(GatewaySettings()) == Transport()
    settings = GatewaySettings(
        grpc_keepalive_time=1000,
        grpc_keepalive_timeout=500,
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_min_recv_ping_interval_without_data=2000,
        grpc_http2_max_ping_strikes=0,
        grpc_max_connection_age=5000,
        grpc_max_connection_age_grace=100,
    )
    assert own_transport(settings) == Transport(1.0, 0.5, True, 2.0, 0, 5.0, 0.1)


def test_gzip_as_clients_read_it() -> None:
    from gateway.grpc_server import _compress

    assert zlib.decompress(_compress(b"abc" * 100, b"gzip"), 47) == b"abc" * 100
    assert zlib.decompress(_compress(b"abc" * 100, b"deflate")) == b"abc" * 100


async def test_a_client_that_never_reads_is_not_read_either(served: Any) -> None:
    # A SETTINGS frame asks for an acknowledgement; one who sends them and reads nothing
    # would otherwise have the answers held in the gateway's memory without end.
    server, channel, _ = served
    address = f"127.0.0.1:{next(iter(server._sockets)).getsockname()[1]}"
    opening = http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0)
    settings = http2.frame(http2.SETTINGS, 0, 0) * 1024
    run = asyncio.get_running_loop().run_in_executor
    sent, stalled = await run(None, flood, address, opening, settings, 256 << 20, 1.5)
    assert stalled, f"{sent} bytes of SETTINGS taken from a client that reads nothing"
    assert sent < 64 << 20
    assert await unary(channel, "Echo")(b"still serving", timeout=5) == b"still serving"
