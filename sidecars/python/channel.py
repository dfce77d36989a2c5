"""The messages between the python sidecar and a model instance's process: tuples whose
first item names the message, pickled (numpy arrays travel in the pickle as their
buffers), each preceded by its length. Both ends use blocking sockets: the sidecar reads
on a thread of its own per instance, the child on its only thread.

Sidecar to child: ("setup", Setup), ("execute", [RequestData]), ("reply", value), ("finalize",).
Child to sidecar: ("done", value), ("failed", text), ("responses", [ResponseData]),
("batch_error", text), ("send", index, ResponseData, flags), ("log", level, text),
("metric", MetricOp) and, asking for a ("reply", value), ("query", MetricOp)."""

from __future__ import annotations

import contextlib
import pickle
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_LENGTH = struct.Struct("<Q")


class ChannelClosed(Exception):
    """The other end is gone (its process exited or closed the socket)."""


class Channel:
    """One end of a socket pair. Sends may come from several threads; one thread receives."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sending = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = _LENGTH.pack(len(payload)) + payload
        # Nothing is allocated while the lock is held, so no garbage collection (and no
        # MetricFamily.__del__, which sends) can run in this thread while it holds it.
        with self._sending:
            try:
                self._sock.sendall(frame)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc

    def receive(self) -> tuple[Any, ...]:
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size))
        message: tuple[Any, ...] = pickle.loads(self._read(length))
        return message

    def _read(self, size: int) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            try:
                count = self._sock.recv_into(view[got:])
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if count == 0:
                raise ChannelClosed("end of stream")
            got += count
        return buffer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


@dataclass(frozen=True)
class GatewayTls:
    """How BLS reaches a gateway that serves gRPC over TLS (PEM file paths): the CA to
    trust, and for mutual TLS the certificate and key to present; `server_name` stands in
    for the host BLS dials when checking the gateway's certificate ("" = the host itself)."""

    root_cert: str
    cert: str = ""
    key: str = ""
    server_name: str = ""


@dataclass(frozen=True)
class Setup:
    """What a child needs to run one model instance (or only its auto_complete_config)."""

    model_file: str
    version: str
    model_name: str
    instance_name: str
    args: dict[str, str]  # initialize()'s argument, as Triton passes it
    config_json: str
    decoupled: bool = False
    gateway: str = ""  # host:port of a gateway's gRPC port, for BLS; "" = none
    gateway_tls: GatewayTls | None = None  # None: that port serves without TLS
    auto_complete_only: bool = False


@dataclass
class RequestData:
    id: str
    inputs: dict[str, np.ndarray]
    requested_outputs: list[str]
    parameters: dict[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0
    flags: int = 0
    token: int = 0  # the sidecar's handle on the request, for a decoupled model's responses


@dataclass
class ResponseData:
    outputs: dict[str, np.ndarray]
    error: tuple[str, str] | None = None  # (status name, message)
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricOp:
    """A custom metric operation: "create", "increment", "set", "observe", "value", or
    "delete" (the model's family object is gone)."""

    op: str
    family: str
    kind: str
    description: str
    labels: tuple[tuple[str, str], ...]
    value: float = 0.0
    buckets: tuple[float, ...] = ()
