"""protos.ready.quiet_port: a port known before its server binds it, out of the kernel's way."""

from __future__ import annotations

import socket

from protos.ready import kernel_port_floor, quiet_port


def test_a_quiet_port_is_free_below_the_kernels_own_range_and_never_one_already_taken() -> None:
    first = quiet_port("127.0.0.1")
    assert 10_000 <= first < kernel_port_floor()
    with socket.socket() as server:
        server.bind(("127.0.0.1", first))  # it was free
    others = {quiet_port("127.0.0.1", {first}) for _ in range(20)}
    assert first not in others


def test_a_port_in_use_is_never_given() -> None:
    held = []
    try:
        for _ in range(20):
            port = quiet_port("127.0.0.1")
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))  # fails if it handed out one that is held
            held.append(sock)
    finally:
        for sock in held:
            sock.close()
