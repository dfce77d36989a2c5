"""The gateway's own Prometheus metrics, kept in a registry the composition root owns.

The gateway counts the requests it routes, per model, protocol and outcome, and renders
the sidecars' statistics under Triton's metric names.
"""

from __future__ import annotations

import asyncio
import logging
import socketserver
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from gateway.policy import Decision

log = logging.getLogger(__name__)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._requests = Counter(
            "turnout_gateway_requests",
            "Inference requests the gateway routed, by model, protocol and outcome",
            ["model", "protocol", "outcome"],
            registry=registry,
        )
        # labels() costs a lock and a dict build; keep each child once per label set.
        self._children: dict[tuple[str, str, bool], Counter] = {}
        # Fleet routing. Labels stay bounded: versions are the policy's or "other",
        # reasons and outcomes are fixed sets, replicas are counted, not named.
        self._routes = Counter(
            "turnout_gateway_route_decisions",
            "Version routing decisions, by model, chosen version (arm) and reason",
            ["model", "version", "reason"],
            registry=registry,
        )
        self._sticky = Counter(
            "turnout_gateway_sticky_hits", "Requests whose sticky key chose the version", ["model"], registry=registry
        )
        self._skipped = Counter(
            "turnout_gateway_route_skipped_versions",
            "Weighted versions skipped for want of a ready replica (their weight redistributed)",
            ["model", "version"],
            registry=registry,
        )
        self._shadows = Counter(
            "turnout_gateway_shadow_requests",
            "Shadow requests by model, candidate version and outcome (same, different, error, dropped)",
            ["model", "version", "outcome"],
            registry=registry,
        )
        self._shadow_latency = Histogram(
            "turnout_gateway_shadow_latency_seconds",
            "Latency of answered shadow requests",
            ["model", "version"],
            registry=registry,
        )
        self._failovers = Counter(
            "turnout_gateway_failovers",
            "Requests that could not reach a replica: retried on another, or out of replicas/time",
            ["model", "outcome"],
            registry=registry,
        )
        self._ejections = Counter(
            "turnout_gateway_replica_ejections",
            "Replicas ejected after a failed send",
            ["framework"],
            registry=registry,
        )
        self._replicas = Gauge(
            "turnout_gateway_replicas", "Replicas known from discovery, by state", ["state"], registry=registry
        )

    def count_request(self, model: str, protocol: str, success: bool) -> None:
        key = (model, protocol, success)
        child = self._children.get(key)
        if child is None:
            child = self._requests.labels(model, protocol, "success" if success else "failure")
            self._children[key] = child
        child.inc()

    def count_route(self, model: str, decision: Decision, version: str) -> None:
        """`version` is the arm's label: the chosen version, or "other" for one no policy names."""
        self._routes.labels(model, version or "default", decision.reason.value).inc()
        if decision.sticky_key:
            self._sticky.labels(model).inc()
        for version in decision.skipped:
            self._skipped.labels(model, version).inc()

    def count_shadow(self, model: str, version: str, outcome: str) -> None:
        self._shadows.labels(model, version, outcome).inc()

    def observe_shadow_latency(self, model: str, version: str, seconds: float) -> None:
        self._shadow_latency.labels(model, version).observe(seconds)

    def count_failover(self, model: str, outcome: str) -> None:
        self._failovers.labels(model, outcome).inc()

    def count_ejection(self, framework: str) -> None:
        self._ejections.labels(framework).inc()

    def set_replicas(self, healthy: int, ejected: int) -> None:
        self._replicas.labels("healthy").set(healthy)
        self._replicas.labels("ejected").set(ejected)


# Triton's per-model families, read at scrape time from the sidecars' statistics, so one
# scrape of the gateway shows the whole fleet's models (full metrics are a later issue).
# prometheus_client would print counters as `<name>_total`; Triton's dashboards expect
# the bare names, so these are rendered here in the text format.
_FAMILIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)


def _values(stats: Any) -> tuple[int, ...]:
    s = stats.inference_stats
    return (
        s.success.count,
        s.fail.count,
        stats.inference_count,
        stats.execution_count,
        (s.success.ns + s.fail.ns) // 1000,
        s.queue.ns // 1000,
        s.compute_input.ns // 1000,
        s.compute_infer.ns // 1000,
        s.compute_output.ns // 1000,
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_model_statistics(model_stats: Iterable[Any]) -> str:
    """Triton's per-model counters in the Prometheus text format; families are declared
    even when no model has samples, as Triton does."""
    rows: list[list[str]] = [[] for _ in _FAMILIES]
    for stats in model_stats:
        labels = f'model="{_escape(stats.name)}",version="{_escape(stats.version)}"'
        for index, ((name, _), value) in enumerate(zip(_FAMILIES, _values(stats), strict=True)):
            extra = ',reason="OTHER"' if name.endswith("_failure") else ""
            rows[index].append(f"{name}{{{labels}{extra}}} {value}")
    lines: list[str] = []
    for (name, text), samples in zip(_FAMILIES, rows, strict=True):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", *samples]
    return "\n".join(lines) + "\n"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class MetricsServer:
    """Serves `/metrics` (and `/metrics/`) on its own thread: the registry, then Triton's
    per-model counters from `statistics`, a coroutine run on `loop` for each scrape."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        statistics: Callable[[], Coroutine[Any, Any, Any]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._registry = registry
        self._statistics = statistics
        self._loop = loop
        self._timeout = timeout
        self._server = make_server(host, port, self._app, _ThreadingServer, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/metrics/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Not Found"]
        body = generate_latest(self._registry) + self._model_statistics().encode()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

    def _model_statistics(self) -> str:
        if self._statistics is None or self._loop is None:
            return render_model_statistics(())
        try:
            future = asyncio.run_coroutine_threadsafe(self._statistics(), self._loop)
            response: Any = future.result(self._timeout)
        except Exception:  # a scrape must not fail because one sidecar is away
            log.warning("model statistics unavailable for this scrape", exc_info=True)
            return render_model_statistics(())
        return render_model_statistics(response.model_stats)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
