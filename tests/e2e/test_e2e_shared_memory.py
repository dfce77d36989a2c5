"""Client system shared memory over HTTP and gRPC: register, status, infer with inputs
and outputs in regions, unregister; disabled by default; CUDA calls answer cleanly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import serialize_byte_tensor, serialized_byte_size

from tests.e2e.simple_requests import assert_grpc_serves, assert_http_serves, error_of, simple_arrays
from tests.harness import Server

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
TENSOR_BYTES = 64


class Regions:
    """One input region (both inputs) and one output region (both outputs), unique to this test."""

    def __init__(self, tag: str) -> None:
        prefix = f"turnout_{os.getpid()}_{tag}"
        self.input_key = f"/{prefix}_in"
        self.output_key = f"/{prefix}_out"
        self.input = shm.create_shared_memory_region(f"{tag}_in", self.input_key, 2 * TENSOR_BYTES)
        self.output = shm.create_shared_memory_region(f"{tag}_out", self.output_key, 2 * TENSOR_BYTES)

    def close(self) -> None:
        shm.destroy_shared_memory_region(self.input)
        shm.destroy_shared_memory_region(self.output)


@pytest.fixture
def regions(request: pytest.FixtureRequest) -> Iterator[Regions]:
    made = Regions(request.node.name.replace("[", "_").rstrip("]"))
    yield made
    made.close()


def _shm_request(module: Any, a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> tuple[list, list]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(names[0], TENSOR_BYTES)
    inputs[1].set_shared_memory(names[0], TENSOR_BYTES, offset=TENSOR_BYTES)
    if module is httpclient:
        outputs = [module.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    else:
        outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory(names[1], TENSOR_BYTES)
    outputs[1].set_shared_memory(names[1], TENSOR_BYTES, offset=TENSOR_BYTES)
    return inputs, outputs


def test_http_system_shared_memory(shm_server: Server, regions: Regions) -> None:
    a, b = simple_arrays(seed=11)
    shm.set_shared_memory_region(regions.input, [a, b])
    names = ("h_in", "h_out")
    with httpclient.InferenceServerClient(shm_server.http) as client:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory(names[0], regions.input_key, 2 * TENSOR_BYTES)
        client.register_system_shared_memory(names[1], regions.output_key, 2 * TENSOR_BYTES)
        status = client.get_system_shared_memory_status()
        assert sorted(status, key=lambda r: r["name"]) == [
            {"name": "h_in", "key": regions.input_key, "offset": 0, "byte_size": 128},
            {"name": "h_out", "key": regions.output_key, "offset": 0, "byte_size": 128},
        ]
        assert client.get_system_shared_memory_status("h_in") == [
            {"name": "h_in", "key": regions.input_key, "offset": 0, "byte_size": 128}
        ]
        inputs, outputs = _shm_request(httpclient, a, b, names)
        result = client.infer("simple", inputs, outputs=outputs)
        for output in result.get_response()["outputs"]:
            assert "data" not in output
            assert "binary_data_size" not in output.get("parameters", {})
        sums = shm.get_contents_as_numpy(regions.output, np.int32, [1, 16])
        diffs = shm.get_contents_as_numpy(regions.output, np.int32, [1, 16], offset=TENSOR_BYTES)
        np.testing.assert_array_equal(sums, a + b)
        np.testing.assert_array_equal(diffs, a - b)
        client.unregister_system_shared_memory("h_in")
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["h_out"]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []


def test_grpc_system_shared_memory(shm_server: Server, regions: Regions) -> None:
    a, b = simple_arrays(seed=12)
    shm.set_shared_memory_region(regions.input, [a, b])
    names = ("g_in", "g_out")
    with grpcclient.InferenceServerClient(shm_server.grpc) as client:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory(names[0], regions.input_key, 2 * TENSOR_BYTES)
        client.register_system_shared_memory(names[1], regions.output_key, 2 * TENSOR_BYTES)
        status = client.get_system_shared_memory_status()
        assert set(status.regions) == {"g_in", "g_out"}
        region = status.regions["g_in"]
        assert (region.name, region.key, region.offset, region.byte_size) == ("g_in", regions.input_key, 0, 128)
        inputs, outputs = _shm_request(grpcclient, a, b, names)
        result = client.infer("simple", inputs, outputs=outputs)
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(regions.output, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(regions.output, np.int32, [1, 16], offset=TENSOR_BYTES), a - b
        )
        client.unregister_system_shared_memory()
        assert len(client.get_system_shared_memory_status().regions) == 0


def test_shm_string_inputs(shm_server: Server, regions: Regions) -> None:
    """BYTES tensors in regions, the way simple_*_shm_string_client does it."""
    values = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    ones = np.array([[b"1"] * 16], dtype=np.object_)
    serialized = [serialize_byte_tensor(values), serialize_byte_tensor(ones)]
    sizes = (serialized_byte_size(serialized[0]), serialized_byte_size(serialized[1]))
    region = shm.create_shared_memory_region("str_in", regions.input_key + "_s", sum(sizes))
    try:
        shm.set_shared_memory_region(region, serialized)
        with httpclient.InferenceServerClient(shm_server.http) as client:
            client.register_system_shared_memory("str_in", regions.input_key + "_s", sum(sizes))
            try:
                inputs = [httpclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
                inputs[0].set_shared_memory("str_in", sizes[0])
                inputs[1].set_shared_memory("str_in", sizes[1], offset=sizes[0])
                result = client.infer("simple_string", inputs)
            finally:
                client.unregister_system_shared_memory("str_in")
        assert [x.decode() for x in result.as_numpy("OUTPUT0")[0]] == [str(i + 1) for i in range(16)]
    finally:
        shm.destroy_shared_memory_region(region)


def test_shm_errors(shm_server: Server, regions: Regions) -> None:
    with httpclient.InferenceServerClient(shm_server.http) as client:
        error = error_of(client.get_system_shared_memory_status, "nope")
        assert (error.status(), error.message()) == ("404", "Unable to find system shared memory region: 'nope'")
        client.register_system_shared_memory("dup", regions.input_key, 2 * TENSOR_BYTES)
        try:
            error = error_of(client.register_system_shared_memory, "dup", regions.input_key, 2 * TENSOR_BYTES)
            assert (error.status(), error.message()) == ("400", "shared memory region 'dup' already in manager")
            # Input region smaller than offset + byte size.
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("dup", TENSOR_BYTES, offset=TENSOR_BYTES + 32)
            inputs[1].set_shared_memory("dup", TENSOR_BYTES)
            error = error_of(client.infer, "simple", inputs)
            assert (error.status(), error.message()) == (
                "400",
                "Invalid offset + byte size for shared memory region: 'dup'",
            )
            # Output region too small for the result.
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("dup", TENSOR_BYTES)
            inputs[1].set_shared_memory("dup", TENSOR_BYTES, offset=TENSOR_BYTES)
            small = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            small.set_shared_memory("dup", 16)
            error = error_of(client.infer, "simple", inputs, outputs=[small])
            assert (error.status(), error.message()) == (
                "500",
                "shared memory size specified with the request for output 'OUTPUT0' (16 bytes) "
                "should be at least 64 bytes to hold the results",
            )
        finally:
            client.unregister_system_shared_memory("dup")
        error = error_of(client.register_system_shared_memory, "bad", "/turnout_no_such_key", 64)
        assert (error.status(), error.message()) == (
            "500",
            "Unable to open shared memory region: '/turnout_no_such_key'",
        )
    with grpcclient.InferenceServerClient(shm_server.grpc) as client:
        error = error_of(client.get_system_shared_memory_status, "nope")
        assert (error.status(), error.message()) == (
            "StatusCode.NOT_FOUND",
            "Unable to find system shared memory region: 'nope'",
        )
        client.register_system_shared_memory("gdup", regions.input_key, 2 * TENSOR_BYTES)
        try:
            error = error_of(client.register_system_shared_memory, "gdup", regions.input_key, 2 * TENSOR_BYTES)
            assert (error.status(), error.message()) == (
                "StatusCode.ALREADY_EXISTS",
                "shared memory region 'gdup' already in manager",
            )
        finally:
            client.unregister_system_shared_memory("gdup")
    assert_http_serves(shm_server.http)
    assert_grpc_serves(shm_server.grpc)


def test_http_looks_each_region_up_as_it_reads_the_tensor(shm_server: Server, regions: Regions) -> None:
    # As Triton's HTTP front (checked on 2.51): a region is looked up when its tensor is
    # read, so it answers before a later input's error; an absent byte size is 0.
    url = f"http://{shm_server.http}/v2/models/simple/infer"
    region = {"shared_memory_region": "nope", "shared_memory_byte_size": TENSOR_BYTES}
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": region}, {"name": "X"}]}
    answer = httpx.post(url, json=body, timeout=30)
    assert (answer.status_code, answer.json()) == (404, {"error": "Unable to find shared memory region: 'nope'"})
    with httpclient.InferenceServerClient(shm_server.http) as client:
        client.register_system_shared_memory("order", regions.input_key, 2 * TENSOR_BYTES)
        try:
            outside = {"shared_memory_region": "order", "shared_memory_byte_size": 8, "shared_memory_offset": 200}
            body["inputs"][0]["parameters"] = outside
            answer = httpx.post(url, json=body, timeout=30)
            assert (answer.status_code, answer.json()) == (
                400,
                {"error": "Invalid offset for shared memory region: 'order'"},
            )
            data = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            body = {"inputs": [{**body["inputs"][0], "parameters": {"shared_memory_region": "order"}}, data]}
            answer = httpx.post(url, json=body, timeout=30)
            assert (answer.status_code, answer.json()["error"]) == (
                400,
                "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. "
                "Expected 64, got 0",
            )
        finally:
            client.unregister_system_shared_memory("order")
    assert_http_serves(shm_server.http)


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_registered_regions_hold_no_file_descriptors(shm_server: Server, regions: Regions) -> None:
    # As Triton, which closes a region's descriptor once it is mapped: regions a client
    # leaves registered must not use up the descriptors the gateway accepts connections with.
    a, b = simple_arrays(seed=13)
    shm.set_shared_memory_region(regions.input, [a, b])
    names = [f"fd_{n}" for n in range(300)]
    with grpcclient.InferenceServerClient(shm_server.grpc) as client:
        client.unregister_system_shared_memory()
        before = _open_descriptors(shm_server.process.pid)
        try:
            for name in names:
                client.register_system_shared_memory(name, regions.input_key, 2 * TENSOR_BYTES)
            client.register_system_shared_memory("fd_out", regions.output_key, 2 * TENSOR_BYTES)
            assert _open_descriptors(shm_server.process.pid) - before < 20
            inputs, outputs = _shm_request(grpcclient, a, b, (names[-1], "fd_out"))
            client.infer("simple", inputs, outputs=outputs)
            sums = shm.get_contents_as_numpy(regions.output, np.int32, [1, 16])
            differences = shm.get_contents_as_numpy(regions.output, np.int32, [1, 16], offset=TENSOR_BYTES)
            np.testing.assert_array_equal(sums, a + b)
            np.testing.assert_array_equal(differences, a - b)
        finally:
            client.unregister_system_shared_memory()
    assert_grpc_serves(shm_server.grpc)


def test_cuda_shared_memory_answers_cleanly(shm_server: Server) -> None:
    with httpclient.InferenceServerClient(shm_server.http) as client:
        assert client.get_cuda_shared_memory_status() == []
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("never_registered")
    with grpcclient.InferenceServerClient(shm_server.grpc) as client:
        assert len(client.get_cuda_shared_memory_status().regions) == 0
        client.unregister_cuda_shared_memory()


def test_shared_memory_disabled_by_default(server: Server) -> None:
    key = f"/turnout_{os.getpid()}_disabled"
    region = shm.create_shared_memory_region("disabled", key, 64)
    try:
        with httpclient.InferenceServerClient(server.http) as client:
            error = error_of(client.register_system_shared_memory, "disabled", key, 64)
            assert (error.status(), error.message()) == ("501", DISABLED)
            error = error_of(client.unregister_system_shared_memory)
            assert (error.status(), error.message()) == ("501", DISABLED)
        with grpcclient.InferenceServerClient(server.grpc) as client:
            error = error_of(client.register_system_shared_memory, "disabled", key, 64)
            assert (error.status(), error.message()) == ("StatusCode.UNIMPLEMENTED", DISABLED)
    finally:
        shm.destroy_shared_memory_region(region)
    assert_http_serves(server.http)
