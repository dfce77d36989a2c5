"""A stand-in sidecar for the gateway's own tests: the v2 gRPC service over numpy.

It serves `simple`-like models (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1,
INT32 [-1, 16]) under the names given, so registry, routing and shared-memory tests
need no ONNX runtime. Run as `python -m tests.gateway.stub_sidecar --framework F
--model NAME ... [--explicit]`; prints the sidecar ready line.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
import numpy as np

from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pbg
from protos.lane import LaneServer
from protos.ready import SIDECAR_READY, ready_line
from protos.rpc import MESSAGE_SIZE_OPTIONS
from protos.status import Status, TurnoutError


class Stub(pbg.GRPCInferenceServiceServicer):
    def __init__(self, models: list[str], loaded: set[str]) -> None:
        self.models = models
        self.loaded = loaded

    async def _check(self, name: str, context: grpc.aio.ServicerContext) -> None:
        if name not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if name not in self.loaded:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions"
            )

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in self.loaded)

    async def ModelMetadata(self, request, context):
        await self._check(request.name, context)
        response = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="onnxruntime_onnx")
        for name in ("INPUT0", "INPUT1"):
            response.inputs.add(name=name, datatype="INT32", shape=[-1, 16])
        for name in ("OUTPUT0", "OUTPUT1"):
            response.outputs.add(name=name, datatype="INT32", shape=[-1, 16])
        return response

    async def ModelConfig(self, request, context):
        await self._check(request.name, context)
        response = pb.ModelConfigResponse()
        response.config.name = request.name
        response.config.max_batch_size = 8
        return response

    async def lane_infer(self, payload: memoryview, request_id: str) -> bytes:
        request = pb.ModelInferRequest.FromString(payload)
        if request.model_name not in self.loaded:
            raise TurnoutError(Status.NOT_FOUND, f"Request for unknown model: '{request.model_name}' is not found")
        return (await self.ModelInfer(request, None)).SerializeToString()

    async def ModelInfer(self, request, context):
        await self._check(request.model_name, context)
        if len(request.raw_input_contents) != 2:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"expected 2 raw inputs, got {len(request.raw_input_contents)}"
            )
        for tensor in (*request.inputs, *request.outputs):
            if tensor.parameters:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected parameters on '{tensor.name}'")
        a = np.frombuffer(request.raw_input_contents[0], dtype="<i4")
        b = np.frombuffer(request.raw_input_contents[1], dtype="<i4")
        shape = list(request.inputs[0].shape)
        response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        wanted = [o.name for o in request.outputs] or ["OUTPUT0", "OUTPUT1"]
        for name in wanted:
            response.outputs.add(name=name, datatype="INT32", shape=shape)
            response.raw_output_contents.append((a + b if name == "OUTPUT0" else a - b).astype("<i4").tobytes())
        return response

    async def ModelStreamInfer(self, requests, context):
        # As a sidecar's: one final response per request (the gateway sends a stream's
        # requests here when the sidecar has no lane).
        async for request in requests:
            if request.model_name not in self.loaded:
                message = f"Request for unknown model: '{request.model_name}' is not found"
                failed = pb.ModelStreamInferResponse(error_message=message)
                failed.infer_response.id = request.id
                yield failed
                continue
            answer = pb.ModelStreamInferResponse(infer_response=await self.ModelInfer(request, context))
            answer.infer_response.parameters["triton_final_response"].bool_param = True
            yield answer

    async def ModelStatistics(self, request, context):
        names = [request.name] if request.name else sorted(self.loaded)
        if request.name:
            await self._check(request.name, context)
        return pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(name=n, version="1") for n in names])

    async def RepositoryIndex(self, request, context):
        response = pb.RepositoryIndexResponse()
        for name in self.models:
            if name in self.loaded:
                response.models.add(name=name, version="1", state="READY")
            else:
                response.models.add(name=name)
        return response

    async def RepositoryModelLoad(self, request, context):
        if request.model_name not in self.models:
            if "config" not in request.parameters:
                await context.abort(
                    grpc.StatusCode.INTERNAL,
                    f"failed to load '{request.model_name}', failed to poll from model repository",
                )
            self.models.append(request.model_name)
        self.loaded.add(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        self.loaded.discard(request.model_name)
        return pb.RepositoryModelUnloadResponse()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", required=True)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--unloaded", action="append", default=[])
    parser.add_argument("--lane", action="store_true", help="also serve ModelInfer on an infer lane (TCP)")
    args = parser.parse_args()
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    stub = Stub([*args.model, *args.unloaded], set(args.model))
    pbg.add_GRPCInferenceServiceServicer_to_server(stub, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    lane = {}
    if args.lane:
        lane_server = LaneServer(stub.lane_infer)
        lane["lane"] = await lane_server.start_tcp("127.0.0.1", 0)
    print(ready_line(SIDECAR_READY, grpc=f"127.0.0.1:{port}", framework=args.framework, **lane), flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
