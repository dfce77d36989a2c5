"""A plain uvicorn server that answers every v2 infer POST with one fixed binary response.

The floor for the HTTP target: what tritonclient, uvicorn and one hop cost with no
model and no gateway. Run as `python -m bench.http_echo MODEL`; prints `ECHO_READY <port>`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import uvicorn


def _response(model: str) -> tuple[bytes, int]:
    if model == "mlp":
        outputs = [("OUTPUT0", "FP32", [1, 10], 40)]
    elif model == "tensor1m":
        outputs = [("OUTPUT0", "FP32", [1, 262144], 1 << 20)]
    else:
        outputs = [("OUTPUT0", "INT32", [1, 16], 64), ("OUTPUT1", "INT32", [1, 16], 64)]
    header = json.dumps(
        {
            "model_name": model,
            "model_version": "1",
            "outputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": size}}
                for n, d, s, size in outputs
            ],
        }
    ).encode()
    return header + bytes(sum(o[3] for o in outputs)), len(header)


def app_for(model: str) -> Any:
    body, header_length = _response(model)
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(header_length).encode()),
        (b"content-length", str(len(body)).encode()),
    ]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the request through, as a real server must
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def serve(model: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app_for(model), lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(f"ECHO_READY {sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1] if len(sys.argv) > 1 else "simple"))
