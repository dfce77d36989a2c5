"""The infer lane over a real Unix socket and a real TCP socket."""

from __future__ import annotations

import asyncio

import pytest

from protos.lane import LaneClient, LaneServer
from protos.status import Status, TurnoutError


async def _handler(view: memoryview, request_id: str) -> bytes:
    payload = bytes(view)
    if payload == b"whose":
        return request_id.encode()
    if payload == b"missing":
        raise TurnoutError(Status.NOT_FOUND, "Request for unknown model: 'missing' is not found")
    if payload == b"boom":
        raise RuntimeError("exploded")
    if payload.startswith(b"slow"):
        await asyncio.sleep(0.05)
    return payload[::-1]


@pytest.fixture(params=["unix", "tcp"])
async def lane(request: pytest.FixtureRequest, tmp_path):
    server = LaneServer(_handler)
    if request.param == "unix":
        address = await server.start_unix(str(tmp_path / "lane.sock"))
    else:
        address = await server.start_tcp("127.0.0.1", 0)
    client = LaneClient(address)
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
