"""The gateway's per-request families, kept as plain counts, read as prometheus_client's
own Counter and Histogram would have read for the same requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.metrics import DURATION_BUCKETS, MAX_ARM_SERIES, GatewayMetrics
from gateway.routing.versions import Decision, Reason

# Durations on, between and past the bounds: a bound counts what equals it (le).
REQUESTS = [
    ("simple", "default", "grpc", True, 0.0003),
    ("simple", "default", "grpc", True, 0.0005),
    ("simple", "default", "grpc", False, 0.0007),
    ("simple", "2", "http", True, 5.0),
    ("simple", "2", "http", True, 7.5),
    ("resnet", "resnet_trt:1", "grpc", False, 0.02),
]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def _reference() -> CollectorRegistry:
    registry = CollectorRegistry()
    requests = Counter("turnout_gateway_requests", "", ["model", "version", "protocol", "outcome"], registry=registry)
    durations = Histogram(
        "turnout_gateway_request_duration_seconds",
        "",
        ["model", "version", "protocol"],
        buckets=DURATION_BUCKETS,
        registry=registry,
    )
    routes = Counter("turnout_gateway_route_decisions", "", ["model", "version", "reason"], registry=registry)
    for model, version, protocol, success, seconds in REQUESTS:
        for outcome in ("success", "failure"):  # an arm's two outcomes appear together
            requests.labels(model, version, protocol, outcome)
        requests.labels(model, version, protocol, "success" if success else "failure").inc()
        durations.labels(model, version, protocol).observe(seconds)
    routes.labels("simple", "default", "default").inc(3)
    routes.labels("simple", "2", "weighted").inc()
    return registry


def _observed() -> tuple[CollectorRegistry, GatewayMetrics]:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for request in REQUESTS:
        metrics.observe_request(*request)
    for _ in range(3):
        metrics.count_route("simple", Decision("", Reason.DEFAULT), "default")
    metrics.count_route("simple", Decision("2", Reason.WEIGHTED), "2")
    return registry, metrics


def test_requests_durations_and_routes_read_as_prometheus_clients_own() -> None:
    registry, _ = _observed()
    ours = {key: value for key, value in _samples(registry).items() if key[0].startswith(_NAMES)}
    assert ours == _samples(_reference())
    created = [s for f in registry.collect() for s in f.samples if s.name.endswith("_created") and f.name in _NAMES]
    assert len(created) == 2 * 3 + 3 + 2  # each series's creation time, as prometheus_client writes it


def test_past_the_series_bound_new_versions_share_other() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for version in range(MAX_ARM_SERIES + 5):
        metrics.observe_request("many", str(version), "grpc", True, 0.001)
    samples = _samples(registry)
    arms = {dict(labels)["version"] for name, labels in samples if name == "turnout_gateway_requests_total"}
    assert len(arms) == MAX_ARM_SERIES + 1  # the bound, and "other"
    other = (("model", "many"), ("outcome", "success"), ("protocol", "grpc"), ("version", "other"))
    assert samples[("turnout_gateway_requests_total", other)] == 5  # the versions past the bound
    assert samples[("turnout_gateway_request_duration_seconds_count", (other[0], *other[2:]))] == 5


_NAMES = ("turnout_gateway_requests", "turnout_gateway_request_duration_seconds", "turnout_gateway_route_decisions")
