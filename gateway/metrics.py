"""The gateway's own Prometheus metrics, kept in a registry the composition root owns.

The gateway counts the requests it routes, per model, protocol and outcome, times them
per model, version and protocol, and counts routing decisions, shadows (with the largest
output difference seen), failovers and ejections. In an experiment across models the
"version" label is the arm (`resnet_trt:1`) and "model" the called name.
`gateway.metrics_port` serves them with the fleet's Triton metrics.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from gateway.routing.versions import Decision

log = logging.getLogger(__name__)

# Cheap native buckets (Triton's latency summaries cost a third of its throughput, #8561).
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_DURATION_SERIES = 512


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
        self._durations = Histogram(
            "turnout_gateway_request_duration_seconds",
            "Inference request duration through the gateway, by model, version and protocol",
            ["model", "version", "protocol"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._duration_children: dict[tuple[str, str, str], Histogram] = {}
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
        # Shadow comparison with tolerance: the largest |shadow - primary| seen, per arm and output.
        self._shadow_difference = Gauge(
            "turnout_gateway_shadow_max_difference",
            "Largest absolute difference between a shadow's numeric output and the primary's, by model, arm and output",
            ["model", "version", "output"],
            registry=registry,
        )
        self._shadow_difference_seen: dict[tuple[str, str, str], float] = {}
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

    def observe_request(self, model: str, version: str, protocol: str, seconds: float) -> None:
        key = (model, version, protocol)
        child = self._duration_children.get(key)
        if child is None:
            # Versions come from clients: past a bound, new ones share one label value.
            if len(self._duration_children) >= MAX_DURATION_SERIES:
                key = (model, "other", protocol)
                child = self._duration_children.get(key)
            if child is None:
                child = self._durations.labels(*key)
                self._duration_children[key] = child
        child.observe(seconds)

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

    def observe_shadow_difference(self, model: str, version: str, output: str, difference: float) -> None:
        key = (model, version, output)
        if difference > self._shadow_difference_seen.get(key, -1.0):
            self._shadow_difference_seen[key] = difference
            self._shadow_difference.labels(*key).set(difference)

    def count_failover(self, model: str, outcome: str) -> None:
        self._failovers.labels(model, outcome).inc()

    def count_ejection(self, framework: str) -> None:
        self._ejections.labels(framework).inc()

    def set_replicas(self, healthy: int, ejected: int) -> None:
        self._replicas.labels("healthy").set(healthy)
        self._replicas.labels("ejected").set(ejected)
