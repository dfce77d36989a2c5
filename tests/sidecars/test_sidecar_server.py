"""The sidecar's v2 RPCs through tritonclient: health, metadata, config, infer, stream,
statistics, index, and the errors Triton answers for unknown models and versions."""

from __future__ import annotations

import queue
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.sidecars.sidecar_harness import Sidecar, simple_inputs


@pytest.fixture
def client(main_sidecar: Sidecar) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(main_sidecar.url)


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata().name == "triton"


def test_grpc_health_reports_serving(main_sidecar: Sidecar) -> None:
    with grpc.insecure_channel(main_sidecar.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_model_ready_is_false_not_an_error_for_unknown_models(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("simple", "7")


def test_model_metadata_prepends_batch_dim(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("simple")
    assert metadata.name == "simple"
    assert list(metadata.versions) == ["1"]
    assert metadata.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    unbatched = client.get_model_metadata("simple_nobatch")
    assert list(unbatched.inputs[0].shape) == [16]


def test_model_metadata_lists_every_ready_version(client: grpcclient.InferenceServerClient) -> None:
    assert list(client.get_model_metadata("linear").versions) == ["1", "2"]
    assert list(client.get_model_metadata("linear", "1").versions) == ["1"]


def test_model_config_is_completed_with_core_defaults(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple").config
    assert config.name == "simple"
    assert config.backend == "onnxruntime"
    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "model.onnx"
    assert config.version_policy.latest.num_versions == 1
    assert [(g.name, g.count) for g in config.instance_group] == [("simple", 2)]
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU


def test_infer_simple(client: grpcclient.InferenceServerClient) -> None:
    inputs, data = simple_inputs(grpcclient)
    result = client.infer("simple", inputs, request_id="r1")
    assert result.get_response().id == "r1"
    assert result.get_response().model_version == "1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - 1)


def test_requested_outputs_keep_request_order(client: grpcclient.InferenceServerClient) -> None:
    inputs, data = simple_inputs(grpcclient, batch=3)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT0")]
    result = client.infer("simple", inputs, outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - 1)
    only = client.infer("simple", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]


def test_infer_model_without_batching(client: grpcclient.InferenceServerClient) -> None:
    data = np.arange(16, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [16], "INT32"), grpcclient.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    result = client.infer("simple_nobatch", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


def test_infer_strings(client: grpcclient.InferenceServerClient) -> None:
    numbers = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(numbers)
    inputs[1].set_data_from_numpy(numbers)
    result = client.infer("simple_string", inputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == [2 * i for i in range(16)]


def test_versions_answer_differently(client: grpcclient.InferenceServerClient) -> None:
    data = np.ones((1, 4), dtype=np.float32)
    for version, scale in (("1", 1.0), ("2", 2.0), ("", 2.0)):
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer("linear", inputs, model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * scale)


@pytest.mark.parametrize(
    ("call", "status", "text"),
    [
        (
            lambda c: c.get_model_metadata("nope"),
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'nope' is not found",
        ),
        (
            lambda c: c.get_model_config("simple", "9"),
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'simple' version 9 is not found",
        ),
        (
            lambda c: c.get_model_metadata("simple", "x"),
            "StatusCode.INVALID_ARGUMENT",
            "failed to get model version from specified version string 'x' (details: stol), "
            "version should be an integral value > 0",
        ),
        (
            lambda c: c.get_inference_statistics("nope"),
            "StatusCode.INVALID_ARGUMENT",
            "requested model 'nope' is not available",
        ),
        (
            lambda c: c.load_model("simple"),
            "StatusCode.UNAVAILABLE",
            "explicit model load / unload is not allowed if polling is enabled",
        ),
        (
            lambda c: c.unload_model("simple"),
            "StatusCode.UNAVAILABLE",
            "explicit model load / unload is not allowed if polling is enabled",
        ),
        (lambda c: c.get_system_shared_memory_status(), "StatusCode.UNIMPLEMENTED", "shared memory"),
        (lambda c: c.unregister_cuda_shared_memory(), "StatusCode.UNIMPLEMENTED", "shared memory"),
    ],
)
def test_errors_carry_triton_status_and_text(
    client: grpcclient.InferenceServerClient, call: object, status: str, text: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(client)  # type: ignore[operator]
    assert caught.value.status() == status
    assert text in caught.value.message()
    assert client.is_server_live()  # still serving after every error


def test_infer_unknown_model(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found") as caught:
        client.infer("nope", inputs)
    assert caught.value.status() == "StatusCode.NOT_FOUND"


def test_statistics_count_requests_and_batches(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("simple_nobatch").model_stats[0]
    data = np.arange(16, dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [16], "INT32"), grpcclient.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    for _ in range(3):
        client.infer("simple_nobatch", inputs)
    with pytest.raises(InferenceServerException):
        client.infer("simple_nobatch", inputs[:1])
    stats = client.get_inference_statistics("simple_nobatch").model_stats
    assert len(stats) == 1
    after = stats[0]
    assert (after.name, after.version) == ("simple_nobatch", "1")
    assert after.inference_stats.success.count == before.inference_stats.success.count + 3
    # Refused before it ran (an input missing): Triton counts it nowhere.
    assert after.inference_stats.fail.count == before.inference_stats.fail.count
    assert after.execution_count == before.execution_count + 3
    assert after.inference_count == before.inference_count + 3
    assert after.inference_stats.compute_infer.ns > 0
    assert after.last_inference > 0
    assert any(b.batch_size == 1 and b.compute_infer.count >= 3 for b in after.batch_stats)
    everything = client.get_inference_statistics().model_stats
    assert [s.name for s in everything] == sorted(s.name for s in everything)
    assert [s.version for s in everything if s.name == "linear"] == ["1", "2"]


def test_repository_index_lists_this_framework_only(client: grpcclient.InferenceServerClient) -> None:
    models = client.get_model_repository_index().models
    names = [m.name for m in models]
    assert names == sorted(names)
    assert "torch_model" not in names
    assert "README.txt" not in names
    assert {(m.name, m.version, m.state) for m in models if m.name == "linear"} == {
        ("linear", "1", "READY"),
        ("linear", "2", "READY"),
    }


def test_stream_answers_in_band_and_stays_open(client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs, data = simple_inputs(grpcclient)
        client.async_stream_infer("simple", inputs, request_id="ok1")
        client.async_stream_infer("nope", inputs, request_id="bad")
        client.async_stream_infer("simple", inputs, request_id="ok2")
        got = [answers.get(timeout=10) for _ in range(3)]
    finally:
        client.stop_stream()
    (first, error1), (_, error2), (third, error3) = got
    assert error1 is None and error3 is None
    assert first.get_response().id == "ok1"  # type: ignore[attr-defined]
    assert third.get_response().id == "ok2"  # type: ignore[attr-defined]
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), data + 1)  # type: ignore[attr-defined]
    assert first.get_response().parameters["triton_final_response"].bool_param  # type: ignore[attr-defined]
    assert "Request for unknown model: 'nope' is not found" in str(error2)


async def test_aio_stream(main_sidecar: Sidecar) -> None:
    client = aioclient.InferenceServerClient(main_sidecar.url)
    try:
        inputs, data = simple_inputs(aioclient)

        async def requests():  # type: ignore[no-untyped-def]
            for index in range(5):
                yield {"model_name": "simple", "inputs": inputs, "request_id": str(index)}

        ids = []
        async for result, error in client.stream_infer(requests()):
            assert error is None
            ids.append(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
            if len(ids) == 5:
                break
        assert ids == ["0", "1", "2", "3", "4"]
    finally:
        await client.close()


def test_async_infer_callback(client: grpcclient.InferenceServerClient) -> None:
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    inputs, data = simple_inputs(grpcclient)
    client.async_infer("simple", inputs, partial(lambda q, result, error: q.put((result, error)), answers))
    result, error = answers.get(timeout=10)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)  # type: ignore[attr-defined]
