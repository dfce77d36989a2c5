"""The Grafana dashboard's queries against a real Prometheus scraping a real fleet: two
gateways and three sidecar replicas found in a real Consul, scraped with
compose/prometheus.yml's own rules (gateways by address here, sidecars through Consul).
Every panel's PromQL is evaluated, and its figures checked against the requests sent:
nothing counted twice (the gateways' copy of nv_* is dropped; every gateway sees the
same replicas), per-arm counts that agree with the sidecars' per-version counts.

Prometheus is Debian's, fetched by `make setup` (scripts/install-prometheus)."""

from __future__ import annotations

import json
import math
import re
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, Process, gateway, metric, running, sidecar, spawn, wait_until
from tests.harness import ROOT, free_port, make_models, write_repository

COMPOSE = ROOT / "compose"
PROMETHEUS = ROOT / ".tools" / "prometheus" / "usr" / "bin" / "prometheus"
NO_PROMETHEUS = (
    "no prometheus binary: `make setup` fetches Debian's (scripts/install-prometheus, needs apt-get); "
    "elsewhere put a prometheus binary, 2.24 or newer, on PATH"
)
SERVICE = "dashboard-fleet"
WEIGHTED, SIMPLE, FAILED = 40, 10, 5  # linear by weight, simple, linear version 1 with a wrong datatype


def prometheus_binary() -> Path | None:
    if PROMETHEUS.exists():
        return PROMETHEUS
    found = shutil.which("prometheus")
    return Path(found) if found else None


def panels() -> dict[str, list[str]]:
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "turnout.json").read_text())
    return {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in dashboard["panels"]}


def cumulative(expr: str) -> str:
    """The panel's query over everything counted so far: `rate(x[1m])` becomes `x`, so its
    figures are exact counts to compare with the requests sent."""
    return re.sub(r"rate\(([^\[\]()]+)\[[^\]]+\]\)", r"\1", expr)


def scrape_config(consul: Consul, gateways: list[Process]) -> dict[str, Any]:
    """compose/prometheus.yml with this fleet's addresses: the gateway job's targets are
    listed (compose finds them in Docker's DNS), the sidecar job asks this Consul; every
    relabelling rule is the compose file's own."""
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_job = jobs["turnout-gateway"]
    del gateway_job["dns_sd_configs"]
    gateway_job["static_configs"] = [{"targets": [gw.fields["metrics"] for gw in gateways]}]
    sidecar_job = jobs["turnout-sidecar"]
    sidecar_job["consul_sd_configs"] = [{"server": consul.http, "services": [SERVICE], "refresh_interval": "1s"}]
    config["scrape_configs"] = [gateway_job, sidecar_job]
    return config


class Prometheus:
    def __init__(self, binary: Path, config: Path, storage: Path) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        command = [str(binary), f"--config.file={config}", f"--storage.tsdb.path={storage}"]
        self.process = spawn([*command, f"--web.listen-address={self.address}"], None)
        wait_until(self._ready, 60, "prometheus ready", 0.2)

    def _ready(self) -> bool:
        if self.process.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.process.output()}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        url = f"http://{self.address}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", (expr, answer)
        return [(series["metric"], float(series["value"][1])) for series in answer["data"]["result"]]

    def by(self, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(series.get(label, "") for label in labels): value for series, value in self.query(expr)}

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return result[0][1] if result else 0.0


@pytest.fixture
def prometheus_path() -> Path:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(NO_PROMETHEUS)
    return binary


def _linear(data: np.ndarray, version: str = "") -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32" if data.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def _simple() -> list[grpcclient.InferInput]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def test_every_dashboard_panel_adds_up_over_two_gateways_and_three_replicas(
    consul: Consul, prometheus_path: Path, tmp_path: Path
) -> None:
    # Two versions that answer alike, so every shadow of version 1 to 2 agrees.
    repository = write_repository(tmp_path / "models", ("simple",))
    make_models().write_linear(repository, versions={1: 1.0, 2: 1.0})
    routing = tmp_path / "routing.yaml"
    routing.write_text(
        yaml.safe_dump({"models": {"linear": {"weights": {"1": 1, "2": 1}, "shadow": {"version": "2"}}}})
    )
    replicas = [sidecar(consul.http, repository, f"--consul-service={SERVICE}") for _ in range(3)]
    flags = (f"--consul-service={SERVICE}", f"--routing={routing}", "--routing-kv-prefix=dashboard-test/")
    gateways = [gateway(consul.http, *flags, f"--routing-seed={seed}") for seed in (1, 2)]
    with running(*replicas, *gateways):
        wait_until(lambda: len(consul.passing(SERVICE)) == 3, 20, "three passing replicas")
        for address in (gw.fields["metrics"] for gw in gateways):
            wait_until(lambda: metric(address, "turnout_gateway_replicas", state="healthy") == 3, 20, "the fleet")  # noqa: B023
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(consul, gateways)))
        prometheus = Prometheus(prometheus_path, config, tmp_path / "tsdb")
        try:
            wait_until(lambda: prometheus.value("count(up == 1)") == 5, 60, "prometheus scraping 5 targets")
            # Two halves with a scrape between, so each arm's rate has two points to span.
            _send(gateways, WEIGHTED // 2, SIMPLE // 2, FAILED // 2)
            half = WEIGHTED // 2 + SIMPLE // 2 + FAILED // 2
            wait_until(lambda: prometheus.value("sum(turnout_gateway_requests_total)") == half, 30, "the first half")
            _send(gateways, WEIGHTED - WEIGHTED // 2, SIMPLE - SIMPLE // 2, FAILED - FAILED // 2)

            # What the gateways counted, read from them: the weighted draw split linear in two.
            def counted(name: str, **labels: str) -> float:
                return sum(metric(gw.fields["metrics"], name, **labels) for gw in gateways)

            to_one = counted("turnout_gateway_requests_total", model="linear", version="1", outcome="success")
            to_two = counted("turnout_gateway_requests_total", model="linear", version="2", outcome="success")
            assert to_one + to_two == WEIGHTED and to_one > 0 and to_two > 0
            # Every request routed to version 1 was shadowed to 2, after its answer.
            wait_until(lambda: counted("turnout_gateway_shadow_requests_total") == to_one, 20, "the shadows")

            sent = WEIGHTED + SIMPLE + FAILED
            executed = WEIGHTED + to_one + SIMPLE  # the sidecars also ran the shadows
            wait_until(
                lambda: (
                    prometheus.value("sum(turnout_gateway_requests_total)") == sent
                    and prometheus.value("sum(nv_inference_request_success)") == executed
                    and prometheus.value("sum(turnout_gateway_shadow_requests_total)") == to_one
                ),
                60,
                f"prometheus to scrape {sent} routed and {executed} executed requests, once each",
            )
            assert prometheus.query('{__name__=~"nv_.*|turnout_sidecar_.*", job="turnout-gateway"}') == []
            assert prometheus.value('count(up{job="turnout-gateway"} == 1)') == 2
            _check_panels(prometheus, to_one, to_two)
        finally:
            prometheus.process.stop()


def _send(gateways: list[Process], weighted: int, simple: int, failed: int) -> None:
    """`weighted` requests to linear (the policy picks the version), `simple` to simple,
    `failed` to linear version 1 with the wrong datatype; alternately to each gateway."""
    clients = [grpcclient.InferenceServerClient(gw.fields["grpc"]) for gw in gateways]
    ones = np.ones((1, 4), dtype=np.float32)
    try:
        for i in range(weighted):
            np.testing.assert_array_equal(clients[i % 2].infer("linear", _linear(ones)).as_numpy("OUTPUT0"), ones)
        for i in range(simple):
            clients[i % 2].infer("simple", _simple())
        for i in range(failed):
            with pytest.raises(InferenceServerException):
                clients[i % 2].infer("linear", _linear(np.ones((1, 4), dtype=np.int32)), model_version="1")
    finally:
        for client in clients:
            client.close()


def _check_panels(prometheus: Prometheus, to_one: float, to_two: float) -> None:
    queries = panels()
    # Every query as Grafana sends it is valid PromQL; the rate panels over traffic have data.
    for exprs in queries.values():
        for expr in exprs:
            prometheus.query(expr)
    for title in ("Requests per second by model", "A/B: requests per second by arm", "A/B: latency p50 and p99 by arm"):
        for expr in queries[title]:
            assert any(value > 0 for _, value in prometheus.query(expr)), (title, expr)

    def figures(title: str, *labels: str, target: int = 0) -> dict[tuple[str, ...], float]:
        return prometheus.by(cumulative(queries[title][target]), *labels)

    arm_one = to_one + FAILED
    assert figures("Requests per second by model", "model") == {
        ("linear",): WEIGHTED + to_one,
        ("simple",): SIMPLE,
    }
    # The failed requests were refused before they ran (a wrong datatype): as in Triton, no
    # model counts them; the gateway's outcomes below do.
    failures = figures("Failed requests per second by model", "model", "reason")
    assert sum(failures.values()) == 0
    latency = figures("Mean request latency by model", "model")
    assert set(latency) == {("linear",), ("simple",)} and all(0 < v < 10_000 for v in latency.values())
    assert all(v >= 0 for v in figures("Mean queue time by model", "model").values())

    assert figures("A/B: requests per second by arm", "model", "version") == {
        ("linear", "1"): arm_one,
        ("linear", "2"): to_two,
        ("simple", "default"): SIMPLE,
    }
    errors = figures("A/B: error ratio by arm", "model", "version")
    assert errors[("linear", "1")] == pytest.approx(FAILED / arm_one)
    assert errors[("linear", "2")] == 0 and errors[("simple", "default")] == 0
    for target in (0, 1):
        quantiles = figures("A/B: latency p50 and p99 by arm", "model", "version", target=target)
        assert set(quantiles) == {("linear", "1"), ("linear", "2"), ("simple", "default")}
        assert all(0 < v < 5 and math.isfinite(v) for v in quantiles.values())
    assert figures("A/B: shadow agreement by candidate", "model", "version") == {("linear", "2"): 1.0}

    assert figures("Gateway requests by protocol and outcome", "protocol", "outcome") == {
        ("grpc", "success"): WEIGHTED + SIMPLE,
        ("grpc", "failure"): FAILED,
    }
    routes = figures("Routing decisions by model and version", "model", "version")
    assert sum(v for (model, _), v in routes.items() if model == "linear") == WEIGHTED + FAILED
    assert figures("Shadow requests by outcome", "model", "version", "outcome") == {("linear", "2", "same"): to_one}
    assert figures("Sticky hits by model", "model") == {}
    healthy, ejected = (prometheus.query(cumulative(expr)) for expr in queries["Sidecar replicas"])
    assert [value for _, value in healthy] == [3]  # not 6: both gateways list the same three
    assert sorted(value for _, value in ejected) == [0, 0]
    assert all(v == 0 for v in figures("Failovers and ejections", "outcome").values())
    assert figures("Ready replicas per model version", "model", "version") == {
        ("linear", "1"): 3,
        ("linear", "2"): 3,
        ("simple", "1"): 3,
    }
    assert all(v == 0 for v in figures("Pending requests by model", "model").values())
