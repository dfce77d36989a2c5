"""The gateway's tracer: samples requests by the settings in force, and writes each
finished trace to its setting's trace file (Triton mode) or exports it as spans
(OpenTelemetry mode). Runs on the event loop; file writes and span exports happen on
threads of their own.

Per request it costs one settings lookup and, when the setting is on, its sampling count.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gateway.tracing.config import TIMESTAMPS, TraceConfig, TraceMode
from gateway.tracing.files import TraceFiles
from gateway.tracing.settings import TraceSettings
from gateway.tracing.trace import REQUEST_START, Trace

if TYPE_CHECKING:
    from gateway.tracing.otel import SpanExport


class Tracer:
    """Sampling, settings and output for one gateway process; `close()` when it stops."""

    def __init__(self, config: TraceConfig | None = None, clock: Callable[[], int] = time.monotonic_ns) -> None:
        config = config or TraceConfig()
        self._clock = clock
        self._files = TraceFiles() if config.mode is TraceMode.TRITON else None
        self.settings = TraceSettings(config, self._files)
        self._export: SpanExport | None = None
        if config.mode is TraceMode.OPENTELEMETRY:
            from gateway.tracing.otel import SpanExport  # the SDK, only in this mode

            self._export = SpanExport(config.opentelemetry)
        self._ids = itertools.count(1)  # Triton's trace ids start at 1; 0 means "no parent"
        self._children: dict[int, list[Trace]] = {}

    def sample(self, model: str, headers: Mapping[str, str]) -> Trace | None:
        """A Trace if this request to `model` is traced, else None. A client's propagated
        OpenTelemetry context traces the request whatever the rate (as Triton)."""
        setting = self.settings.get(model)
        if TIMESTAMPS not in setting.level:
            return None  # OFF, or TENSORS alone, which records nothing here
        parent = self._export.extract(headers) if self._export is not None else None
        if not setting.sample(force=parent is not None):
            return None
        trace = Trace(next(self._ids), setting, self, self._clock, parent)
        trace.model = model
        return trace

    def request_started(self, trace: Trace) -> None:
        if self._export is not None:
            self._export.started(trace)

    def child(self, parent: Trace, model: str, version: str) -> Trace:
        """The trace of an ensemble step: not sampled again, written with its parent."""
        context = self._export.parent_of_steps(parent) if self._export is not None else None
        child = Trace(next(self._ids), parent.setting, self, self._clock, context, parent_id=parent.id)
        child.model, child.requested_version = model, version
        self._children.setdefault(parent.id, []).append(child)
        return child

    def finish(self, trace: Trace) -> None:
        children = self._children.pop(trace.id, [])
        if self._export is not None:
            self._export.finished(trace, self._clock())
            return
        if trace.parent_id:
            return  # written with its parent, as Triton writes a trace and its children together
        records = [triton_records(trace), *(triton_records(c) for c in children if c.finished)]
        trace.setting.collect(",".join(records))

    async def close(self) -> None:
        """Write what waits and stop the writers: traces still open are lost."""
        self.settings.close()
        if self._files is not None:
            await asyncio.to_thread(self._files.close)
        if self._export is not None:
            await asyncio.to_thread(self._export.close)


def triton_records(trace: Trace) -> str:
    """The trace's JSON objects as Triton's trace file holds them, comma-joined: one per
    timestamp, in time order, and before REQUEST_START the one naming the model."""
    version = trace.version or trace.requested_version
    head: dict[str, object] = {
        "id": trace.id,
        "model_name": trace.model,
        "model_version": int(version) if version.isdigit() else -1,
    }
    if trace.request_id:
        head["request_id"] = trace.request_id
    if trace.parent_id:
        head["parent_id"] = trace.parent_id
    stamps = sorted(trace.timestamps, key=lambda stamp: stamp[1])
    records = [] if any(name == REQUEST_START for name, _ in stamps) else [_json(head)]
    for name, ns in stamps:
        if name == REQUEST_START:
            records.append(_json(head))
        records.append(_json({"id": trace.id, "timestamps": [{"name": name, "ns": ns}]}))
    return ",".join(records)


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
