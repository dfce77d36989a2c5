"""Routing through a real gateway to real (stand-in) sidecar processes over gRPC."""

from __future__ import annotations

import urllib.request

import grpc
import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pbg
from tests.gateway.gateway_harness import gateway_settings, running_gateway, stub_sidecar


def simple_request(model: str = "simple", request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(np.arange(16, dtype="<i4").tobytes())
    request.raw_input_contents.append(np.ones(16, dtype="<i4").tobytes())
    return request


async def test_metadata_and_readiness(sidecars) -> None:
    async with running_gateway(gateway_settings(sidecars)) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        assert (await stub.ServerLive(pb.ServerLiveRequest())).live
        assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
        metadata = await stub.ServerMetadata(pb.ServerMetadataRequest())
        assert metadata.name == "triton" and metadata.version == "2.73.0"
        assert "sequence" in metadata.extensions and "system_shared_memory" in metadata.extensions
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="torchy"))).ready
        assert not (await stub.ModelReady(pb.ModelReadyRequest(name="nope"))).ready
        assert (await stub.ModelMetadata(pb.ModelMetadataRequest(name="torchy"))).name == "torchy"
        assert (await stub.ModelConfig(pb.ModelConfigRequest(name="simple"))).config.max_batch_size == 8
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "Request for unknown model: 'nope' is not found"


async def test_infer_forwards_bytes_and_sidecar_errors(sidecars) -> None:
    async with running_gateway(gateway_settings(sidecars)) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        response = await stub.ModelInfer(simple_request("torchy", "7"))
        assert response.id == "7" and response.model_name == "torchy"
        assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == list(range(1, 17))
        # A sidecar's error passes through with its status and text.
        bad = simple_request("later")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(bad)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "Request for unknown model: 'later' has no available versions"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(simple_request("nope"))
        assert info.value.details() == "Request for unknown model: 'nope' is not found"
        metrics = urllib.request.urlopen(f"http://{gw.addresses['metrics']}/metrics").read().decode()
        # Counted per arm: the version the request went to ("default": the sidecar's choice).
        assert (
            'turnout_gateway_requests_total{model="torchy",outcome="success",protocol="grpc",version="default"} 1.0'
            in metrics
        )


async def test_stream_answers_each_request_and_keeps_errors_in_band(sidecars) -> None:
    async with running_gateway(gateway_settings(sidecars)) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        requests = [simple_request("simple", "a"), simple_request("nope", "b"), simple_request("torchy", "c")]
        responses = [r async for r in stub.ModelStreamInfer(iter(requests))]
        by_id = {r.infer_response.id: r for r in responses}
        assert set(by_id) == {"a", "b", "c"}
        assert by_id["b"].error_message == "Request for unknown model: 'nope' is not found"
        assert by_id["a"].error_message == "" and len(by_id["a"].infer_response.raw_output_contents) == 2
        for answered in ("a", "c"):
            assert by_id[answered].infer_response.parameters["triton_final_response"].bool_param
        # As Triton words a request refused before it ran: its id alone, no final flag.
        assert by_id["b"].infer_response == pb.ModelInferResponse(id="b")


async def test_repository_index_statistics_and_load(sidecars) -> None:
    async with running_gateway(gateway_settings(sidecars, model_control_mode="explicit")) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
        assert [m.name for m in index.models] == ["later", "shared", "shared", "simple", "torchy"]
        stats = await stub.ModelStatistics(pb.ModelStatisticsRequest())
        assert sorted(s.name for s in stats.model_stats) == ["shared", "shared", "simple", "torchy"]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelStatistics(pb.ModelStatisticsRequest(name="nope"))
        assert info.value.details() == "requested model 'nope' is not available"
        # `later` is listed by the onnxruntime sidecar: the load goes there and it becomes servable.
        await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="later"))
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="later"))).ready
        await stub.ModelInfer(simple_request("later"))
        await stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="later"))
        assert not (await stub.ModelReady(pb.ModelReadyRequest(name="later"))).ready
        # A model no index lists goes to the sidecar of the framework its config names.
        load = pb.RepositoryModelLoadRequest(model_name="fresh")
        load.parameters["config"].string_param = '{"backend": "pytorch"}'
        await stub.RepositoryModelLoad(load)
        assert (await stub.ModelMetadata(pb.ModelMetadataRequest(name="fresh"))).name == "fresh"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="x", repository_name="r"))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert info.value.details() == "'repository_name' specification is not supported"


async def test_load_refused_unless_explicit(sidecars) -> None:
    async with running_gateway(gateway_settings(sidecars, model_control_mode="none")) as gw:
        stub = pbg.GRPCInferenceServiceStub(gw.channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="later"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "explicit model load / unload is not allowed if polling is enabled"


async def test_health_service_follows_readiness(sidecars) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with running_gateway(gateway_settings(sidecars)) as gw:
        health = health_pb2_grpc.HealthStub(gw.channel)
        response = await health.Check(health_pb2.HealthCheckRequest())
        assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_infer_over_the_lane() -> None:
    with stub_sidecar("onnxruntime", "simple", lane=True) as sidecar:
        assert sidecar.lane
        async with running_gateway(gateway_settings((sidecar,))) as gw:
            stub = pbg.GRPCInferenceServiceStub(gw.channel)
            response = await stub.ModelInfer(simple_request("simple", "l"))
            assert response.id == "l" and len(response.raw_output_contents) == 2
