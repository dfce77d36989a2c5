"""A plain v2 gRPC server that answers every ModelInfer with one fixed response.

It marks the floor: what the client and one gRPC hop cost with no model and no
gateway. Run as `python -m bench.echo_server MODEL`; prints `ECHO_READY <port>`.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from protos import grpc_service_pb2 as pb
from protos.rpc import MESSAGE_SIZE_OPTIONS, SERVICE


def _response(model: str) -> bytes:
    if model == "mlp":
        outputs = [("OUTPUT0", "FP32", [1, 10], bytes(40))]
    elif model == "tensor1m":
        outputs = [("OUTPUT0", "FP32", [1, 262144], bytes(1 << 20))]
    else:
        outputs = [("OUTPUT0", "INT32", [1, 16], bytes(64)), ("OUTPUT1", "INT32", [1, 16], bytes(64))]
    response = pb.ModelInferResponse(model_name=model, model_version="1")
    for name, datatype, shape, raw in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    serialized: bytes = response.SerializeToString()
    return serialized


async def serve(model: str) -> None:
    reply = _response(model)

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return reply

    handler = grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)})
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ECHO_READY {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1] if len(sys.argv) > 1 else "simple"))
