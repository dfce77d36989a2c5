"""Health, server/model metadata and model configuration through all four clients."""

from __future__ import annotations

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.harness import Server

# Extensions a client of this gateway relies on; Triton lists them in /v2.
REQUIRED_EXTENSIONS = {
    "classification",
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "statistics",
    "trace",
    "logging",
}

SIMPLE_METADATA = {
    "name": "simple",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ],
}


def test_http_health(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        assert client.is_server_live() is True
        assert client.is_server_ready() is True
        assert client.is_model_ready("simple") is True
        assert client.is_model_ready("linear", "2") is True
        assert client.is_model_ready("linear", "9") is False
        assert client.is_model_ready("no_such_model") is False


def test_grpc_health(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        assert client.is_server_live() is True
        assert client.is_server_ready() is True
        assert client.is_model_ready("simple") is True
        assert client.is_model_ready("linear", "1") is True
        # Unknown models answer ready=false with status OK (the examples rely on it).
        assert client.is_model_ready("no_such_model") is False


async def test_http_aio_health(server: Server) -> None:
    client = httpaio.InferenceServerClient(server.http)
    try:
        assert await client.is_server_live() is True
        assert await client.is_server_ready() is True
        assert await client.is_model_ready("simple") is True
        # Not asked here: is_model_ready for an unknown model leaves the error body of the
        # 400 unread inside tritonclient's aio client (against Triton too), and aiohttp
        # reports the connection unclosed.
    finally:
        await client.close()


async def test_grpc_aio_health(server: Server) -> None:
    client = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert await client.is_server_live() is True
        assert await client.is_server_ready() is True
        assert await client.is_model_ready("simple") is True
        assert await client.is_model_ready("no_such_model") is False
    finally:
        await client.close()


def test_grpc_health_service_reports_serving(server: Server) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_http_server_metadata(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert set(metadata["extensions"]) >= REQUIRED_EXTENSIONS


def test_grpc_server_metadata(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        metadata = client.get_server_metadata()
        as_json = client.get_server_metadata(as_json=True)
    assert metadata.name == "triton"
    assert metadata.version
    assert set(metadata.extensions) >= REQUIRED_EXTENSIONS
    assert as_json["name"] == "triton"


async def test_aio_server_metadata(server: Server) -> None:
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert (await http.get_server_metadata())["name"] == "triton"
        assert (await rpc.get_server_metadata()).name == "triton"
    finally:
        await http.close()
        await rpc.close()


def test_http_model_metadata(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        assert client.get_model_metadata("simple") == SIMPLE_METADATA
        assert client.get_model_metadata("simple", "1") == SIMPLE_METADATA
        linear = client.get_model_metadata("linear")
        assert linear["versions"] == ["1", "2"]
        assert client.get_model_metadata("linear", "2")["versions"] == ["2"]
        strings = client.get_model_metadata("simple_string")
    assert strings["inputs"][0] == {"name": "INPUT0", "datatype": "BYTES", "shape": [-1, 16]}


def test_grpc_model_metadata(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        metadata = client.get_model_metadata("simple")
        linear = client.get_model_metadata("linear", "1")
        as_json = client.get_model_metadata("simple", as_json=True)
    assert metadata.name == "simple"
    assert list(metadata.versions) == ["1"]
    assert metadata.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]
    assert list(linear.versions) == ["1"]
    # int64 shape travels as JSON strings under MessageToJson.
    assert as_json["inputs"][0]["shape"] == ["-1", "16"]


async def test_aio_model_metadata(server: Server) -> None:
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert await http.get_model_metadata("simple") == SIMPLE_METADATA
        metadata = await rpc.get_model_metadata("simple")
        assert list(metadata.inputs[0].shape) == [-1, 16]
    finally:
        await http.close()
        await rpc.close()


def test_http_model_config_is_bare_json_with_defaults(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        config = client.get_model_config("simple")
        batched = client.get_model_config("simple_batched")
    assert config["name"] == "simple"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 8 and isinstance(config["max_batch_size"], int)
    first = config["input"][0]
    assert first["name"] == "INPUT0"
    assert first["data_type"] == "TYPE_INT32"
    assert first["dims"] == [16] and isinstance(first["dims"][0], int)
    # Protobuf JSON with every default printed, as Triton writes it.
    assert first["format"] == "FORMAT_NONE"
    assert first["is_shape_tensor"] is False
    assert first["optional"] is False
    assert config["output"][1]["name"] == "OUTPUT1"
    assert config["output"][1]["label_filename"] == ""
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config.get("instance_group")
    assert batched["max_batch_size"] == 32
    assert batched["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    # Without preferred sizes Triton's core makes max_batch_size the one, and shows it.
    assert batched["dynamic_batching"]["preferred_batch_size"] == [32]


def test_grpc_model_config_is_wrapped(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        response = client.get_model_config("simple")
        as_json = client.get_model_config("linear", as_json=True)
    assert response.config.name == "simple"
    assert response.config.platform == "onnxruntime_onnx"
    assert response.config.max_batch_size == 8
    assert [i.name for i in response.config.input] == ["INPUT0", "INPUT1"]
    assert list(response.config.input[0].dims) == [16]
    assert as_json["config"]["name"] == "linear"
    assert "all" in as_json["config"]["version_policy"]


async def test_aio_model_config(server: Server) -> None:
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert (await http.get_model_config("simple"))["max_batch_size"] == 8
        assert (await rpc.get_model_config("simple")).config.name == "simple"
    finally:
        await http.close()
        await rpc.close()
