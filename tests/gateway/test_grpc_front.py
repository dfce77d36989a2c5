"""Every RPC of the service goes through the gRPC front's one error wrapper."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gateway.core import Gateway
from gateway.grpc_front import SHUTTING_DOWN, build_grpc_server, method_handlers, transport_options
from gateway.metrics import GatewayMetrics
from gateway.registry import StaticRegistry
from gateway.settings import GatewaySettings
from gateway.shm import SharedMemory
from protos import grpc_service_pb2
from protos.rpc import METHODS, SERVICE


def make_gateway() -> Gateway:
    return Gateway(GatewaySettings(), StaticRegistry([]), SharedMemory(False), GatewayMetrics(CollectorRegistry()))


def test_method_table_matches_the_service_descriptor() -> None:
    descriptor = grpc_service_pb2.DESCRIPTOR.services_by_name[SERVICE.rsplit(".", 1)[1]]
    assert {m.name for m in descriptor.methods} == {m.name for m in METHODS}
    for method in descriptor.methods:
        ours = next(m for m in METHODS if m.name == method.name)
        assert ours.request == method.input_type.name
        assert ours.response == method.output_type.name
        assert ours.streaming == (method.client_streaming and method.server_streaming)


def test_every_handler_is_guarded() -> None:
    handlers = method_handlers(make_gateway())
    assert set(handlers) == {m.name for m in METHODS}
    for name, handler in handlers.items():
        function = handler.stream_stream if handler.response_streaming else handler.unary_unary
        assert getattr(function, "turnout_guarded", False), name


@pytest.fixture
async def draining_server():
    gateway = make_gateway()
    server = build_grpc_server(gateway, GatewaySettings())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    gateway.start_draining()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield channel
    await channel.close()
    await server.stop(None)


@pytest.mark.parametrize("method", [m for m in METHODS], ids=lambda m: m.name)
async def test_every_rpc_answers_through_the_wrapper(draining_server, method) -> None:
    # Draining is checked by the wrapper alone, so this status proves the RPC went through it.
    if method.streaming:
        call = draining_server.stream_stream(method.path)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call(iter([b""])):
                pass
    else:
        call = draining_server.unary_unary(method.path)
        if method.name in ("ServerLive", "ServerReady"):
            answer = await call(b"")  # health keeps answering while draining: live, not ready
            assert answer == (b"\x08\x01" if method.name == "ServerLive" else b"")
            return
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == SHUTTING_DOWN


def test_tritons_transport_flags_set_grpcs_options() -> None:
    # Triton's defaults are grpc's own; a connection age is set only when given.
    assert dict(transport_options(GatewaySettings())) == {
        "grpc.keepalive_time_ms": 7200000,
        "grpc.keepalive_timeout_ms": 20000,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 2,
        "grpc.http2.min_ping_interval_without_data_ms": 300000,
        "grpc.http2.max_ping_strikes": 2,
    }
    settings = GatewaySettings(
        grpc_keepalive_time=1000,
        grpc_keepalive_permit_without_calls=True,
        grpc_max_connection_age=5000,
        grpc_max_connection_age_grace=100,
    )
    options = dict(transport_options(settings))
    assert options["grpc.keepalive_time_ms"] == 1000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert (options["grpc.max_connection_age_ms"], options["grpc.max_connection_age_grace_ms"]) == (5000, 100)
