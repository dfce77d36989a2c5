"""An error's Cause crosses the hop from sidecar to gateway beside its status and text:
in a lane ERROR frame and in a gRPC call's trailing metadata (a real grpc.aio server
that ends its call through protos.rpc.abort_call, read by the gateway's SidecarClient)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from gateway.upstream import SidecarClient
from protos.lane import LaneClient, LaneServer, decode_error, encode_error
from protos.rpc import BY_NAME, abort_call
from protos.status import Cause, Status, TurnoutError

UNKNOWN = TurnoutError(
    Status.INVALID_ARG,
    "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence",
    Cause.UNKNOWN_SEQUENCE,
)


@pytest.mark.parametrize("cause", [None, Cause.UNKNOWN_SEQUENCE], ids=["none", "unknown-sequence"])
@pytest.mark.parametrize("message", ["plain text", "a NUL\0inside", "ends in NUL\0"], ids=["plain", "nul", "end-nul"])
def test_a_lane_error_keeps_its_status_text_and_cause(message: str, cause: Cause | None) -> None:
    decoded = decode_error(encode_error(TurnoutError(Status.INVALID_ARG, message, cause)))
    assert (decoded.status, decoded.message, decoded.cause) == (Status.INVALID_ARG, message, cause)


def test_a_cause_this_side_does_not_know_is_left_in_the_text_of_no_cause() -> None:
    decoded = decode_error(b"INVALID_ARG\0text\0some-later-cause")
    assert (decoded.message, decoded.cause) == ("text\0some-later-cause", None)


async def test_a_cause_crosses_a_real_lane(tmp_path) -> None:
    async def refuse(view: memoryview, request_id: str) -> bytes:
        raise UNKNOWN

    server = LaneServer(refuse)
    client = LaneClient(await server.start_unix(str(tmp_path / "lane.sock")))
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.call(b"request")
        assert (caught.value.status, caught.value.message, caught.value.cause) == (
            UNKNOWN.status,
            UNKNOWN.message,
            Cause.UNKNOWN_SEQUENCE,
        )
    finally:
        client.close()
        server.stop_accepting()


@pytest.fixture
async def refusing_server() -> AsyncIterator[str]:
    """A gRPC server whose ModelInfer raises `UNKNOWN`, or an error of no cause for an empty request."""

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        error = UNKNOWN if request else TurnoutError(Status.INVALID_ARG, "no cause")
        await abort_call(context, error, "ModelInfer", logging.getLogger(__name__))

    method = BY_NAME["ModelInfer"]
    handler = grpc.method_handlers_generic_handler(
        method.path.split("/")[1], {method.name: grpc.unary_unary_rpc_method_handler(infer)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_cause_crosses_grpc_in_the_trailing_metadata(refusing_server: str) -> None:
    client = SidecarClient("onnxruntime", refusing_server)  # no lane: ModelInfer goes over gRPC
    try:
        with pytest.raises(TurnoutError) as caught:
            await client.infer(b"\x0a\x01m")
        assert (caught.value.status, caught.value.message, caught.value.cause) == (
            UNKNOWN.status,
            UNKNOWN.message,
            Cause.UNKNOWN_SEQUENCE,
        )
        with pytest.raises(TurnoutError) as caught:
            await client.infer(b"")
        assert (caught.value.message, caught.value.cause) == ("no cause", None)
    finally:
        await client.close()
