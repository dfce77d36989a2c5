"""The infer lane between real gateway and sidecar processes, against peers that do not
play by its rules: a frame over the receiver's limit closes that connection alone (with a
log line naming the peer, the size and the limit) and the gateway keeps serving; a peer of
another lane protocol version is refused on both ends with words that say which to upgrade,
and the gateway reports such a sidecar not ready; a sidecar on a network address serves
only holders of a certificate its CA signed, and refuses to start without mutual TLS.

The misbehaving sidecar is a lane served by this test (FakeLane) in front of a real
sidecar's lane; its gRPC port is the real sidecar's."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protos.lane import LANE_PROTOCOL, MAX_FRAME, Kind, LaneClient, decode_error, encode_error, hello, read_hello
from protos.ready import GATEWAY_READY, SIDECAR_READY
from protos.status import TurnoutError
from tests.fleet.fleet_harness import Process, running, spawn, wait_until
from tests.pki import Pki

HEADER = struct.Struct("<IQB")  # the lane's frame header, as a peer on the wire sees it
CLAIMS_4_GIB = 2**32 - 1


def frame(call_id: int, kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), call_id, kind) + payload


class FakeLane:
    """A lane served from a thread of this test. `mode`: "proxy" passes requests on to
    the real sidecar lane `upstream`; "huge" answers a request with a header that claims
    4 GiB; an int answers the HELLO with that protocol version."""

    def __init__(self, upstream: str) -> None:
        self.mode: str | int = "proxy"
        self.connections = 0
        self._upstream_address = upstream
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.address = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> str:
        self._upstream = LaneClient(self._upstream_address)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                length, call_id, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(length)
                if kind == Kind.HELLO:
                    version = self.mode if isinstance(self.mode, int) else LANE_PROTOCOL
                    writer.write(frame(0, Kind.HELLO, hello(MAX_FRAME, version)))
                elif kind == Kind.INFER and self.mode == "huge":
                    writer.write(HEADER.pack(CLAIMS_4_GIB, call_id, Kind.REPLY))
                elif kind == Kind.INFER:
                    request_id = payload[1 : 1 + payload[0]].decode()
                    try:
                        reply = frame(
                            call_id, Kind.REPLY, await self._upstream.call(payload[1 + payload[0] :], request_id)
                        )
                    except TurnoutError as error:
                        reply = frame(call_id, Kind.ERROR, encode_error(error))
                    writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            for writer in self._writers:
                writer.close()
            self._server.close()
            self._upstream.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def _sidecar(repository: Path, *flags: str) -> Process:
    command = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repository}"]
    return spawn([*command, "--lane=tcp", "--exit-timeout-secs=3", *flags], SIDECAR_READY)


@pytest.fixture(scope="module")
def plain_sidecar(fleet_repository: Path) -> Iterator[Process]:
    one = _sidecar(fleet_repository)
    with running(one):
        yield one


def _gateway(grpc: str, lane: str, *flags: str) -> Process:
    command = [sys.executable, "-m", "turnout", "gateway", f"--sidecar=onnxruntime={grpc},{lane}", "--host=127.0.0.1"]
    command += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--exit-timeout-secs=3", *flags]
    return spawn(command, GATEWAY_READY)


@pytest.fixture
def fake_lane(plain_sidecar: Process) -> Iterator[FakeLane]:
    fake = FakeLane(plain_sidecar.fields["lane"])
    yield fake
    fake.close()


def _infer(address: str) -> Any:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(address) as client:
        result = client.infer("simple", inputs, client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + data)
    return result


def _infer_fails(address: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        _infer(address)
    return str(caught.value.message())


def _ready(http: str) -> bool:
    with httpclient.InferenceServerClient(http) as client:
        return bool(client.is_server_ready())


# --- frame limits ---


def test_a_sidecar_frame_over_the_gateways_limit_closes_that_connection_only(
    plain_sidecar: Process, fake_lane: FakeLane
) -> None:
    front = _gateway(plain_sidecar.fields["grpc"], fake_lane.address)
    with running(front):
        _infer(front.fields["grpc"])
        fake_lane.mode = "huge"
        message = _infer_fails(front.fields["grpc"])
        assert message == f"Received message larger than max ({CLAIMS_4_GIB} vs. {MAX_FRAME})"
        wait_until(lambda: "sent a frame of" in front.output(), 10, "the gateway's log line")
        assert (
            f"the sidecar at {fake_lane.address} sent a frame of {CLAIMS_4_GIB} bytes, over this gateway's "
            f"limit of {MAX_FRAME}; the connection was closed"
        ) in front.output()
        # The gateway serves on, over a fresh connection.
        fake_lane.mode = "proxy"
        _infer(front.fields["grpc"])
        assert _ready(front.fields["http"])
        assert fake_lane.connections == 2


async def _oversized_from_a_raw_peer(lane: str) -> tuple[int, int, bytes, bytes]:
    host, _, port = lane.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(0, Kind.HELLO, hello(MAX_FRAME)))
        length, _, _ = HEADER.unpack(await asyncio.wait_for(reader.readexactly(HEADER.size), 10))
        await reader.readexactly(length)  # the sidecar's HELLO
        writer.write(HEADER.pack(CLAIMS_4_GIB, 9, Kind.INFER) + bytes(4096))
        length, call_id, kind = HEADER.unpack(await asyncio.wait_for(reader.readexactly(HEADER.size), 10))
        payload = await reader.readexactly(length)
        rest = await asyncio.wait_for(reader.read(), 10)
        return call_id, kind, payload, rest
    finally:
        writer.close()


def test_a_raw_peer_over_the_sidecars_limit_is_cut_off_and_the_gateway_keeps_serving(plain_sidecar: Process) -> None:
    lane = plain_sidecar.fields["lane"]
    front = _gateway(plain_sidecar.fields["grpc"], lane)
    with running(front):
        _infer(front.fields["grpc"])
        call_id, kind, payload, rest = asyncio.run(_oversized_from_a_raw_peer(lane))
        assert (call_id, kind, rest) == (9, Kind.ERROR, b"")  # told why, then closed
        assert decode_error(payload).message == f"Received message larger than max ({CLAIMS_4_GIB} vs. {MAX_FRAME})"
        wait_until(lambda: "closing the lane connection from" in plain_sidecar.output(), 10, "the sidecar's log line")
        assert f"it sent a frame of {CLAIMS_4_GIB} bytes, over the limit of {MAX_FRAME}" in plain_sidecar.output()
        # The gateway's own connection to the same sidecar never noticed.
        _infer(front.fields["grpc"])
        assert _ready(front.fields["http"])


# --- the handshake ---


def test_a_sidecar_of_another_lane_version_is_not_ready_and_says_why(
    plain_sidecar: Process, fake_lane: FakeLane
) -> None:
    fake_lane.mode = LANE_PROTOCOL + 1
    front = _gateway(plain_sidecar.fields["grpc"], fake_lane.address)
    why = (
        f"the sidecar at {fake_lane.address} speaks lane protocol {LANE_PROTOCOL + 1}, this gateway speaks "
        f"{LANE_PROTOCOL}; upgrade the gateway so both speak the same version"
    )
    with running(front):
        assert not _ready(front.fields["http"])
        assert why in _infer_fails(front.fields["grpc"])
        assert not _ready(front.fields["http"])
        said = [line for line in front.lines if "gateway.upstream" in line and why in line]
        assert len(said) == 1, front.output()  # once, not once per request or probe
        # Once the versions agree (the sidecar upgraded), it is ready and serves.
        fake_lane.mode = "proxy"
        wait_until(lambda: _ready(front.fields["http"]), 10, "the gateway ready again")
        _infer(front.fields["grpc"])


async def _hello_from_the_future(lane: str) -> tuple[tuple[int, int] | None, bytes]:
    host, _, port = lane.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(0, Kind.HELLO, hello(MAX_FRAME, LANE_PROTOCOL + 1)))
        length, _, _ = HEADER.unpack(await asyncio.wait_for(reader.readexactly(HEADER.size), 10))
        stated = read_hello(await reader.readexactly(length))
        return stated, await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_a_gateway_of_another_lane_version_is_refused_by_the_sidecar(plain_sidecar: Process) -> None:
    stated, rest = asyncio.run(_hello_from_the_future(plain_sidecar.fields["lane"]))
    assert (stated, rest) == ((LANE_PROTOCOL, MAX_FRAME), b"")  # its own version, then closed
    wait_until(lambda: "refusing a lane connection" in plain_sidecar.output(), 10, "the sidecar's log line")
    assert (
        f"speaks lane protocol {LANE_PROTOCOL + 1}, this sidecar speaks {LANE_PROTOCOL}; "
        "upgrade the sidecar so both speak the same version"
    ) in plain_sidecar.output()


# --- who may call ---


def _tls_flags(pki: Pki) -> list[str]:
    return [
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={pki.server_key}",
        f"--grpc-root-cert={pki.ca}",
    ]


def _client_context(pki: Pki, certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if certificate:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


async def _call_directly(lane: str, tls: ssl.SSLContext | None) -> bytes:
    client = LaneClient(lane, tls, "127.0.0.1")
    try:
        return await asyncio.wait_for(client.call(b""), 30)
    finally:
        client.close()


def test_a_mutual_tls_lane_serves_the_gateway_and_refuses_everyone_else(
    fleet_repository: Path, pki: Pki, other_pki: Pki
) -> None:
    one = _sidecar(fleet_repository, *_tls_flags(pki))
    front = _gateway(
        one.fields["grpc"],
        one.fields["lane"],
        f"--sidecar-ssl-root-cert={pki.ca}",
        f"--sidecar-ssl-cert={pki.client_cert}",
        f"--sidecar-ssl-key={pki.client_key}",
    )
    with running(one, front):
        _infer(front.fields["grpc"])
        with httpclient.InferenceServerClient(front.fields["http"]) as client:
            assert client.is_model_ready("simple")
        lane = one.fields["lane"]
        for who, tls in (
            ("a plain client", None),
            ("a TLS client without a certificate", _client_context(pki, certificate=False)),
            ("a client of another CA", _client_context(other_pki, certificate=True)),
        ):
            with pytest.raises(TurnoutError) as caught:
                asyncio.run(_call_directly(lane, tls))
            assert caught.value.status.name == "UNAVAILABLE", who
        # Nor does the sidecar's gRPC port, the other way to its models, serve a plain client.
        with grpcclient.InferenceServerClient(one.fields["grpc"]) as plain, pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        # The gateway's way in still works, and the only one that does.
        _infer(front.fields["grpc"])


def _network_address() -> str | None:
    """An address of this machine that is not loopback, where it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_sidecar_on_a_network_address_refuses_to_start_without_mutual_tls(fleet_repository: Path, pki: Pki) -> None:
    command = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={fleet_repository}"]
    refused = spawn([*command, "--host=0.0.0.0"], None)
    assert refused.process.wait(timeout=60) == 1
    refused.stop()
    assert "refusing to serve: on 0.0.0.0 without mutual TLS, any host that reaches this sidecar" in refused.output()
    assert "--allow-unauthenticated-network=true" in refused.output()
    # Server TLS alone is no answer: anyone may still connect.
    server_only = [f"--grpc-server-cert={pki.server_cert}", f"--grpc-server-key={pki.server_key}"]
    refused = spawn([*command, "--host=0.0.0.0", "--grpc-use-ssl=true", *server_only], None)
    assert refused.process.wait(timeout=60) == 1
    refused.stop()


def test_a_sidecar_on_a_network_address_serves_with_mutual_tls_or_a_loud_opt_out(
    fleet_repository: Path, pki: Pki
) -> None:
    address = _network_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    one = _sidecar(fleet_repository, f"--host={address}", *_tls_flags(pki))
    with running(one):
        assert "INSECURE" not in one.output()
    opted_out = _sidecar(fleet_repository, f"--host={address}", "--allow-unauthenticated-network=true")
    with running(opted_out):
        assert (
            f"INSECURE: on {address} without mutual TLS, any host that reaches this sidecar can run inferences "
            "past the gateway's restricted APIs (--allow-unauthenticated-network)"
        ) in opted_out.output()
