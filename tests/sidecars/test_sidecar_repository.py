"""Repository behaviour: auto-complete, version policies, explicit load/unload/reload with
config overrides and files, poll mode, --exit-on-error and shutdown on SIGTERM."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.harness import make_models
from tests.sidecars.sidecar_harness import Sidecar, SidecarFailedToStart, launch, running, simple_inputs

# A minute before an idle sequence is let go, so no slow step loses it.
LONG_IDLE = "max_sequence_idle_microseconds: 60000000"


@pytest.fixture
def main(main_sidecar: Sidecar) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(main_sidecar.url)


@pytest.fixture
def client(explicit_sidecar: Sidecar) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(explicit_sidecar.url)


def linear_answer(client: grpcclient.InferenceServerClient, model: str = "linear", version: str = "") -> float:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return float(client.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0")[0, 0])


def test_auto_complete_without_config(main: grpcclient.InferenceServerClient) -> None:
    config = main.get_model_config("auto_identity").config
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("INPUT0", 11, [-1])]  # TYPE_FP32
    assert [t.name for t in config.output] == ["OUTPUT0"]
    assert config.platform == "onnxruntime_onnx"


def test_auto_complete_of_partial_config(main: grpcclient.InferenceServerClient) -> None:
    config = main.get_model_config("auto_partial").config
    assert config.max_batch_size == 2
    assert config.HasField("dynamic_batching")  # Triton's backend adds one to a batching model
    assert [t.name for t in config.output] == ["OUTPUT0"]
    assert list(config.output[0].dims) == [-1]


def test_explicit_mode_loads_only_what_was_asked(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["reloadable"].state == "" and index["reloadable"].version == ""
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'reloadable' is not found"):
        client.get_model_metadata("reloadable")


def test_index_ready_filter(explicit_sidecar: Sidecar) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(explicit_sidecar.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True)).models
        everything = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest()).models
    assert ready and all(m.state == "READY" for m in ready)
    assert len(everything) > len(ready)


def test_load_unknown_model_fails(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("missing")
    assert caught.value.message() == "failed to load 'missing', failed to poll from model repository"


def test_invalid_config_override_fails(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(
        InferenceServerException, match="failed to poll from model repository: Invalid config override: "
    ):
        client.load_model("reloadable", config='{"max_batch_size": "not json')


def test_unrecognized_load_parameter(explicit_sidecar: Sidecar) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(explicit_sidecar.url) as channel:
        request = service_pb2.RepositoryModelLoadRequest(model_name="simple")
        request.parameters["bogus"].string_param = "1"
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
    assert caught.value.details() == "unrecognized load parameter 'bogus'."


def test_autofill_rejects_batching_on_a_model_without_batch_dim(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("unbatched")
    assert (
        "autofill failed for model 'unbatched': model does not support batching while non-zero max_batch_size "
        "is specified" in caught.value.message()
    )
    states = [m.state for m in client.get_model_repository_index().models if m.name == "unbatched"]
    assert states == ["UNAVAILABLE"]


def test_load_with_override_then_unload_then_reload(client: grpcclient.InferenceServerClient) -> None:
    client.load_model("reloadable", config=json.dumps({"max_batch_size": "16"}))
    assert client.get_model_config("reloadable").config.max_batch_size == 16
    inputs, data = simple_inputs(grpcclient, batch=12)
    np.testing.assert_array_equal(client.infer("reloadable", inputs).as_numpy("OUTPUT0"), data + 1)

    client.unload_model("reloadable")
    assert not client.is_model_ready("reloadable")
    with pytest.raises(InferenceServerException, match="'reloadable' has no available versions"):
        client.infer("reloadable", inputs)
    with pytest.raises(InferenceServerException, match="'reloadable' version 1 is not at ready state"):
        client.infer("reloadable", inputs, model_version="1")
    index = [
        (m.version, m.state, m.reason) for m in client.get_model_repository_index().models if m.name == "reloadable"
    ]
    assert index == [("1", "UNAVAILABLE", "unloaded")]

    client.load_model("reloadable")
    assert client.get_model_config("reloadable").config.max_batch_size == 8
    client.load_model("reloadable")  # a reload of a loaded model
    assert client.is_model_ready("reloadable")


def test_version_policies(client: grpcclient.InferenceServerClient) -> None:
    client.load_model("linear", config=json.dumps({"max_batch_size": 8}))
    assert list(client.get_model_metadata("linear").versions) == ["3"]
    assert linear_answer(client) == 3.0

    client.load_model(
        "linear", config=json.dumps({"max_batch_size": 8, "version_policy": {"latest": {"num_versions": 2}}})
    )
    assert list(client.get_model_metadata("linear").versions) == ["2", "3"]

    client.load_model(
        "linear", config=json.dumps({"max_batch_size": 8, "version_policy": {"specific": {"versions": [1, 3]}}})
    )
    assert list(client.get_model_metadata("linear").versions) == ["1", "3"]
    assert linear_answer(client, version="1") == 1.0
    assert not client.is_model_ready("linear", "2")

    client.load_model("linear")  # config.pbtxt: all versions
    assert list(client.get_model_metadata("linear").versions) == ["1", "2", "3"]
    stats = client.get_inference_statistics("linear").model_stats
    assert [s.version for s in stats] == ["1", "2", "3"]


def test_load_with_files(client: grpcclient.InferenceServerClient, tmp_path: Path) -> None:
    make_models().write_linear(tmp_path, name="uploaded", versions={1: 5.0})
    model_bytes = (tmp_path / "uploaded" / "1" / "model.onnx").read_bytes()
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("uploaded", files={"file:1/model.onnx": model_bytes})
    client.load_model(
        "uploaded", config=json.dumps({"backend": "onnxruntime"}), files={"file:1/model.onnx": model_bytes}
    )
    assert linear_answer(client, "uploaded") == 5.0
    assert "uploaded" in [m.name for m in client.get_model_repository_index().models]
    client.unload_model("uploaded", unload_dependents=True)
    assert not client.is_model_ready("uploaded")


def test_poll_mode_picks_up_new_versions(tmp_path: Path) -> None:
    models = make_models()
    models.write_linear(tmp_path, versions={1: 1.0})
    with running(tmp_path, "--model-control-mode=poll", "--repository-poll-secs=0.2") as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        assert list(client.get_model_metadata("linear").versions) == ["1"]
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
            client.load_model("linear")
        models.write_linear(tmp_path / "staging", versions={1: 1.0, 2: 2.0})
        (tmp_path / "staging" / "linear" / "2").rename(tmp_path / "linear" / "2")
        models.write_simple(tmp_path)
        deadline = time.monotonic() + 20
        while not (client.is_model_ready("linear", "2") and client.is_model_ready("simple")):
            assert time.monotonic() < deadline, sidecar.output()
            time.sleep(0.1)
        assert linear_answer(client, version="2") == 2.0


def test_exit_on_error(tmp_path: Path) -> None:
    make_models().write_simple(tmp_path, name="unbatched", max_batch_size=0)
    (tmp_path / "unbatched" / "config.pbtxt").write_text("max_batch_size: 4\n")
    make_models().write_simple(tmp_path)
    with pytest.raises(SidecarFailedToStart) as caught:
        launch(tmp_path)
    assert caught.value.returncode == 1
    assert "autofill failed for model 'unbatched'" in caught.value.output

    with running(tmp_path, "--exit-on-error=false") as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        assert client.is_model_ready("simple")
        assert not client.is_server_ready()  # strict readiness: one model failed
    with running(tmp_path, "--exit-on-error=false", "--strict-readiness=false") as sidecar:
        assert grpcclient.InferenceServerClient(sidecar.url).is_server_ready()


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    make_models().write_simple(tmp_path, extra_config="dynamic_batching { max_queue_delay_microseconds: 500000 }")
    sidecar = launch(tmp_path)
    client = grpcclient.InferenceServerClient(sidecar.url)
    answers: list[tuple[object, object]] = []
    inputs, data = simple_inputs(grpcclient)
    client.async_infer("simple", inputs, lambda result, error: answers.append((result, error)))
    # The batcher holds the request for its 0.5 s queue delay; give it time to arrive
    # (there is no event to wait on), then stop while it is still in flight.
    time.sleep(0.2)
    assert not answers
    assert sidecar.stop() == 0
    deadline = time.monotonic() + 10
    while not answers and time.monotonic() < deadline:
        time.sleep(0.01)
    result, error = answers[0]
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)  # type: ignore[attr-defined]


def test_a_sequence_goes_on_through_a_load_that_keeps_its_version(tmp_path: Path) -> None:
    """A load that finds the model unchanged, or its instance groups alone changed, keeps
    the version serving, open sequences and their state included (as Triton's in-place
    update); a load that opens the version again loses them, as Triton's full reload does."""
    model_dir = make_models().write_sequence(tmp_path, "running_sum", ("READY",), state=True, strategy=LONG_IDLE)
    config = model_dir / "config.pbtxt"

    def step(client: grpcclient.InferenceServerClient, value: int, start: bool = False) -> int:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
        result = client.infer("running_sum", [tensor], sequence_id=7, sequence_start=start)
        return int(result.as_numpy("OUTPUT")[0, 0])

    with running(tmp_path, "--model-control-mode=explicit", "--load-model=running_sum") as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        assert (step(client, 2, start=True), step(client, 3)) == (2, 5)
        client.load_model("running_sum")
        assert step(client, 4) == 9
        # A new instance count is applied in place: the sequence keeps its slot and state.
        config.write_text(config.read_text().replace("kind: KIND_CPU", "count: 3 kind: KIND_CPU"))
        client.load_model("running_sum")
        assert client.get_model_config("running_sum").config.instance_group[0].count == 3
        assert step(client, 1) == 10
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
        client.load_model("running_sum")
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            step(client, 1)
