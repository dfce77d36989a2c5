"""The server side of HTTP/2 (RFC 9113), sans I/O: bytes in, callbacks out, bytes to send.

What gateway.grpc_server needs and no more: frames read whole, padded or not, header
blocks across CONTINUATION frames, flow control both ways, SETTINGS, PING, RST_STREAM,
WINDOW_UPDATE and GOAWAY, and a connection error answered with GOAWAY. A client's PINGs
are policed as grpc's servers police them (PingPolicy); ours are remembered until
acknowledged. Server push and priorities are not served (priority fields are read and
ignored, as the RFC allows).

Header blocks are decoded by hpack's decoder, which keeps the dynamic table. A client's
calls of one method send the same block again and again, each decoding to the same
headers and leaving the table as it was; such a block is remembered until the table
changes, so it is decoded once. What we send is encoded without the dynamic table
(literals never indexed, and `:status` from the static table), so the peer's table size
never concerns us.
"""

from __future__ import annotations

import struct
import time
from typing import NamedTuple, Protocol

from hpack import Decoder
from hpack.exceptions import HPACKError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Error codes (RFC 9113 section 7).
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR = 0x0, 0x1, 0x3, 0x6, 0x9
ENHANCE_YOUR_CALM = 0xB

# Settings identifiers.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x2, 0x3, 0x4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x5, 0x6

DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_WINDOW = 2**31 - 1
LAST_STREAM = 2**31 - 1

_FRAME_HEAD = struct.Struct(">HBBBL")  # a 24-bit length as 16 + 8 bits, type, flags, stream
_SETTING = struct.Struct(">HL")
_UINT32 = struct.Struct(">L")

# A block that left the table unchanged is remembered; this many at most.
_REMEMBERED_BLOCKS = 64


class ConnectionFault(Exception):
    """The peer broke the protocol; a GOAWAY with `code` (and `debug`, its debug data) is
    queued and the connection should close once it is written."""

    def __init__(self, code: int, reason: str, debug: bytes = b"") -> None:
        super().__init__(reason)
        self.code = code
        self.debug = debug


class PingPolicy(NamedTuple):
    """What a client's PINGs may do, as grpc's servers police them (its ping abuse policy).
    A PING sooner than `min_interval` seconds after the one before is a strike (two hours
    while no stream is open, unless `without_streams`); past `max_strikes` strikes (0: no
    limit) the connection ends with GOAWAY ENHANCE_YOUR_CALM "too_many_pings". A HEADERS,
    DATA or WINDOW_UPDATE frame we send forgives the strikes so far. Triton's defaults."""

    min_interval: float = 300.0
    max_strikes: int = 2
    without_streams: bool = False


DEFAULT_PINGS = PingPolicy()
IDLE_PING_INTERVAL = 7200.0  # RFC 1122's least TCP keepalive interval, for a connection without streams


class StreamClosed(Exception):
    """Something was to be sent on a stream that is over (reset, or ended by us)."""


class Owner(Protocol):
    """What the connection tells its user, as frames are read."""

    def on_headers(self, stream_id: int, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        """A new stream's request headers."""

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        """A DATA frame's payload on an open stream; `flow_length` is what it took of the
        stream's window (padding included), to be given back with `acknowledge`."""

    def on_end(self, stream_id: int) -> None:
        """The client has sent all it will on the stream."""

    def on_reset(self, stream_id: int) -> None:
        """The client reset the stream."""

    def on_window(self, stream_id: int) -> None:
        """More may be sent on the stream; 0: on every stream."""

    def on_goaway(self) -> None:
        """The client will open no more streams."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix, `first` holding the high bits of its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_STATUS = {b"200": 8, b"204": 9, b"206": 10, b"304": 11, b"400": 12, b"404": 13, b"500": 14}


def encode_headers(headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> bytes:
    """A header block with no dynamic-table entries: each field a literal never added to
    the table (names lowercase, as HTTP/2 requires), `:status` indexed where the static
    table has it."""
    out = bytearray()
    for name, value in headers:
        if name == b":status":
            index = _STATIC_STATUS.get(value)
            if index is not None:
                out.append(0x80 | index)
                continue
            out += _integer(8, 4, 0x00)  # the name from the static table, the value literal
        else:
            out.append(0x00)
            out += _integer(len(name), 7, 0x00)
            out += name
        out += _integer(len(value), 7, 0x00)
        out += value
    return bytes(out)


class _Stream:
    __slots__ = ("send_window", "unannounced")

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window
        self.unannounced = 0  # read and acknowledged by the owner, not yet announced


class Connection:
    """One server connection. `receive` takes what was read and calls the owner back;
    `data_to_send` returns what to write. `settings`: what we announce; our receive
    windows are `stream_window` per stream and `connection_window` in all, given back to
    the client by WINDOW_UPDATEs of a quarter window at least."""

    def __init__(
        self,
        owner: Owner,
        stream_window: int = DEFAULT_WINDOW,
        connection_window: int = DEFAULT_WINDOW,
        max_frame: int = DEFAULT_FRAME,
        max_header_list: int = 1 << 16,
        pings: PingPolicy = DEFAULT_PINGS,
    ) -> None:
        self._owner = owner
        self._stream_window = stream_window
        self._max_frame = max_frame
        self._streams: dict[int, _Stream] = {}
        self._out: list[bytes] = []
        self._buffer = bytearray()
        self._preface = True  # the client's preface is yet to be read
        self._failed = False
        self.highest_stream_id = 0
        # Sending: the client's settings and windows.
        self._peer_initial_window = DEFAULT_WINDOW
        self.max_outbound_frame = DEFAULT_FRAME
        self._connection_send_window = DEFAULT_WINDOW
        # Receiving.
        self._connection_unannounced = 0
        self._announce_stream = max(stream_window // 4, 1)
        self._announce_connection = max(connection_window // 4, 1)
        self._continued: tuple[int, int, bytearray] | None = None  # stream, END_STREAM flag, block so far
        self._max_header_block = 4 * max_header_list  # the encoded block, before decoding
        self._decoder = Decoder(max_header_list_size=max_header_list)
        self._remembered: dict[bytes, tuple[tuple[bytes, bytes], ...]] = {}
        # PINGs: the client's, policed; ours, each waiting for its acknowledgement.
        self._pings = pings
        self._last_ping: float | None = None
        self._strikes = 0
        self._sent = False  # a HEADERS, DATA or WINDOW_UPDATE frame sent since the client's last PING
        self.pings_unanswered: set[bytes] = set()
        self.last_stream_id = LAST_STREAM  # what a GOAWAY of ours said last

        settings = {
            MAX_CONCURRENT_STREAMS: MAX_WINDOW,
            INITIAL_WINDOW_SIZE: stream_window,
            MAX_FRAME_SIZE: max_frame,
            MAX_HEADER_LIST_SIZE: max_header_list,
        }
        self._out.append(frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items())))
        if connection_window > DEFAULT_WINDOW:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _UINT32.pack(connection_window - DEFAULT_WINDOW)))

    # -- reading -----------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Reads `data`; the owner hears of each whole frame. Raises ConnectionFault (with
        its GOAWAY queued) when the client breaks the protocol; nothing more is read then."""
        if self._failed:
            return
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._needed():
                return  # a frame still arriving: not copied again until it is whole
            data = bytes(buffer)
            buffer.clear()
        try:
            self._frames(data)
        except ConnectionFault as fault:
            self._fail(fault.code, fault.debug)
            raise

    def _needed(self) -> int:
        buffer = self._buffer
        if self._preface:
            return len(PREFACE)
        if len(buffer) < 9:
            return 9
        length = int.from_bytes(buffer[:3], "big")
        return 9 if length > self._max_frame else 9 + length  # too large: refused before it is read

    def _frames(self, data: bytes) -> None:
        position = 0
        end = len(data)
        if self._preface:
            if end < len(PREFACE):
                if not PREFACE.startswith(data):
                    raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                self._buffer += data
                return
            if not data.startswith(PREFACE):
                raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 client preface")
            self._preface = False
            position = len(PREFACE)
        while end - position >= 9:
            high, low, kind, flags, stream_id = _FRAME_HEAD.unpack_from(data, position)
            length = (high << 8) | low
            if length > self._max_frame:
                raise ConnectionFault(FRAME_SIZE_ERROR, f"a frame of {length} bytes, over {self._max_frame}")
            stop = position + 9 + length
            if stop > end:
                break
            self._frame(kind, flags, stream_id & 0x7FFFFFFF, data[position + 9 : stop])
            position = stop
        if position < end:
            self._buffer += data[position:]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continued is not None and kind != CONTINUATION:
            raise ConnectionFault(PROTOCOL_ERROR, "a header block interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ConnectionFault(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a malformed PING")
            if flags & ACK:
                self.pings_unanswered.discard(payload)
            else:
                self._out.append(frame(PING, ACK, 0, payload))  # before a GOAWAY for it, as grpc's
                self._police_ping()
        elif kind == RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise ConnectionFault(PROTOCOL_ERROR if not stream_id else FRAME_SIZE_ERROR, "a malformed RST_STREAM")
            if self._streams.pop(stream_id, None) is not None:
                self._owner.on_reset(stream_id)
        elif kind == GOAWAY:
            if stream_id or len(payload) < 8:
                raise ConnectionFault(PROTOCOL_ERROR, "a malformed GOAWAY")
            self._owner.on_goaway()
        elif kind == PRIORITY:
            if not stream_id or len(payload) != 5:
                raise ConnectionFault(PROTOCOL_ERROR, "a malformed PRIORITY")
        elif kind == PUSH_PROMISE:
            raise ConnectionFault(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # Frames of unknown types are ignored, as the RFC asks.

    def _police_ping(self) -> None:
        now = time.monotonic()
        policy = self._pings
        if self._sent:  # the strikes so far are forgiven
            self._sent = False
            self._last_ping = None
            self._strikes = 0
        interval = policy.min_interval if self._streams or policy.without_streams else IDLE_PING_INTERVAL
        last, self._last_ping = self._last_ping, now
        if last is None or now >= last + interval:
            return
        self._strikes += 1
        if policy.max_strikes and self._strikes > policy.max_strikes:
            raise ConnectionFault(ENHANCE_YOUR_CALM, "too many pings", b"too_many_pings")

    @staticmethod
    def _unpadded(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ConnectionFault(PROTOCOL_ERROR, "padding longer than its frame")
        return payload[1 : len(payload) - payload[0]]

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionFault(PROTOCOL_ERROR, "DATA on stream 0")
        flow_length = len(payload)
        self._connection_unannounced += flow_length
        if self._connection_unannounced >= self._announce_connection:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _UINT32.pack(self._connection_unannounced)))
            self._connection_unannounced = 0
            self._sent = True
        if stream_id not in self._streams:
            if stream_id > self.highest_stream_id:
                raise ConnectionFault(PROTOCOL_ERROR, "DATA on a stream not opened")
            return  # a stream we have ended or that was reset: dropped
        data = self._unpadded(flags, payload)
        if data:
            self._owner.on_data(stream_id, data, flow_length)
        elif flow_length:
            self.acknowledge(stream_id, flow_length)
        if flags & END_STREAM:
            self._owner.on_end(stream_id)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            raise ConnectionFault(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = self._unpadded(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionFault(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            self._block(stream_id, flags & END_STREAM, block)
        else:
            self._continued = (stream_id, flags & END_STREAM, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        continued = self._continued
        if continued is None or continued[0] != stream_id:
            raise ConnectionFault(PROTOCOL_ERROR, "a CONTINUATION out of place")
        block = continued[2]
        block += payload
        if len(block) > self._max_header_block:
            raise ConnectionFault(PROTOCOL_ERROR, "a header block too large")
        if flags & END_HEADERS:
            self._continued = None
            self._block(stream_id, continued[1], bytes(block))

    def _block(self, stream_id: int, end_stream: int, block: bytes) -> None:
        headers = self._decode(block)  # decoded in every case: the table must stay in step
        if stream_id > self.last_stream_id:
            return  # opened after our last GOAWAY: not served, the client retries it elsewhere
        if stream_id > self.highest_stream_id:
            self.highest_stream_id = stream_id
            self._streams[stream_id] = _Stream(self._peer_initial_window)
            self._owner.on_headers(stream_id, headers)
        elif stream_id not in self._streams:
            return  # trailers of a stream that is over
        if end_stream:
            self._owner.on_end(stream_id)

    def _decode(self, block: bytes) -> tuple[tuple[bytes, bytes], ...]:
        remembered = self._remembered.get(block)
        if remembered is not None:
            return remembered
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            headers = tuple(self._decoder.decode(block, raw=True))
        except HPACKError as exc:
            raise ConnectionFault(COMPRESSION_ERROR, f"a header block that cannot be decoded: {exc}") from None
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if after[0] == before[0] and after[1] is before[1] and after[2] == before[2]:
            if len(self._remembered) >= _REMEMBERED_BLOCKS:
                self._remembered.clear()
            self._remembered[block] = headers
        else:
            self._remembered.clear()  # the table changed: what was remembered may decode otherwise now
        return headers

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFault(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = _UINT32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise ConnectionFault(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._connection_send_window += increment
            if self._connection_send_window > MAX_WINDOW:
                raise ConnectionFault(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            self._owner.on_window(0)
            return
        stream = self._streams.get(stream_id)
        if stream is None or not increment:
            return  # a stream that is over; a 0 increment on one is the stream's error alone
        stream.send_window += increment
        self._owner.on_window(stream_id)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFault(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionFault(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ConnectionFault(FRAME_SIZE_ERROR, "a malformed SETTINGS")
        window_changed = False
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFault(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                window_changed = window_changed or delta > 0
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 2**24 - 1:
                    raise ConnectionFault(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self.max_outbound_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise ConnectionFault(PROTOCOL_ERROR, f"ENABLE_PUSH of {value}")
            # HEADER_TABLE_SIZE concerns an encoder's table, and ours uses none.
        self._out.append(frame(SETTINGS, ACK, 0))
        if window_changed:
            self._owner.on_window(0)

    def acknowledge(self, stream_id: int, length: int) -> None:
        """The owner has taken `length` bytes of the stream's data: its window reopens by
        that much (announced once a quarter window has gathered)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.unannounced += length
        if stream.unannounced >= self._announce_stream:
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _UINT32.pack(stream.unannounced)))
            stream.unannounced = 0
            self._sent = True

    # -- sending -----------------------------------------------------------------

    def window(self, stream_id: int) -> int:
        """How many bytes of DATA the stream may send now."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamClosed(stream_id)
        return min(stream.send_window, self._connection_send_window)

    def send_data(self, stream_id: int, data: bytes) -> None:
        """Sends `data` (no more than `window(stream_id)`) in frames the client accepts."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamClosed(stream_id)
        size = len(data)
        stream.send_window -= size
        self._connection_send_window -= size
        self._sent = True
        largest = self.max_outbound_frame
        if size <= largest:
            self._out.append(frame(DATA, 0, stream_id, data))
            return
        view = memoryview(data)
        for start in range(0, size, largest):
            self._out.append(frame(DATA, 0, stream_id, bytes(view[start : start + largest])))

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """Sends an encoded header block (see encode_headers); with `end_stream` our side of
        the stream is over and it is forgotten."""
        if stream_id not in self._streams:
            raise StreamClosed(stream_id)
        flags = END_STREAM if end_stream else 0
        self._sent = True
        largest = self.max_outbound_frame
        if len(block) <= largest:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
        else:
            pieces = [block[start : start + largest] for start in range(0, len(block), largest)]
            self._out.append(frame(HEADERS, flags, stream_id, pieces[0]))
            for piece in pieces[1:-1]:
                self._out.append(frame(CONTINUATION, 0, stream_id, piece))
            self._out.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
        if end_stream:
            del self._streams[stream_id]

    def goaway(self, code: int = NO_ERROR, last_stream_id: int | None = None, debug: bytes = b"") -> None:
        """Tells the client that no stream past `last_stream_id` (by default the last it
        opened) will be served; those open go on. Streams it opens past it are ignored."""
        last = self.highest_stream_id if last_stream_id is None else last_stream_id
        self.last_stream_id = last
        self._out.append(frame(GOAWAY, 0, 0, _UINT32.pack(last) + _UINT32.pack(code) + debug))

    def ping(self, payload: bytes) -> None:
        """Sends a PING of 8 bytes; `pings_unanswered` holds it until it is acknowledged."""
        self.pings_unanswered.add(payload)
        self._out.append(frame(PING, 0, 0, payload))

    def _fail(self, code: int, debug: bytes = b"") -> None:
        self._failed = True
        self._buffer.clear()
        self.goaway(code, debug=debug)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data
