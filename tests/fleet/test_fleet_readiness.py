"""Gateway readiness over a real Consul, from what discovery knows: one replica failing a
model costs nothing (requests go to the other), a model no replica can serve makes the
gateway unready under strict readiness and is reported (log line, repository index,
turnout_gateway_model_ready_replicas), not under --strict-readiness=false; and a gateway
whose Consul never answered is live but not ready until it does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.fleet.fleet_harness import Consul, consul_agent, gateway, metric, running, sidecar, wait_until
from tests.harness import write_repository

SIDECAR_FLAGS = ("--exit-on-error=false", "--strict-readiness=false")


def _broken_linear(repo: Path) -> Path:
    """A repository whose `linear` cannot load: version 1's file is not ONNX (and, as in
    Triton, one failed version fails the model's load)."""
    write_repository(repo, ("simple", "linear"))
    (repo / "linear" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    return repo


def _infer_linear(address: str, version: str = "") -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    with grpcclient.InferenceServerClient(address) as client:
        return client.infer("linear", [tensor], model_version=version).as_numpy("OUTPUT0")


def _index(http: str) -> dict[tuple[str, str], dict[str, str]]:
    entries = httpclient.InferenceServerClient(http).get_model_repository_index()
    return {(e["name"], e.get("version", "")): e for e in entries}


def _ready(http: str) -> bool:
    return bool(httpclient.InferenceServerClient(http).is_server_ready())


def test_one_replica_of_two_failing_a_model_keeps_the_gateway_ready(
    consul: Consul, fleet_repository: Path, tmp_path: Path
) -> None:
    service = "ready-one-failed"
    good = sidecar(consul.http, fleet_repository, f"--consul-service={service}", *SIDECAR_FLAGS)
    bad = sidecar(consul.http, _broken_linear(tmp_path / "bad"), f"--consul-service={service}", *SIDECAR_FLAGS)
    gw = gateway(consul.http, f"--consul-service={service}")
    with running(good, bad, gw):
        wait_until(lambda: len(consul.passing(service)) == 2, 20, "two passing replicas")
        http = gw.fields["http"]
        wait_until(lambda: metric(gw.fields["metrics"], "turnout_gateway_replicas", state="healthy") == 2, 20, "both")
        assert _ready(http)
        for _ in range(6):  # every one reaches the replica that loaded it
            np.testing.assert_array_equal(_infer_linear(gw.fields["grpc"], "1"), np.ones((1, 4)))
        assert metric(good.fields["metrics"], "nv_inference_request_success", model="linear", version="1") == 6
        ready = metric(gw.fields["metrics"], "turnout_gateway_model_ready_replicas", model="linear", version="1")
        assert ready == 1
        linear = _index(http)[("linear", "1")]
        assert linear["state"] == "UNAVAILABLE" and linear["reason"].startswith("1 of 2 replicas READY")


def test_a_model_no_replica_can_serve_makes_the_gateway_unready_under_strict_readiness(
    consul: Consul, fleet_repository: Path, tmp_path: Path
) -> None:
    service = "ready-all-failed"
    flags = (f"--consul-service={service}", *SIDECAR_FLAGS)
    replicas = [sidecar(consul.http, _broken_linear(tmp_path / f"bad{i}"), *flags) for i in range(2)]
    strict = gateway(consul.http, f"--consul-service={service}")
    lenient = gateway(consul.http, f"--consul-service={service}", "--strict-readiness=false")
    with running(*replicas, strict, lenient):
        wait_until(lambda: len(consul.passing(service)) == 2, 20, "two passing replicas")
        wait_until(lambda: "model 'linear' version 1 cannot be served" in strict.output(), 20, "the log line")
        assert "failed to load on 2 replicas" in strict.output()
        assert not _ready(strict.fields["http"])
        ready = metric(strict.fields["metrics"], "turnout_gateway_model_ready_replicas", model="linear", version="1")
        assert ready == 0
        linear = _index(strict.fields["http"])[("linear", "1")]
        assert linear["state"] == "UNAVAILABLE" and "onnx" in linear["reason"].lower()
        # Not strict: the gateway serves what it can.
        assert _ready(lenient.fields["http"])
        with grpcclient.InferenceServerClient(lenient.fields["grpc"]) as client:
            assert client.is_model_ready("simple") and not client.is_model_ready("linear")


def test_a_model_whose_only_replica_dies_makes_the_gateway_unready_under_strict_readiness(
    consul: Consul, fleet_repository: Path, tmp_path: Path
) -> None:
    service = "ready-replica-gone"
    flags = (f"--consul-service={service}", *SIDECAR_FLAGS)
    simple = sidecar(consul.http, write_repository(tmp_path / "simple", ("simple",)), *flags)
    linear = sidecar(consul.http, write_repository(tmp_path / "linear", ("linear",)), *flags)
    strict = gateway(consul.http, f"--consul-service={service}")
    lenient = gateway(consul.http, f"--consul-service={service}", "--strict-readiness=false")
    with running(simple, linear, strict, lenient):
        wait_until(lambda: len(consul.passing(service)) == 2, 20, "two passing replicas")
        wait_until(lambda: _ready(strict.fields["http"]), 20, "the strict gateway ready")
        _infer_linear(strict.fields["grpc"])

        linear.kill()  # its registration stays, failing its check, until Consul deregisters it

        wait_until(lambda: not _ready(strict.fields["http"]), 20, "the strict gateway unready")
        entry = _index(strict.fields["http"])[("linear", "1")]
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"] == "no ready replica: listed by 1 replica failing the health check"
        assert _ready(lenient.fields["http"])
        with grpcclient.InferenceServerClient(lenient.fields["grpc"]) as client:
            assert client.is_model_ready("simple")


def test_a_gateway_whose_consul_never_answered_is_live_but_not_ready_until_it_does(fleet_repository: Path) -> None:
    with consul_agent() as agent:
        agent.close()  # its address answers nothing now; the same agent starts again below
        service = "ready-late-consul"
        gw = gateway(agent.http, f"--consul-service={service}")
        with running(gw):
            http = httpclient.InferenceServerClient(gw.fields["http"])
            assert "cannot reach the Consul agent" in gw.output()
            assert http.is_server_live() and not http.is_server_ready()

            agent.start()
            with running(sidecar(agent.http, fleet_repository, f"--consul-service={service}")):
                wait_until(http.is_server_ready, 30, "the gateway ready once Consul answers")
                _infer_linear(gw.fields["grpc"])
