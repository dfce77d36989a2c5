"""The ready line: the one line each server prints on stdout, flushed, once it serves.

It names the addresses the server bound as `key=value` fields (a port given as 0 is one
the system chose), so whoever started the process learns them without guessing:
`TURNOUT_READY http=H:P grpc=H:P metrics=H:P` from the gateway,
`TURNOUT_SIDECAR_READY grpc=H:P lane=<unix:/path | H:P | off> framework=F metrics=<H:P | off>`
from a sidecar.
"""

from __future__ import annotations

GATEWAY_READY = "TURNOUT_READY"
SIDECAR_READY = "TURNOUT_SIDECAR_READY"


def join_host_port(host: str, port: int | str) -> str:
    """An address as a ready line (and a client) writes it: IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready_line(prefix: str, **fields: object) -> str:
    """The ready line of `prefix` with `fields` in the order given."""
    return " ".join([prefix, *(f"{key}={value}" for key, value in fields.items())])


def parse_ready(line: str, prefix: str) -> dict[str, str] | None:
    """The fields of `line` when it is a `prefix` ready line, else None."""
    words = line.split()
    if not words or words[0] != prefix:
        return None
    return dict(word.split("=", 1) for word in words[1:] if "=" in word)
