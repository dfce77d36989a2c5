"""One traced inference, from the front end that sampled it to its answer: its id, the
setting that sampled it, what it is about (model, version, client's request id) and its
timestamps, on the gateway's time.monotonic_ns() clock like Triton's steady clock.

The front end stamps its own (HTTP_RECV_START, ...), the gateway REQUEST_START/END around
the sidecar call, and the sidecar's report adds the queue and compute ones; `Tracer.finish`
writes it. Created only for sampled requests: an untraced one never meets this class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protos.trace import SidecarReport

if TYPE_CHECKING:
    from gateway.tracing.settings import Setting
    from gateway.tracing.tracer import Tracer

# Triton's timestamp names, by who records them.
HTTP_RECV_START, HTTP_RECV_END = "HTTP_RECV_START", "HTTP_RECV_END"
HTTP_SEND_START, HTTP_SEND_END = "HTTP_SEND_START", "HTTP_SEND_END"
GRPC_WAITREAD_START, GRPC_WAITREAD_END = "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"
GRPC_SEND_START, GRPC_SEND_END = "GRPC_SEND_START", "GRPC_SEND_END"
INFER_RESPONSE_COMPLETE = "INFER_RESPONSE_COMPLETE"
REQUEST_START, REQUEST_END = "REQUEST_START", "REQUEST_END"
QUEUE_START = "QUEUE_START"
COMPUTE_START, COMPUTE_INPUT_END = "COMPUTE_START", "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START, COMPUTE_END = "COMPUTE_OUTPUT_START", "COMPUTE_END"
# The sidecar's report names Triton's own (QUEUE_START, COMPUTE_*) and these two.
SIDECAR_START, SIDECAR_END = "SIDECAR_START", "SIDECAR_END"
FROM_SIDECAR = (QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END)


class Trace:
    """A sampled request's record. `span` and `parent` belong to the OpenTelemetry export
    (gateway.tracing.export): the propagated context and the spans started for it."""

    __slots__ = (
        "_clock",
        "_tracer",
        "finished",
        "id",
        "model",
        "parent",
        "parent_id",
        "request_id",
        "requested_version",
        "setting",
        "sidecar",
        "spans",
        "timestamps",
        "traceparent",
        "version",
    )

    def __init__(
        self,
        trace_id: int,
        setting: Setting,
        tracer: Tracer,
        clock: Callable[[], int],
        parent: Any = None,
        parent_id: int = 0,
    ) -> None:
        self.id = trace_id
        self.setting = setting
        self._tracer = tracer
        self._clock = clock
        self.parent = parent  # an OpenTelemetry context the client propagated
        self.parent_id = parent_id  # the ensemble trace this step's trace belongs to
        self.model = ""
        self.requested_version = ""
        self.version = ""  # the version that answered, as the sidecar said
        self.request_id = ""
        self.timestamps: list[tuple[str, int]] = []
        self.sidecar: dict[str, int] = {}  # SIDECAR_START/END, on the gateway's clock
        self.traceparent = ""  # what the sidecar is told (OpenTelemetry mode)
        self.spans: Any = None
        self.finished = False

    def now(self) -> int:
        return self._clock()

    def stamp(self, name: str) -> None:
        self.timestamps.append((name, self._clock()))

    def start_request(self, version: str, request_id: str) -> None:
        """REQUEST_START: the gateway took the request (`version` as asked, "" = newest)."""
        self.requested_version, self.request_id = version, request_id
        self.stamp(REQUEST_START)
        self._tracer.request_started(self)

    def sidecar_answered(self, report: SidecarReport, sent_ns: int, received_ns: int) -> None:
        """Take the sidecar's report of a call sent at `sent_ns` and answered at
        `received_ns`. On this machine the sidecar's monotonic clock is ours, so its span
        lies inside the call; a sidecar on another machine has a clock of its own, and its
        span is put in the middle of the call (its own durations kept exact)."""
        if report.model_version:
            self.version = report.model_version
        times = report.timestamps
        if not times:
            return
        first, last = times[SIDECAR_START], times[SIDECAR_END]
        shift = 0
        if not sent_ns <= first <= last <= received_ns:
            shift = (sent_ns + received_ns - first - last) // 2
        for name in FROM_SIDECAR:
            self.timestamps.append((name, times[name] + shift))
        self.sidecar = {SIDECAR_START: first + shift, SIDECAR_END: last + shift}

    def child(self, model: str, version: str) -> Trace:
        """The trace of one step of this ensemble request (Triton's child trace, whose
        records name this one as their parent_id)."""
        return self._tracer.child(self, model, version)

    def finish(self) -> None:
        """Done: written to the trace file or exported (once, whoever calls first)."""
        if not self.finished:
            self.finished = True
            self._tracer.finish(self)
