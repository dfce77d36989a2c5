"""What travels beside a request from a front end through the gateway: the caller's
headers or metadata, its deadline, and the sequence the request belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protos.sequence import SequenceFlags


@dataclass(frozen=True)
class RequestContext:
    """What a front end passes beside the request: its headers (HTTP) or metadata (gRPC),
    lower-cased, and the client's deadline on the time.monotonic() clock, if any; the
    gateway adds the request's sequence, if it belongs to one."""

    headers: Mapping[str, str] = field(default_factory=dict)
    deadline: float | None = None
    sequence: SequenceFlags | None = None


NO_CONTEXT = RequestContext()
