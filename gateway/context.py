"""What travels beside a request from a front end through the gateway: the caller's
headers or metadata, its deadline, the sequence the request belongs to, and its trace
when it is traced."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protos.sequence import SequenceFlags
from protos.status import TurnoutError

if TYPE_CHECKING:
    from gateway.tracing.trace import Trace


@dataclass(slots=True)
class RequestContext:
    """What a front end passes beside the request: its headers (HTTP) or metadata (gRPC),
    lower-cased, and the client's deadline on the time.monotonic() clock, if any; the
    gateway adds the request's sequence, if it belongs to one. A front end that samples
    the request for tracing passes its Trace.

    Made for every request, so not frozen (a frozen dataclass's `__init__` costs several
    times a plain one's); treat it as immutable and derive with dataclasses.replace."""

    headers: Mapping[str, str] = field(default_factory=dict)
    deadline: float | None = None
    sequence: SequenceFlags | None = None
    trace: Trace | None = None
    # A stream's request: a decoupled model's responses before its last go here, serialized,
    # or as a TurnoutError for an error response with more to follow (only a stream can
    # carry several; without it a request wants exactly one answer).
    responses: Callable[[bytes | TurnoutError], None] | None = None


NO_CONTEXT = RequestContext()
