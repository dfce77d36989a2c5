"""gateway.http2 against an HTTP/2 implementation of another hand: the h2 library's client
writes what the server reads and reads what it writes, frame for frame."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hpack import Decoder, Encoder

from gateway import http2

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"127.0.0.1"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


class Recorder:
    """An owner that writes down what it hears, acknowledging data unless told not to."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.connection: http2.Connection | None = None
        self.acknowledging = True

    def on_headers(self, stream_id: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self.events.append(("headers", stream_id, list(headers)))

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self.events.append(("data", stream_id, data, flow_length))
        if self.acknowledging:
            assert self.connection is not None
            self.connection.acknowledge(stream_id, flow_length)

    def on_end(self, stream_id: int) -> None:
        self.events.append(("end", stream_id))

    def on_reset(self, stream_id: int) -> None:
        self.events.append(("reset", stream_id))

    def on_window(self, stream_id: int) -> None:
        self.events.append(("window", stream_id))

    def on_goaway(self) -> None:
        self.events.append(("goaway",))


class Pair:
    """Our server connection and an h2 client, each reading what the other wrote."""

    def __init__(self, **server: int) -> None:
        self.owner = Recorder()
        self.server = http2.Connection(self.owner, **server)
        self.owner.connection = self.server
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        self.client_events: list[Any] = []
        self.exchange()

    def exchange(self) -> None:
        """Moves bytes both ways until neither side has more to say."""
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                self.server.receive(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.client.receive_data(to_client)
            if not to_server and not to_client:
                return

    def client_frames(self, *frames: bytes) -> None:
        self.server.receive(b"".join(frames))

    def of(self, kind: type) -> list[Any]:
        return [event for event in self.client_events if isinstance(event, kind)]


def test_a_request_is_read_and_answered() -> None:
    pair = Pair(stream_window=1 << 20, connection_window=8 << 20, max_frame=1 << 20)
    settings = pair.of(h2.events.RemoteSettingsChanged)[0].changed_settings
    assert settings[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE].new_value == 1 << 20
    assert settings[h2.settings.SettingCodes.MAX_FRAME_SIZE].new_value == 1 << 20
    assert pair.client.outbound_flow_control_window == 8 << 20  # our WINDOW_UPDATE for the connection
    assert pair.of(h2.events.SettingsAcknowledged)  # the client's SETTINGS acknowledged

    pair.client.send_headers(1, REQUEST)
    pair.client.send_data(1, b"\x00\x00\x00\x00\x03abc", end_stream=True)
    pair.exchange()
    assert pair.owner.events == [("headers", 1, REQUEST), ("data", 1, b"\x00\x00\x00\x00\x03abc", 8), ("end", 1)]

    pair.server.send_headers(1, http2.encode_headers(((b":status", b"200"), (b"content-type", b"application/grpc"))))
    pair.server.send_data(1, b"\x00\x00\x00\x00\x02ok")
    pair.server.send_headers(1, http2.encode_headers(((b"grpc-status", b"0"),)), end_stream=True)
    pair.exchange()
    response, trailers = pair.of(h2.events.ResponseReceived)[0], pair.of(h2.events.TrailersReceived)[0]
    assert response.headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert pair.of(h2.events.DataReceived)[0].data == b"\x00\x00\x00\x00\x02ok"
    assert trailers.headers == [(b"grpc-status", b"0")]
    assert pair.of(h2.events.StreamEnded)[0].stream_id == 1
    with pytest.raises(http2.StreamClosed):  # our side is over: the stream is forgotten
        pair.server.send_data(1, b"late")


def test_bytes_arriving_one_at_a_time_read_as_whole_frames() -> None:
    owner = Recorder()
    server = http2.Connection(owner)
    owner.connection = server
    encoder = Encoder()
    block = encoder.encode(REQUEST)
    wire = http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0)
    wire += http2.frame(http2.HEADERS, http2.END_HEADERS, 1, block)
    wire += http2.frame(http2.DATA, http2.END_STREAM, 1, b"payload")
    for index in range(len(wire)):
        server.receive(wire[index : index + 1])
    assert owner.events == [("headers", 1, REQUEST), ("data", 1, b"payload", 7), ("end", 1)]


def test_padding_priority_and_continuation_are_read() -> None:
    pair = Pair()
    block = Encoder().encode(REQUEST)
    # HEADERS padded and with a priority, its block continued in two CONTINUATION frames.
    first = bytes((4,)) + b"\x00\x00\x00\x00\x10" + block[:5] + b"\x00" * 4
    pair.client_frames(
        http2.frame(http2.HEADERS, http2.PADDED | http2.PRIORITY_FLAG, 1, first),
        http2.frame(http2.CONTINUATION, 0, 1, block[5:9]),
        http2.frame(http2.CONTINUATION, http2.END_HEADERS, 1, block[9:]),
        http2.frame(http2.DATA, http2.PADDED | http2.END_STREAM, 1, bytes((3,)) + b"abc" + b"\x00" * 3),
    )
    assert pair.owner.events == [("headers", 1, REQUEST), ("data", 1, b"abc", 7), ("end", 1)]


def test_windows_reopen_by_quarters_as_the_owner_reads() -> None:
    pair = Pair(stream_window=4096, connection_window=65535 * 4)
    pair.owner.acknowledging = False
    pair.client.send_headers(1, REQUEST)
    pair.client.send_data(1, b"x" * 4096)
    pair.exchange()
    assert pair.client.local_flow_control_window(1) == 0  # the stream's window is spent
    pair.server.acknowledge(1, 1000)  # under a quarter: not announced yet
    pair.exchange()
    assert pair.client.local_flow_control_window(1) == 0
    pair.server.acknowledge(1, 24)
    pair.exchange()
    assert pair.client.local_flow_control_window(1) == 1024
    # The connection's window is given back as data arrives, whoever reads it.
    assert pair.client.outbound_flow_control_window == 65535 * 4 - 4096


def test_sending_keeps_to_the_clients_windows_and_frame_size() -> None:
    pair = Pair()
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    pair.client.send_headers(1, REQUEST)
    pair.exchange()
    assert pair.server.window(1) == 100
    pair.server.send_headers(1, http2.encode_headers(((b":status", b"200"),)))
    pair.server.send_data(1, b"y" * 100)
    assert pair.server.window(1) == 0
    pair.exchange()
    pair.client.acknowledge_received_data(100, 1)
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
    pair.client.increment_flow_control_window(1 << 20)
    pair.exchange()
    assert ("window", 1) in pair.owner.events and ("window", 0) in pair.owner.events
    assert pair.server.window(1) == 100 + 65535 - 100
    # A message larger than the client's largest frame leaves in several.
    pair.client.acknowledge_received_data(0, 1)
    big = b"z" * pair.server.window(1)
    pair.server.send_data(1, big)
    pair.exchange()
    received = [event.data for event in pair.of(h2.events.DataReceived)]
    assert b"".join(received) == b"y" * 100 + big
    assert max(len(data) for data in received) == http2.DEFAULT_FRAME


def test_trailers_larger_than_a_frame_are_continued() -> None:
    pair = Pair()
    pair.client.send_headers(1, REQUEST, end_stream=True)
    pair.exchange()
    details = b"d" * 40000
    pair.server.send_headers(1, http2.encode_headers(((b":status", b"200"), (b"grpc-message", details))), True)
    pair.exchange()
    assert pair.of(h2.events.ResponseReceived)[0].headers == [(b":status", b"200"), (b"grpc-message", details)]


def test_ping_reset_and_goaway() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    pair.client.send_headers(1, REQUEST)
    pair.client.send_headers(3, REQUEST)
    pair.client.reset_stream(1)
    pair.exchange()
    assert pair.of(h2.events.PingAckReceived)[0].ping_data == b"12345678"
    assert ("reset", 1) in pair.owner.events
    with pytest.raises(http2.StreamClosed):
        pair.server.window(1)
    pair.server.goaway()
    pair.exchange()
    assert pair.of(h2.events.ConnectionTerminated)[0].last_stream_id == 3
    assert pair.server.window(3) == 65535  # stream 3 goes on
    pair.client_frames(http2.frame(http2.GOAWAY, 0, 0, bytes(8)))
    assert pair.owner.events[-1] == ("goaway",)


def test_blocks_are_decoded_once_while_the_table_stays_as_it_was() -> None:
    pair = Pair()
    encoder, reference = Encoder(), Decoder()
    metadata = [*REQUEST, (b"x-user", b"alice")]
    first = encoder.encode(metadata)  # adds entries to the client's table
    again = encoder.encode(metadata)  # indexes them: the same block for every later call
    assert first != again and encoder.encode(metadata) == again
    stream = 1
    for block in (first, again, again, again):
        pair.client_frames(http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream, block))
        stream += 2
    heard = [event[2] for event in pair.owner.events if event[0] == "headers"]
    assert heard == [metadata] * 4
    assert list(pair.server._remembered) == [again]
    # A block that changes the table makes what was remembered forgettable.
    changed = encoder.encode([*REQUEST, (b"x-user", b"bob")])
    pair.client_frames(http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream, changed))
    assert pair.server._remembered == {}
    # The old block's bytes now index other entries: it is decoded afresh, as a decoder
    # that remembers nothing decodes it.
    for block in (first, again, changed):
        reference.decode(block, raw=True)
    pair.client_frames(http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream + 2, again))
    assert pair.owner.events[-2][2] == reference.decode(again, raw=True) != metadata


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http2.PROTOCOL_ERROR),
        (http2.PREFACE + http2.frame(http2.DATA, 0, 0, b"x"), http2.PROTOCOL_ERROR),
        (http2.PREFACE + http2.frame(http2.HEADERS, http2.END_HEADERS, 2, b"\x88"), http2.PROTOCOL_ERROR),
        (http2.PREFACE + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, b"\xff" * 4), http2.COMPRESSION_ERROR),
        # A header block interrupted by another frame.
        (http2.PREFACE + http2.frame(http2.HEADERS, 0, 1, b"") + http2.frame(http2.PING, 0, 0, b"8" * 8), 1),
        (http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, b"12345"), http2.FRAME_SIZE_ERROR),
        (http2.PREFACE + http2.frame(http2.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), http2.FLOW_CONTROL_ERROR),
        # Refused from its head: the rest of a frame over the limit is never awaited.
        (http2.PREFACE + b"\x10\x00\x01" + bytes((http2.DATA, 0)) + b"\x00\x00\x00\x01", http2.FRAME_SIZE_ERROR),
    ],
)
def test_protocol_faults_end_the_connection_with_goaway(wire: bytes, code: int) -> None:
    owner = Recorder()
    server = http2.Connection(owner)
    server.data_to_send()
    with pytest.raises(http2.ConnectionFault) as fault:
        server.receive(wire)
    assert fault.value.code == code
    goaway = server.data_to_send()
    assert goaway[3] == http2.GOAWAY and int.from_bytes(goaway[-4:], "big") == code
    server.receive(http2.frame(http2.PING, 0, 0, b"8" * 8))  # nothing more is read
    assert server.data_to_send() == b""


def test_header_encoding_reads_back_through_hpack() -> None:
    headers = [
        (b":status", b"200"),
        (b":status", b"415"),
        (b"grpc-message", b"m" * 300),  # a length past the 7-bit prefix
        (b"x-" + b"n" * 200, b""),
    ]
    assert Decoder().decode(http2.encode_headers(headers), raw=True) == headers
