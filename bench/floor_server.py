"""The floor: one Python process that serves `simple` over both v2 protocols itself.

grpc.aio answers ModelInfer (a generic handler, real ModelInferRequest/Response messages)
and uvicorn answers the KServe binary infer POST, in one event loop; the model
(OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32) is computed inline with
numpy. No gateway, no sidecar, no hop between them: what the work costs when one process
does all of it, which turnout's two processes are measured against. Run as
`python -m bench.floor_server [auto|asyncio|uvloop]` (the event loop, as turnout's
`--event-loop`); prints `FLOOR_READY grpc=H:P http=H:P`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import grpc
import numpy as np
import uvicorn

from protos import event_loop
from protos import grpc_service_pb2 as pb
from protos.rpc import MESSAGE_SIZE_OPTIONS, SERVICE

MODEL = "simple"
READY = "FLOOR_READY"


def compute(input0: np.ndarray, input1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return input0 + input1, input0 - input1


def _error(message: str) -> tuple[int, bytes]:
    return 400, json.dumps({"error": message}).encode()


def infer_grpc(request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
    if request.model_name != MODEL or len(request.raw_input_contents) != 2:
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details("the floor serves 'simple' with raw INT32 inputs only")
        return pb.ModelInferResponse()
    tensors = {t.name: (t, raw) for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)}
    shape = list(tensors["INPUT0"][0].shape)
    input0 = np.frombuffer(tensors["INPUT0"][1], np.int32)
    input1 = np.frombuffer(tensors["INPUT1"][1], np.int32)
    response = pb.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
    for name, array in zip(("OUTPUT0", "OUTPUT1"), compute(input0, input1), strict=True):
        response.outputs.add(name=name, datatype="INT32", shape=shape)
        response.raw_output_contents.append(array.tobytes())
    return response


def infer_http(body: bytes, header_length: int | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One KServe v2 infer POST body (JSON header, then binary inputs) to status, headers, body."""
    header = json.loads(body[:header_length] if header_length is not None else body)
    offset = header_length or len(body)
    arrays: dict[str, np.ndarray] = {}
    shape: list[int] = []
    for tensor in header["inputs"]:
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[tensor["name"]] = np.asarray(tensor["data"], np.int32).reshape(-1)
        else:
            arrays[tensor["name"]] = np.frombuffer(body, np.int32, size // 4, offset)
            offset += size
        shape = tensor["shape"]
    if set(arrays) != {"INPUT0", "INPUT1"}:
        status, text = _error("the floor serves 'simple' with INPUT0 and INPUT1 only")
        return status, [(b"content-type", b"application/json")], text
    binary = header.get("parameters", {}).get("binary_data_output", False)
    outputs, blobs = [], []
    for name, array in zip(("OUTPUT0", "OUTPUT1"), compute(arrays["INPUT0"], arrays["INPUT1"]), strict=True):
        output: dict[str, Any] = {"name": name, "datatype": "INT32", "shape": shape}
        if binary:
            blob = array.tobytes()
            output["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            output["data"] = array.tolist()
        outputs.append(output)
    document = {"model_name": MODEL, "model_version": "1", "outputs": outputs}
    if "id" in header:
        document["id"] = header["id"]
    head = json.dumps(document).encode()
    if not binary:
        return 200, [(b"content-type", b"application/json")], head
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(len(head)).encode()),
    ]
    return 200, headers, b"".join([head, *blobs])


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    header_length = next((int(v) for k, v in scope["headers"] if k == b"inference-header-content-length"), None)
    if scope["method"] == "POST" and scope["path"] == f"/v2/models/{MODEL}/infer":
        try:
            status, headers, body = infer_http(b"".join(chunks), header_length)
        except (ValueError, KeyError) as exc:
            status, body = _error(f"malformed request: {exc}")
            headers = [(b"content-type", b"application/json")]
    else:
        status, body = _error(f"the floor serves POST /v2/models/{MODEL}/infer only")
        headers = [(b"content-type", b"application/json")]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve(host: str = "127.0.0.1") -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                infer_grpc,
                request_deserializer=pb.ModelInferRequest.FromString,
                response_serializer=pb.ModelInferResponse.SerializeToString,
            )
        },
    )
    grpc_server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    grpc_server.add_generic_rpc_handlers((handler,))
    grpc_port = grpc_server.add_insecure_port(f"{host}:0")
    await grpc_server.start()
    # proto=TCP, so asyncio sets TCP_NODELAY on accepted sockets (as the gateway's _bind).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(
        http_app, lifespan="off", log_config=None, access_log=False, server_header=False, date_header=False
    )
    http_server = uvicorn.Server(config)  # answers headed as turnout's
    task = asyncio.create_task(http_server.serve(sockets=[sock]))
    while not http_server.started and not task.done():
        await asyncio.sleep(0.01)
    print(f"{READY} grpc={host}:{grpc_port} http={host}:{sock.getsockname()[1]}", flush=True)
    try:
        await task
    finally:
        await grpc_server.stop(0)


if __name__ == "__main__":
    event_loop.run(serve(), sys.argv[1] if len(sys.argv) > 1 else "auto")
