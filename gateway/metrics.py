"""The gateway's own Prometheus metrics, kept in a registry the composition root owns.

Per-model inference metrics in Triton's names come from the sidecars later; here
the gateway counts the requests it routes, per model, protocol and outcome.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, start_http_server


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

    def count_request(self, model: str, protocol: str, success: bool) -> None:
        key = (model, protocol, success)
        child = self._children.get(key)
        if child is None:
            child = self._requests.labels(model, protocol, "success" if success else "failure")
            self._children[key] = child
        child.inc()


class MetricsServer:
    """Serves the registry as Prometheus text on its own thread (prometheus_client's WSGI server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
