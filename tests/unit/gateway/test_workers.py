"""How the metrics port of a gateway with workers combines the workers' expositions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.workers import FleetHighWater, sum_expositions


def _worker(requests: int, replicas: int, seconds: list[float]) -> str:
    registry = CollectorRegistry()
    counter = Counter("turnout_gateway_requests", "Requests", ["model"], registry=registry)
    counter.labels("simple").inc(requests)
    Gauge("turnout_gateway_replicas", "Replicas", ["state"], registry=registry).labels("ready").set(replicas)
    histogram = Histogram("turnout_gateway_request_duration_seconds", "Time", registry=registry, buckets=(0.1, 1))
    for value in seconds:
        histogram.observe(value)
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_counters_and_histograms_add_up_gauges_keep_the_largest_and_created_the_earliest() -> None:
    first, second = _worker(3, 2, [0.05, 0.5]), _worker(4, 1, [2.0])
    combined = _samples(sum_expositions([first, second]))
    assert combined[("turnout_gateway_requests_total", (("model", "simple"),))] == 7
    assert combined[("turnout_gateway_replicas", (("state", "ready"),))] == 2
    assert combined[("turnout_gateway_request_duration_seconds_count", ())] == 3
    assert combined[("turnout_gateway_request_duration_seconds_bucket", (("le", "0.1"),))] == 1
    assert combined[("turnout_gateway_request_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert combined[("turnout_gateway_request_duration_seconds_sum", ())] == 2.55
    created = [_samples(t)[("turnout_gateway_requests_created", (("model", "simple"),))] for t in (first, second)]
    assert combined[("turnout_gateway_requests_created", (("model", "simple"),))] == min(created)


def test_each_family_is_declared_once_and_in_the_order_first_seen() -> None:
    triton = "\n".join(
        [
            "# HELP nv_inference_count Inferences",
            "# TYPE nv_inference_count counter",
            'nv_inference_count{model="m",version="1"} 5',
        ]
    )
    text = sum_expositions([triton, _worker(1, 1, []), triton])
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert declared[0] == "nv_inference_count" and len(declared) == len(set(declared))
    assert 'nv_inference_count{model="m",version="1"} 10.0\n' in text


def test_fleet_counters_never_go_back_when_another_worker_answers() -> None:
    def fleet(count: float, quantile: float, queue: float) -> str:
        return "\n".join(
            [
                "# TYPE nv_inference_count counter",
                f'nv_inference_count{{model="m",version="1"}} {count}',
                "# TYPE nv_inference_request_summary_us summary",
                f'nv_inference_request_summary_us{{model="m",quantile="0.5"}} {quantile}',
                f'nv_inference_request_summary_us_count{{model="m"}} {count}',
                "# TYPE nv_inference_pending_request_count gauge",
                f'nv_inference_pending_request_count{{model="m"}} {queue}',
            ]
        )

    high_water = FleetHighWater()
    high_water.hold(fleet(10, 900, 4))  # worker 0 answers
    held = _samples(high_water.hold(fleet(8, 300, 1)))  # worker 1, which missed a departed replica
    assert held[("nv_inference_count_total", (("model", "m"), ("version", "1")))] == 10
    assert held[("nv_inference_request_summary_us_count", (("model", "m"),))] == 10
    assert held[("nv_inference_request_summary_us", (("model", "m"), ("quantile", "0.5")))] == 300
    assert held[("nv_inference_pending_request_count", (("model", "m"),))] == 1
    grown = _samples(high_water.hold(fleet(12, 300, 1)))
    assert grown[("nv_inference_count_total", (("model", "m"), ("version", "1")))] == 12
