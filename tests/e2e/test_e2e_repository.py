"""Model repository API: index, load, unload, config overrides and uploaded files in
explicit mode; refusals in `none` mode."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.e2e.simple_requests import (
    assert_grpc_serves,
    assert_http_serves,
    check_simple,
    error_of,
    grpc_inputs,
    http_inputs,
    simple_arrays,
)
from tests.harness import Server, make_models, onnx_identity_bytes, turnout_up

REFUSED = "explicit model load / unload is not allowed if polling is enabled"


def _index(url: str) -> dict[str, dict]:
    with httpclient.InferenceServerClient(url) as client:
        entries = client.get_model_repository_index()
    assert [e["name"] for e in entries] == sorted(e["name"] for e in entries)
    return {(e["name"], e.get("version")): e for e in entries}


def test_index_at_start(explicit_server: Server) -> None:
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        entries = client.get_model_repository_index()
    assert {"name": "simple", "version": "1", "state": "READY"} in entries
    # Models never loaded appear by name only.
    assert {"name": "simple_string"} in entries
    assert {"name": "identity_fp32"} in entries
    with grpcclient.InferenceServerClient(explicit_server.grpc) as client:
        models = client.get_model_repository_index().models
    by_name = {m.name: m for m in models}
    assert set(by_name) >= {"simple", "simple_string", "identity_fp32", "linear"}
    assert (by_name["simple"].version, by_name["simple"].state) == ("1", "READY")
    assert by_name["simple_string"].state == ""


def test_load_and_unload_http(explicit_server: Server) -> None:
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        assert client.is_model_ready("simple_string") is False
        client.load_model("simple_string")
        assert client.is_model_ready("simple_string") is True
        values = np.array([[b"2"] * 16], dtype=np.object_)
        tensors = [httpclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(values)
        result = client.infer("simple_string", tensors)
        assert [x.decode() for x in result.as_numpy("OUTPUT0")[0]] == ["4"] * 16
        client.unload_model("simple_string")
        assert client.is_model_ready("simple_string") is False
        error = error_of(client.infer, "simple_string", tensors)
        assert (error.status(), error.message()) == (
            "404",
            "Request for unknown model: 'simple_string' has no available versions",
        )
        entries = client.get_model_repository_index()
    entry = next(e for e in entries if e["name"] == "simple_string")
    assert entry == {"name": "simple_string", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert_http_serves(explicit_server.http)


def test_load_and_unload_grpc(explicit_server: Server) -> None:
    with grpcclient.InferenceServerClient(explicit_server.grpc) as client:
        client.load_model("linear")
        assert client.is_model_ready("linear", "1") is True
        assert client.is_model_ready("linear", "2") is True
        client.unload_model("linear")
        # After unload, ready is false with status OK (simple_grpc_model_control relies on it).
        assert client.is_model_ready("linear") is False
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        error = error_of(client.infer, "linear", [tensor])
    assert (error.status(), error.message()) == (
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'linear' has no available versions",
    )


def test_ready_endpoint_for_unloaded_model(explicit_server: Server) -> None:
    response = httpx.get(f"http://{explicit_server.http}/v2/models/identity_fp32/ready", timeout=30)
    assert response.status_code == 400
    assert response.json() == {"error": "Model version not ready"}


def test_inferring_a_model_that_is_in_the_repository_but_not_loaded_says_how_to_load_it(
    explicit_server: Server,
) -> None:
    data = np.ones((1, 4), dtype=np.float32)
    expected = (
        "Request for unknown model: 'identity_fp32' is not found (model 'identity_fp32' is in the repository "
        "but not loaded; load it with POST /v2/repository/models/identity_fp32/load)"
    )
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        assert error_of(lambda: client.infer("identity_fp32", [tensor])).message() == expected
    with grpcclient.InferenceServerClient(explicit_server.grpc) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        assert error_of(lambda: client.infer("identity_fp32", [tensor])).message() == expected


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_config_override(explicit_server: Server, protocol: str) -> None:
    if protocol == "http":
        client = httpclient.InferenceServerClient(explicit_server.http)
    else:
        client = grpcclient.InferenceServerClient(explicit_server.grpc)
    with client:
        error = error_of(client.load_model, "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert error.message().startswith(
            "failed to load 'simple', failed to poll from model repository: Invalid config override: "
        )
        assert error.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        client.load_model("simple", config='{"max_batch_size":"16"}')
        config = client.get_model_config("simple")
        batch = config["max_batch_size"] if protocol == "http" else config.config.max_batch_size
        assert batch == 16
        # A load without override reads config.pbtxt again.
        client.load_model("simple")
        config = client.get_model_config("simple")
        batch = config["max_batch_size"] if protocol == "http" else config.config.max_batch_size
        assert batch == 8
    assert_http_serves(explicit_server.http)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_loading_an_unchanged_model_again_keeps_it_serving_as_it_was(explicit_server: Server, protocol: str) -> None:
    """Triton keeps a READY version whose files and config a load finds unchanged: its
    statistics go on counting (checked on Triton 2.51); a new config starts them again."""
    module = httpclient if protocol == "http" else grpcclient
    url = explicit_server.http if protocol == "http" else explicit_server.grpc

    def count(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> int:
        if isinstance(client, httpclient.InferenceServerClient):
            stats = client.get_inference_statistics("simple", "1")["model_stats"]
        else:
            stats = client.get_inference_statistics("simple", "1", as_json=True)["model_stats"]
        return int(stats[0].get("inference_count", 0))

    with module.InferenceServerClient(url) as client:
        client.load_model("simple", config='{"max_batch_size": "4"}')
        before = count(client)
        a, b = simple_arrays()
        inputs = http_inputs(a, b) if protocol == "http" else grpc_inputs(a, b)
        for _ in range(3):
            client.infer("simple", inputs)
        client.load_model("simple", config='{"max_batch_size": "4"}')
        client.infer("simple", inputs)
        assert count(client) == before + 4
        client.load_model("simple")  # config.pbtxt's max_batch_size 8: opened again
        assert count(client) == 0
    assert_http_serves(explicit_server.http)


def test_an_instance_group_change_is_applied_in_place(tmp_path: Path) -> None:
    """As Triton 2.51 does (checked side by side): a new instance_group serves at once
    with the version's statistics kept; one Triton refuses leaves it serving as it was,
    READY with the reason in the index."""
    model_dir = make_models().write_simple(tmp_path)
    config = model_dir / "config.pbtxt"
    text = config.read_text()
    with turnout_up(tmp_path, "--model-control-mode=explicit", "--load-model=simple") as server:
        http = httpclient.InferenceServerClient(server.http)
        grpc_client = grpcclient.InferenceServerClient(server.grpc)
        a, b = simple_arrays()
        for _ in range(2):
            check_simple(http.infer("simple", http_inputs(a, b)), a, b)
        config.write_text(text + "instance_group [{ count: 3 kind: KIND_CPU }]\n")
        http.load_model("simple")
        assert http.get_model_config("simple")["instance_group"][0]["count"] == 3
        assert grpc_client.get_model_config("simple").config.instance_group[0].count == 3
        check_simple(grpc_client.infer("simple", grpc_inputs(a, b)), a, b)
        assert http.get_inference_statistics("simple")["model_stats"][0]["inference_count"] == 3

        config.write_text(text + "instance_group [{ count: 1 kind: KIND_CPU gpus: [0] }]\n")
        reason = (
            "Invalid argument: instance group simple_0 of model simple has kind KIND_CPU but specifies one or more GPUs"
        )
        expected = f"load failed for model 'simple': version 1 is at READY state: {reason};\n"
        for client, status in ((http, "400"), (grpc_client, "StatusCode.INVALID_ARGUMENT")):
            error = error_of(client.load_model, "simple")
            assert (error.status(), error.message()) == (status, expected)
        [entry] = [e for e in http.get_model_repository_index() if e["name"] == "simple"]
        assert entry == {"name": "simple", "version": "1", "state": "READY", "reason": reason}
        assert http.get_model_config("simple")["instance_group"][0]["count"] == 3
        check_simple(http.infer("simple", http_inputs(a, b)), a, b)
        assert http.is_server_ready()


def test_load_unknown_model(explicit_server: Server) -> None:
    text = "failed to load 'wrong_model_name', failed to poll from model repository"
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        error = error_of(client.load_model, "wrong_model_name")
    assert (error.status(), error.message()) == ("500", text)
    with grpcclient.InferenceServerClient(explicit_server.grpc) as client:
        error = error_of(client.load_model, "wrong_model_name")
    assert (error.status(), error.message()) == ("StatusCode.INTERNAL", text)
    assert_grpc_serves(explicit_server.grpc)


def _upload_config(name: str) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_uploaded_files(explicit_server: Server, tmp_path: Path, protocol: str) -> None:
    name = f"uploaded_{protocol}"
    files = {"file:1/model.onnx": onnx_identity_bytes(tmp_path)}
    values = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    module = httpclient if protocol == "http" else grpcclient
    url = explicit_server.http if protocol == "http" else explicit_server.grpc
    with module.InferenceServerClient(url) as client:
        client.load_model(name, config=_upload_config(name), files=files)
        assert client.is_model_ready(name) is True
        tensor = module.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(values)
        np.testing.assert_array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), values)
        metadata = client.get_model_metadata(name)
        client.unload_model(name)
        assert client.is_model_ready(name) is False
    platform = metadata["platform"] if protocol == "http" else metadata.platform
    assert platform == "onnxruntime_onnx"


def test_load_takes_base64_as_triton_reads_it(explicit_server: Server, tmp_path: Path) -> None:
    # Checked on Triton 2.51: base64 broken into MIME lines and followed by stray
    # characters loads (libb64 skips what is not base64).
    name = "uploaded_mime"
    encoded = base64.b64encode(onnx_identity_bytes(tmp_path)).decode()
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76)) + "!!=="
    parameters = {"config": _upload_config(name), "file:1/model.onnx": wrapped}
    url = f"http://{explicit_server.http}/v2/repository/models/{name}/load"
    response = httpx.post(url, json={"parameters": parameters}, timeout=60)
    assert response.status_code == 200, response.text
    values = np.array([[1.5, -2.0]], dtype=np.float32)
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(values)
        np.testing.assert_array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), values)
        client.unload_model(name)


async def test_aio_repository(explicit_server: Server) -> None:
    http = httpaio.InferenceServerClient(explicit_server.http)
    rpc = grpcaio.InferenceServerClient(explicit_server.grpc)
    try:
        await http.load_model("identity_fp32")
        assert await http.is_model_ready("identity_fp32") is True
        await http.unload_model("identity_fp32")
        # Ready=false is asked over gRPC: the aio HTTP client leaves a 400's body unread.
        assert await rpc.is_model_ready("identity_fp32") is False
        await rpc.load_model("identity_fp32")
        assert await rpc.is_model_ready("identity_fp32") is True
        index = await rpc.get_model_repository_index()
        assert any(m.name == "identity_fp32" and m.state == "READY" for m in index.models)
        await rpc.unload_model("identity_fp32")
        assert await rpc.is_model_ready("identity_fp32") is False
    finally:
        await http.close()
        await rpc.close()


def test_none_mode_refuses_load_and_unload(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        for call in (client.load_model, client.unload_model):
            error = error_of(call, "simple")
            assert (error.status(), error.message()) == ("503", REFUSED)
        assert client.is_model_ready("simple") is True
    with grpcclient.InferenceServerClient(server.grpc) as client:
        for call in (client.load_model, client.unload_model):
            error = error_of(call, "simple")
            assert (error.status(), error.message()) == ("StatusCode.UNAVAILABLE", REFUSED)
    assert_http_serves(server.http)


def test_none_mode_index_lists_every_model_ready(server: Server) -> None:
    index = _index(server.http)
    assert index[("simple", "1")] == {"name": "simple", "version": "1", "state": "READY"}
    assert index[("linear", "1")]["state"] == "READY"
    assert index[("linear", "2")]["state"] == "READY"
    with grpcclient.InferenceServerClient(server.grpc) as client:
        ready_only = client.get_model_repository_index()
    assert {"simple", "simple_string", "linear", "simple_batched"} <= {m.name for m in ready_only.models}


def test_explicit_mode_still_serves_simple(explicit_server: Server) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        check_simple(client.infer("simple", http_inputs(a, b)), a, b)


def test_load_rejects_overlong_file_name(explicit_server: Server) -> None:
    """simple_grpc_model_control: a path component over NAME_MAX fails the load cleanly."""
    with grpcclient.InferenceServerClient(explicit_server.grpc) as client:
        error = error_of(client.load_model, "simple_int8_absent", config="{}", files={"file:" + "A" * 256: b"a"})
        assert error.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in error.message()
        assert client.is_server_live() is True
    assert_grpc_serves(explicit_server.grpc)


_POLL_FAILED = "failed to load 'identity_fp32', failed to poll from model repository"


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"config": "[]"}, "Invalid config override: a model configuration is a JSON object."),
        ({"config": "5"}, "Invalid config override: a model configuration is a JSON object."),
        ({"file:1/model.onnx": "AAAA"}, "Load parameter 'config' must be specified for model file override"),
        (
            {"config": "{}", "file:../escaped": "AAAA"},
            "Invalid file parameter 'file:../escaped' must stay within model directory.",
        ),
    ],
)
def test_loads_triton_s_poll_refuses(explicit_server: Server, parameters: dict[str, str], reason: str) -> None:
    """Triton 2.51 answers each with its poll's failure (500, the reason in its log; ours
    gives it too), and the loaded model stays as it was."""
    url = f"http://{explicit_server.http}/v2/repository/models/identity_fp32/load"
    assert httpx.post(url, timeout=60).status_code == 200
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        try:
            response = httpx.post(url, json={"parameters": parameters}, timeout=60)
            assert (response.status_code, response.json()) == (500, {"error": f"{_POLL_FAILED}: {reason}"})
            assert client.is_model_ready("identity_fp32") is True
        finally:
            client.unload_model("identity_fp32")  # as the other tests of this server expect it


def test_a_file_path_from_the_root_lands_in_the_model_folder(explicit_server: Server, tmp_path: Path) -> None:
    """Triton joins `file:/1/model.onnx` under the model's folder, as `file:1/model.onnx`."""
    model = base64.b64encode(onnx_identity_bytes(tmp_path)).decode()
    parameters = {"config": _upload_config("uploaded_rooted"), "file:/1/model.onnx": model}
    url = f"http://{explicit_server.http}/v2/repository/models/uploaded_rooted/load"
    response = httpx.post(url, json={"parameters": parameters}, timeout=60)
    assert response.status_code == 200, response.text
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        assert client.is_model_ready("uploaded_rooted") is True
        client.unload_model("uploaded_rooted")
    assert not Path("/1/model.onnx").exists()


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"parameters": 5}', "attempt to get members for non-object"),
        (b'{"parameters": {"config": {}}}', "attempt to access JSON non-string as string"),
        (b'{"parameters": {"unknown": "x"}}', "unexpected error on creating Triton parameter"),
    ],
)
def test_http_load_parameters_are_read_as_triton_reads_them(explicit_server: Server, body: bytes, text: str) -> None:
    """Triton 2.51's HTTP front refuses these before any load, with INTERNAL."""
    url = f"http://{explicit_server.http}/v2/repository/models/identity_fp32/load"
    response = httpx.post(url, content=body, timeout=30)
    assert (response.status_code, response.json()) == (500, {"error": text})
    with httpclient.InferenceServerClient(explicit_server.http) as client:
        assert client.is_model_ready("identity_fp32") is False


def test_http_unload_goes_on_without_parameters_it_cannot_read(explicit_server: Server) -> None:
    """Triton drops the error of an `unload_dependents` it cannot read: the model alone
    unloads. A body that is no JSON is refused (current Triton; 2.51 dropped that too)."""
    base = f"http://{explicit_server.http}/v2/repository/models/simple_string"
    bad = httpx.post(f"{base}/unload", content=b"{bad", timeout=60)
    assert (bad.status_code, bad.json()) == (
        500,
        {"error": "failed to parse the request JSON buffer: Missing a name for object member. at 1"},
    )
    for body in (b'{"parameters": 5}', b'{"parameters": {"unload_dependents": "yes"}}'):
        assert httpx.post(f"{base}/load", timeout=60).status_code == 200
        response = httpx.post(f"{base}/unload", content=body, timeout=60)
        assert (response.status_code, response.content) == (200, b"")
        with httpclient.InferenceServerClient(explicit_server.http) as client:
            assert client.is_model_ready("simple_string") is False


def test_index_ready_must_be_a_boolean(server: Server) -> None:
    index = httpx.post(f"http://{server.http}/v2/repository/index", json={"ready": 1}, timeout=30)
    assert (index.status_code, index.json()) == (400, {"error": "Invalid value for 'ready': expected a boolean"})


@pytest.mark.parametrize(
    ("parameters", "text"),
    [
        ({"config": {"bytes_param": b"{}"}}, "invalid value type for load parameter 'config', expected string_param."),
        (
            {"file:1/model.onnx": {"string_param": "x"}},
            "invalid value type for load parameter 'file:1/model.onnx', expected bytes_param.",
        ),
        ({"other": {"string_param": "x"}}, "unrecognized load parameter 'other'."),
    ],
)
def test_grpc_load_parameters_are_read_as_triton_reads_them(server: Server, parameters: dict, text: str) -> None:
    """Triton's gRPC front refuses these before the load itself, so even before a mode
    that allows no loads says so."""
    request = service_pb2.RepositoryModelLoadRequest(model_name="simple")
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(service_pb2.ModelRepositoryParameter(**value))
    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, text)
