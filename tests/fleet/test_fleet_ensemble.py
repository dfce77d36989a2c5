"""Ensembles in a Consul fleet: the ensemble sidecar registers like any other, and a
gateway that knows its sidecars only from Consul runs the ensemble's steps on two ONNX
Runtime replicas, and keeps running it when one of them is killed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from protos.ready import SIDECAR_READY
from tests.fleet.fleet_harness import Consul, Process, gateway, running, sidecar, spawn, wait_until
from tests.harness import make_models, write_repository

PAIR = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
INT16 = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`simple` twice over: (a + b) + (a - b) = 2a and (a + b) - (a - b) = 2b."""
    repo = write_repository(tmp_path_factory.mktemp("fleet_ensemble"), ("simple",))
    steps = [
        ("simple", -1, PAIR, {"OUTPUT0": "s", "OUTPUT1": "d"}),
        ("simple", -1, {"INPUT0": "s", "INPUT1": "d"}, {"OUTPUT0": "TWICE_A", "OUTPUT1": "TWICE_B"}),
    ]
    outputs = [("TWICE_A", "INT32", [16]), ("TWICE_B", "INT32", [16])]
    make_models().write_ensemble(repo, "twice", INT16, outputs, steps)
    return repo


def _ensemble_sidecar(consul: Consul, repository: Path, service: str) -> Process:
    command = [sys.executable, "-m", "sidecars", "--framework=ensemble", f"--model-repository={repository}"]
    command += [f"--consul={consul.http}", f"--consul-service={service}", "--exit-timeout-secs=3"]
    return spawn(command, SIDECAR_READY)


def _twice(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("twice", inputs)
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("TWICE_B"), 2 * b)


def test_a_gateway_runs_an_ensemble_found_through_consul(consul: Consul, repository: Path) -> None:
    service = "fleet-ensemble"
    replicas = [sidecar(consul.http, repository, f"--consul-service={service}") for _ in range(2)]
    ensembles = _ensemble_sidecar(consul, repository, service)
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(*replicas, ensembles, gw):
        meta = wait_until(lambda: len(consul.passing(service)) == 3 and consul.passing(service), 20, "3 registrations")
        assert sorted(entry["Service"]["Meta"]["framework"] for entry in meta) == [
            "ensemble",
            "onnxruntime",
            "onnxruntime",
        ]
        http = httpclient.InferenceServerClient(gw.fields["http"])
        wait_until(lambda: http.is_model_ready("twice") and http.is_model_ready("simple"), 20, "models ready")
        assert http.get_model_config("twice")["platform"] == "ensemble"
        with grpcclient.InferenceServerClient(gw.fields["grpc"]) as client:
            for _ in range(20):
                _twice(client)
            replicas[0].kill()
            for _ in range(20):  # the steps fail over to the replica that is left
                _twice(client)
