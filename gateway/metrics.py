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
import itertools
import logging
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from gateway.routing.versions import Decision

log = logging.getLogger(__name__)

# Cheap native buckets (Triton's latency summaries cost a third of its throughput, #8561).
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# Versions come from clients: past this many (model, version, protocol) series, a new
# version shares the label value "other".
MAX_ARM_SERIES = 512


class _Arm:
    """One (model, version, protocol)'s requests and their durations: plain numbers the
    event loop adds to (prometheus_client's children take a lock per add and walk the
    buckets in Python, 2.5 µs a request), read as Prometheus families at a scrape."""

    __slots__ = ("buckets", "created", "failures", "seconds", "successes")

    def __init__(self) -> None:
        self.successes = 0
        self.failures = 0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # not cumulative; the last is +Inf
        self.seconds = 0.0
        self.created = time.time()


class _Routes:
    """One (model, arm, reason)'s routing decisions, counted as _Arm counts."""

    __slots__ = ("count", "created")

    def __init__(self) -> None:
        self.count = 0
        self.created = time.time()


_REQUESTS = "turnout_gateway_requests"
_DURATIONS = "turnout_gateway_request_duration_seconds"
_ROUTES = "turnout_gateway_route_decisions"
_BOUNDS = [floatToGoString(bound) for bound in DURATION_BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]


class _PerRequest(Collector):
    """The families every routed request adds to, rendered from plain counts at a scrape
    (the metrics port's thread: it copies each dictionary and list, whole, under the GIL,
    so it never iterates one the event loop grows)."""

    def __init__(self, arms: dict[tuple[str, str, str], _Arm], routes: dict[tuple[str, str, str], _Routes]) -> None:
        self._arms = arms
        self._routes = routes

    def describe(self) -> list[Metric]:
        return [Metric(_REQUESTS, "", "counter"), Metric(_DURATIONS, "", "histogram"), Metric(_ROUTES, "", "counter")]

    def collect(self) -> Iterator[Metric]:
        requests = Metric(
            _REQUESTS, "Inference requests the gateway routed, by model, version (arm), protocol and outcome", "counter"
        )
        durations = Metric(
            _DURATIONS,
            "Inference request duration through the gateway, by model, version (arm) and protocol",
            "histogram",
        )
        created = []
        for (model, version, protocol), arm in list(self._arms.items()):
            labels = {"model": model, "version": version, "protocol": protocol}
            for outcome, count in (("success", arm.successes), ("failure", arm.failures)):
                outcome_labels = {**labels, "outcome": outcome}
                requests.samples.append(Sample(f"{_REQUESTS}_total", outcome_labels, float(count)))
                created.append(Sample(f"{_REQUESTS}_created", outcome_labels, arm.created))
            buckets = list(itertools.accumulate(list(arm.buckets)))
            for bound, count in zip(_BOUNDS, buckets, strict=True):
                durations.samples.append(Sample(f"{_DURATIONS}_bucket", {**labels, "le": bound}, float(count)))
            durations.samples += [
                Sample(f"{_DURATIONS}_count", labels, float(buckets[-1])),
                Sample(f"{_DURATIONS}_sum", labels, arm.seconds),
                Sample(f"{_DURATIONS}_created", labels, arm.created),
            ]
        requests.samples += created
        routes = Metric(_ROUTES, "Version routing decisions, by model, chosen version (arm) and reason", "counter")
        routes_created = []
        for (model, version, reason), counted in list(self._routes.items()):
            labels = {"model": model, "version": version, "reason": reason}
            routes.samples.append(Sample(f"{_ROUTES}_total", labels, float(counted.count)))
            routes_created.append(Sample(f"{_ROUTES}_created", labels, counted.created))
        routes.samples += routes_created
        yield requests
        yield durations
        yield routes


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # Per arm: the A/B panels read rates, error ratios and quantiles off requests and
        # durations. Fleet routing: labels stay bounded (versions are the policy's or
        # "other", reasons and outcomes are fixed sets, replicas are counted, not named).
        self._arms: dict[tuple[str, str, str], _Arm] = {}
        self._routes: dict[tuple[str, str, str], _Routes] = {}
        registry.register(_PerRequest(self._arms, self._routes))
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
        arm = self._arms.get(key)
        if arm is None:
            if len(self._arms) >= MAX_ARM_SERIES:
                key = (model, "other", protocol)
                arm = self._arms.get(key)
            if arm is None:
                arm = self._arms[key] = _Arm()
        if success:
            arm.successes += 1
        else:
            arm.failures += 1
        arm.buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1  # le: a bound counts what equals it
        arm.seconds += seconds

    def count_route(self, model: str, decision: Decision, version: str) -> None:
        """`version` is the arm's label: the chosen version, or "other" for one no policy names."""
        key = (model, version or "default", decision.reason.value)
        counted = self._routes.get(key)
        if counted is None:
            counted = self._routes[key] = _Routes()
        counted.count += 1
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
