"""The OpenTelemetry mode: each finished trace becomes spans, exported over OTLP/HTTP by
the SDK's batch span processor on its own thread. Imported only in this mode, so the
gateway runs without the SDK when it is off (`pip install 'turnout[trace]'`).

Spans, as Triton makes them, plus the sidecar's: `InferRequest` (the front end's events,
child of the client's propagated context if any) > `<model>` (REQUEST_START, QUEUE_START,
REQUEST_END; Triton's triton.* attributes) > `sidecar` (its own handling of the request)
> `queue` and `compute` (COMPUTE_* events). An ensemble step's `<model>` span is a child
of the ensemble's. Timestamps move from the monotonic clock to the system clock by one
offset read when a trace's spans start, as Triton's time_offset_.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.tracing import trace as names
from gateway.tracing.config import OpenTelemetryConfig
from gateway.tracing.trace import Trace
from protos.trace import TRACEPARENT

_ROOT_EVENTS = frozenset(
    {
        names.HTTP_RECV_START,
        names.HTTP_RECV_END,
        names.HTTP_SEND_START,
        names.HTTP_SEND_END,
        names.GRPC_WAITREAD_START,
        names.GRPC_WAITREAD_END,
        names.GRPC_SEND_START,
        names.GRPC_SEND_END,
        names.INFER_RESPONSE_COMPLETE,
    }
)
_MODEL_EVENTS = frozenset({names.REQUEST_START, names.QUEUE_START, names.REQUEST_END})
_COMPUTE_EVENTS = (names.COMPUTE_START, names.COMPUTE_INPUT_END, names.COMPUTE_OUTPUT_START, names.COMPUTE_END)
_SERVER = otel_trace.SpanKind.SERVER


class _Spans:
    """The spans a trace holds open from its REQUEST_START to its end."""

    __slots__ = ("model", "offset", "root")

    def __init__(self, offset: int, root: Any, model: Any) -> None:
        self.offset = offset
        self.root = root
        self.model = model


class SpanExport:
    """Spans for finished traces, and the W3C trace context read from requests."""

    def __init__(self, config: OpenTelemetryConfig) -> None:
        # Our own sampling decided already: every span of a traced request is recorded,
        # whatever sampled flag the client's context carries (Triton's force_sample).
        self._provider = TracerProvider(resource=Resource.create(dict(config.resource)), sampler=ALWAYS_ON)
        processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.url),
            max_queue_size=config.bsp_max_queue_size,
            schedule_delay_millis=config.bsp_schedule_delay,
            max_export_batch_size=config.bsp_max_export_batch_size,
        )
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("turnout")
        self._propagator = TraceContextTextMapPropagator()

    def extract(self, headers: Mapping[str, str]) -> Context | None:
        """The client's context from a `traceparent` header (or gRPC metadata), if valid."""
        if headers.get(TRACEPARENT) is None:
            return None
        context = self._propagator.extract(headers)
        if not otel_trace.get_current_span(context).get_span_context().is_valid:
            return None
        return context

    def parent_of_steps(self, trace: Trace) -> Context | None:
        """The context an ensemble's step traces start their spans in."""
        spans: _Spans | None = trace.spans
        return otel_trace.set_span_in_context(spans.model) if spans is not None else None

    def started(self, trace: Trace) -> None:
        """Open the trace's spans at REQUEST_START, so the sidecar call can carry its context."""
        offset = time.time_ns() - time.monotonic_ns()
        root = None
        context = trace.parent
        if not trace.parent_id:
            first = trace.timestamps[0][1]
            root = self._tracer.start_span("InferRequest", context=context, kind=_SERVER, start_time=first + offset)
            context = otel_trace.set_span_in_context(root)
        start = trace.timestamps[-1][1]
        model = self._tracer.start_span(trace.model, context=context, kind=_SERVER, start_time=start + offset)
        model.set_attribute("triton.model_name", trace.model)
        model.set_attribute("triton.trace_id", trace.id)
        model.set_attribute("triton.trace_parent_id", trace.parent_id)
        if trace.request_id:
            model.set_attribute("triton.request_id", trace.request_id)
        trace.spans = _Spans(offset, root, model)
        ids = model.get_span_context()
        trace.traceparent = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{int(ids.trace_flags):02x}"

    def finished(self, trace: Trace, now: int) -> None:
        spans: _Spans | None = trace.spans
        if spans is None:
            return  # failed before the gateway took it (an unknown model): nothing was opened
        offset = spans.offset
        stamps = dict(trace.timestamps)
        version = trace.version or trace.requested_version
        spans.model.set_attribute("triton.model_version", int(version) if version.isdigit() else -1)
        for name, ns in trace.timestamps:
            if name in _MODEL_EVENTS:
                spans.model.add_event(name, timestamp=ns + offset)
            elif name in _ROOT_EVENTS and spans.root is not None:
                spans.root.add_event(name, timestamp=ns + offset)
        if trace.sidecar:
            self._sidecar_spans(spans, stamps, trace.sidecar)
        request_end = stamps.get(names.REQUEST_END, now)
        spans.model.end(end_time=request_end + offset)
        if spans.root is not None:
            spans.root.end(end_time=max(ns for _, ns in trace.timestamps) + offset)

    def _sidecar_spans(self, spans: _Spans, stamps: Mapping[str, int], sidecar: Mapping[str, int]) -> None:
        offset = spans.offset
        start = self._tracer.start_span
        in_model = otel_trace.set_span_in_context(spans.model)
        span = start("sidecar", context=in_model, kind=_SERVER, start_time=sidecar[names.SIDECAR_START] + offset)
        in_sidecar = otel_trace.set_span_in_context(span)
        queue = start("queue", context=in_sidecar, kind=_SERVER, start_time=stamps[names.QUEUE_START] + offset)
        queue.end(end_time=stamps[names.COMPUTE_START] + offset)
        compute = start("compute", context=in_sidecar, kind=_SERVER, start_time=stamps[names.COMPUTE_START] + offset)
        for name in _COMPUTE_EVENTS:
            compute.add_event(name, timestamp=stamps[name] + offset)
        compute.end(end_time=stamps[names.COMPUTE_END] + offset)
        span.end(end_time=sidecar[names.SIDECAR_END] + offset)

    def close(self) -> None:
        """Export what is left and stop the processor's thread (blocking)."""
        self._provider.shutdown()
