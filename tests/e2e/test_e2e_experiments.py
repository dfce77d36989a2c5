"""An experiment across frameworks under `turnout up`: a routing file sends the called
name `adder` to Triton's `simple` as ONNX and as TorchScript; answers come back under the
called name with the arm as model_version over HTTP and gRPC, a shadow to the other
framework compares its INT32 outputs exactly, and a routing file whose arm names a model
the sidecars do not serve stops the start with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.fleet.fleet_harness import metric, wait_until
from tests.harness import Server, ServerFailedToStart, make_models, turnout_up

pytest.importorskip("torch", reason="the PyTorch sidecar needs torch (pip install -c constraints.txt -e '.[pytorch]')")

ROUTING = """\
models:
  adder:
    weights: {"simple:1": 50, "simple_torch:1": 50}
  mirrored:
    weights: {"simple:1": 1}
    shadow: {version: "simple_torch:1", rtol: 0.5}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("repo_experiment")
    make_models().write_simple(repo)
    make_models().write_torch_simple(repo, name="simple_torch", naming="forward")
    routing = repo.parent / f"{repo.name}-routing.yaml"
    routing.write_text(ROUTING)
    with turnout_up(repo, f"--routing={routing}") as running:
        yield running


def _inputs(module: object) -> tuple[list[object], np.ndarray]:
    first = np.arange(16, dtype=np.int32).reshape(1, 16)
    tensors = []
    for name, array in (("INPUT0", first), ("INPUT1", np.ones((1, 16), np.int32))):
        tensor = module.InferInput(name, [1, 16], "INT32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors, first


def test_an_experiment_answers_from_both_frameworks_under_the_called_name(server: Server) -> None:
    seen = set()
    with httpclient.InferenceServerClient(server.http) as client:
        inputs, first = _inputs(httpclient)
        for _ in range(30):
            result = client.infer("adder", inputs)
            response = result.get_response()
            assert response["model_name"] == "adder"
            assert (result.as_numpy("OUTPUT0") == first + 1).all()
            seen.add(response["model_version"])
        assert client.get_model_metadata("adder")["platform"] == "onnxruntime_onnx"  # the first arm's
        assert client.get_model_config("adder")["name"] == "adder"
    with grpcclient.InferenceServerClient(server.grpc) as client:
        inputs, first = _inputs(grpcclient)
        for _ in range(30):
            result = client.infer("adder", inputs)
            assert result.get_response().model_name == "adder"
            assert (result.as_numpy("OUTPUT1") == first - 1).all()
            seen.add(result.get_response().model_version)
        torch_arm = client.infer("adder", inputs, model_version="simple_torch:1").get_response()
        assert (torch_arm.model_name, torch_arm.model_version) == ("adder", "simple_torch:1")
        assert client.is_model_ready("adder") and client.is_model_ready("adder", "simple_torch:1")
    assert seen == {"simple:1", "simple_torch:1"}
    for arm in seen:
        count = "turnout_gateway_request_duration_seconds_count"
        assert metric(server.metrics, count, model="adder", version=arm) > 0


def test_a_shadow_in_another_framework_matches_exactly_on_integers(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        inputs, _ = _inputs(grpcclient)
        for _ in range(20):
            assert client.infer("mirrored", inputs).get_response().model_version == "simple:1"

    shadows = "turnout_gateway_shadow_requests_total"

    def outcome(name: str) -> float:
        return metric(server.metrics, shadows, model="mirrored", version="simple_torch:1", outcome=name)

    # Every copy is compared, or dropped when more than 16 are still running on a busy host.
    wait_until(lambda: sum(outcome(o) for o in ("same", "different", "error", "dropped")) >= 20, 30, "20 shadows")
    assert outcome("same") > 0 and outcome("different") == outcome("error") == 0
    difference = "turnout_gateway_shadow_max_difference"
    assert metric(server.metrics, difference, model="mirrored", version="simple_torch:1", output="OUTPUT0") == 0.0


def test_a_routing_file_naming_a_model_nobody_serves_stops_the_start(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_models().write_simple(repo)
    routing = tmp_path / "routing.yaml"
    routing.write_text('models:\n  adder:\n    weights: {"simple:1": 1, "simple_trt:1": 1}\n')
    with pytest.raises(ServerFailedToStart) as caught, turnout_up(repo, f"--routing={routing}", start_timeout=60):
        pass
    assert "arm 'simple_trt:1' of model 'adder' names unknown model 'simple_trt'" in str(caught.value)
