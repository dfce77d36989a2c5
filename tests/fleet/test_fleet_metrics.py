"""A fleet found through Consul shows on the gateway's /metrics as one Triton would: each
sidecar advertises its metrics port in its registration meta, and the gateway scrapes
every replica and sums them (load durations: the slowest), failure reasons and pending
counts included."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, gateway, metric, running, sidecar, wait_until


def _inputs(datatype: str = "INT32") -> list[grpcclient.InferInput]:
    data = np.arange(16, dtype=np.int32 if datatype == "INT32" else np.float32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], datatype) for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def _families(metrics_address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_gateway_sums_the_metrics_of_sidecars_found_in_consul(consul: Consul, fleet_repository: Path) -> None:
    service = "metrics-fleet"
    one = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    two = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(one, two, gw):
        entries = wait_until(lambda: len(consul.passing(service)) == 2 and consul.services(service), 20, "two replicas")
        advertised = sorted(entry["Meta"]["metrics"] for entry in entries.values())
        assert advertised == sorted([one.fields["metrics"], two.fields["metrics"]])
        for entry in entries.values():
            assert entry["Meta"]["metrics_port"] == entry["Meta"]["metrics"].rpartition(":")[2]

        # Two requests straight to each replica (so both have counts), four through the
        # gateway, and one the first replica rejects for its datatype.
        for address in (one.fields["grpc"], two.fields["grpc"]):
            with grpcclient.InferenceServerClient(address) as direct:
                for _ in range(2):
                    direct.infer("simple", _inputs())
        with grpcclient.InferenceServerClient(gw.fields["grpc"]) as client:
            wait_until(lambda: client.is_model_ready("simple"), 20, "the gateway to see the fleet")
            for _ in range(4):
                client.infer("simple", _inputs())
        with grpcclient.InferenceServerClient(one.fields["grpc"]) as direct, pytest.raises(InferenceServerException):
            direct.infer("simple", _inputs("FP32"))

        fleet = gw.fields["metrics"]
        replicas = (one.fields["metrics"], two.fields["metrics"])
        families = _families(fleet)
        for family in (
            "nv_inference_request_success",
            "nv_inference_request_failure",
            "nv_inference_pending_request_count",
            "nv_model_load_duration_secs",
            "nv_inference_compute_infer_duration_us",
            "turnout_sidecar_batch_size",
        ):
            assert family in families, family

        def summed(name: str, **labels: str) -> tuple[float, float]:
            return metric(fleet, name, model="simple", **labels), sum(
                metric(r, name, model="simple", **labels) for r in replicas
            )

        assert all(metric(r, "nv_inference_request_success", model="simple") >= 2 for r in replicas)
        assert summed("nv_inference_request_success") == (8, 8)
        # The rejected request was refused before it ran: as in Triton, counted nowhere.
        assert summed("nv_inference_request_failure", reason="OTHER") == (0, 0)
        assert summed("nv_inference_request_failure", reason="BACKEND") == (0, 0)
        # A load's duration is the slowest replica's, not a sum (replicas load in parallel).
        loads = [metric(r, "nv_model_load_duration_secs", model="simple") for r in replicas]
        assert max(loads) > 0
        assert metric(fleet, "nv_model_load_duration_secs", model="simple") == pytest.approx(max(loads))
        assert summed("nv_inference_pending_request_count") == (0, 0)


def test_the_fleet_view_keeps_counting_what_departed_replicas_counted(consul: Consul, fleet_repository: Path) -> None:
    """A replica that leaves (drained, scaled in) takes nothing out of the gateway's sums:
    a counter summed over the fleet never goes down, so rate() over it stays right."""
    service = "metrics-churn"
    one = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    two = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(one, gw):
        fleet = gw.fields["metrics"]
        try:
            wait_until(lambda: metric(fleet, "turnout_gateway_replicas", state="healthy") == 2, 20, "two replicas")
            for address in (one.fields["grpc"], two.fields["grpc"]):
                with grpcclient.InferenceServerClient(address) as direct:
                    for _ in range(3):
                        direct.infer("simple", _inputs())
            assert metric(fleet, "nv_inference_request_success", model="simple") == 6
            assert metric(fleet, "turnout_sidecar_batch_size_count", model="simple") == 6
        finally:
            two.stop()  # drains and deregisters
        wait_until(lambda: metric(fleet, "turnout_gateway_replicas", state="healthy") == 1, 20, "one replica left")
        assert metric(fleet, "nv_inference_request_success", model="simple") == 6
        assert metric(fleet, "turnout_sidecar_batch_size_count", model="simple") == 6
        # Gauges are the present fleet's only.
        assert metric(fleet, "turnout_sidecar_instances", model="simple") == metric(
            one.fields["metrics"], "turnout_sidecar_instances", model="simple"
        )
        with grpcclient.InferenceServerClient(gw.fields["grpc"]) as client:
            client.infer("simple", _inputs())
        assert metric(fleet, "nv_inference_request_success", model="simple") == 7
