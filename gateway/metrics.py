"""The gateway's own Prometheus metrics, kept in a registry the composition root owns.

What only the gateway knows: the requests it routes, counted and timed per arm (model
and version: the one a policy chose, the client named, or "default"; in an experiment
across models the version is the arm, `resnet_trt:1`, and the model the called name)
and protocol; routing decisions, shadows, their agreement and the largest output
difference seen; failovers, ejections; and the fleet as discovery sees it (replicas,
ready replicas per model). Per-model work inside sidecars is theirs to count (their
`nv_*`). `gateway.metrics_port` serves these, and a fleet view of Triton's families for
a single host scraping only the gateway.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from gateway.routing.versions import Decision

log = logging.getLogger(__name__)

# Cheap native buckets (Triton's latency summaries cost a third of its throughput, #8561).
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# Versions come from clients: past this many (model, version, protocol) series, a new
# version shares the label value "other".
MAX_ARM_SERIES = 512


@dataclass(frozen=True)
class _Arm:
    """One (model, version, protocol)'s children, made once."""

    successes: Counter
    failures: Counter
    durations: Histogram


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # Per arm: the A/B panels read rates, error ratios and quantiles off these two.
        self._requests = Counter(
            "turnout_gateway_requests",
            "Inference requests the gateway routed, by model, version (arm), protocol and outcome",
            ["model", "version", "protocol", "outcome"],
            registry=registry,
        )
        self._durations = Histogram(
            "turnout_gateway_request_duration_seconds",
            "Inference request duration through the gateway, by model, version (arm) and protocol",
            ["model", "version", "protocol"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        # labels() costs a lock and a dict build; keep each arm's children once.
        self._arms: dict[tuple[str, str, str], _Arm] = {}
        # Fleet routing. Labels stay bounded: versions are the policy's or "other",
        # reasons and outcomes are fixed sets, replicas are counted, not named.
        self._routes = Counter(
            "turnout_gateway_route_decisions",
            "Version routing decisions, by model, chosen version (arm) and reason",
            ["model", "version", "reason"],
            registry=registry,
        )
        self._route_children: dict[tuple[str, str, str], Counter] = {}  # as _arms: labels() once each
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
        self._model_ready = Gauge(
            "turnout_gateway_model_ready_replicas",
            "Healthy replicas with each model version the fleet lists READY (0: it cannot be served)",
            ["model", "version"],
            registry=registry,
        )

    def observe_request(self, model: str, version: str, protocol: str, success: bool, seconds: float) -> None:
        """One routed request of arm (model, version), its outcome and duration."""
        key = (model, version, protocol)
        children = self._arms.get(key)
        if children is None:
            if len(self._arms) >= MAX_ARM_SERIES:
                key = (model, "other", protocol)
                children = self._arms.get(key)
            if children is None:
                children = _Arm(
                    self._requests.labels(*key, "success"),
                    self._requests.labels(*key, "failure"),
                    self._durations.labels(*key),
                )
                self._arms[key] = children
        (children.successes if success else children.failures).inc()
        children.durations.observe(seconds)

    def count_route(self, model: str, decision: Decision, version: str) -> None:
        """`version` is the arm's label: the chosen version, or "other" for one no policy names."""
        key = (model, version or "default", decision.reason.value)
        child = self._route_children.get(key)
        if child is None:
            child = self._route_children[key] = self._routes.labels(*key)
        child.inc()
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

    def set_model_ready_replicas(self, model: str, version: str, ready: int) -> None:
        self._model_ready.labels(model, version).set(ready)

    def forget_model(self, model: str, version: str) -> None:
        """The fleet no longer lists the model version: its series goes."""
        with contextlib.suppress(KeyError):
            self._model_ready.remove(model, version)
