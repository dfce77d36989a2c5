"""The ready line: the one line each server prints on stdout, flushed, once it serves.

It names the addresses the server bound as `key=value` fields (a port given as 0 is one
the system chose), so whoever started the process learns them without guessing:
`TURNOUT_READY http=H:P grpc=H:P metrics=H:P` from the gateway,
`TURNOUT_SIDECAR_READY grpc=H:P lane=<unix:/path | H:P | off> framework=F metrics=<H:P | off>`
from a sidecar.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

GATEWAY_READY = "TURNOUT_READY"
SIDECAR_READY = "TURNOUT_SIDECAR_READY"


def join_host_port(host: str, port: int | str) -> str:
    """An address as a ready line (and a client) writes it: IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def kernel_port_floor() -> int:
    """The lowest port the kernel hands out by itself, to outgoing connections and to
    servers binding port 0 (Linux's ip_local_port_range; elsewhere IANA's 49152)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def quiet_port(host: str, taken: frozenset[int] | set[int] = frozenset()) -> int:
    """A port free on `host` now, for an address that must be known before its server
    binds it. It is taken below the kernel's own range, so no process binding port 0 and
    no outgoing connection can take it in between; never one of `taken`. Where that
    range starts too low to leave room, a port the kernel picks (OSError: none found)."""
    floor = kernel_port_floor()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(200 if floor > 10_000 else 0):
        port = random.randrange(10_000, floor)
        if port in taken:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    if port in taken:
        raise OSError(f"no free port on {host}")
    return int(port)


def ready_line(prefix: str, **fields: object) -> str:
    """The ready line of `prefix` with `fields` in the order given."""
    return " ".join([prefix, *(f"{key}={value}" for key, value in fields.items())])


def parse_ready(line: str, prefix: str) -> dict[str, str] | None:
    """The fields of `line` when it is a `prefix` ready line, else None."""
    words = line.split()
    if not words or words[0] != prefix:
        return None
    return dict(word.split("=", 1) for word in words[1:] if "=" in word)
