"""Helpers for the gateway's own tests: stand-in sidecar processes and an in-process gateway."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc

from gateway.app import serve
from gateway.settings import GatewaySettings, SidecarAddress
from protos.ready import SIDECAR_READY, parse_ready
from protos.rpc import MESSAGE_SIZE_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def stub_sidecar(
    framework: str, *models: str, unloaded: tuple[str, ...] = (), lane: bool = False
) -> Iterator[SidecarAddress]:
    command = [sys.executable, "-m", "tests.gateway.stub_sidecar", f"--framework={framework}"]
    command += [f"--model={m}" for m in models] + [f"--unloaded={m}" for m in unloaded]
    command += ["--lane"] if lane else []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        fields = parse_ready(line, SIDECAR_READY)
        assert fields is not None, line
        yield SidecarAddress(framework, fields["grpc"], fields.get("lane", ""))
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


class RunningGateway:
    def __init__(self, addresses: dict[str, str], channel: grpc.aio.Channel) -> None:
        self.addresses = addresses
        self.channel = channel


@contextlib.asynccontextmanager
async def running_gateway(settings: GatewaySettings) -> AsyncIterator[RunningGateway]:
    stop = asyncio.Event()
    ready: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(settings, stop, ready.set_result))
    addresses = await asyncio.wait_for(asyncio.shield(ready), 30)
    channel = grpc.aio.insecure_channel(addresses["grpc"], options=MESSAGE_SIZE_OPTIONS)
    try:
        yield RunningGateway(addresses, channel)
    finally:
        await channel.close()
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


def gateway_settings(sidecars: tuple[SidecarAddress, ...], **changes: object) -> GatewaySettings:
    base = GatewaySettings(
        host="127.0.0.1", http_port=0, grpc_port=0, metrics_port=0, allow_http=False, exit_timeout_secs=2.0
    )
    return replace(base, sidecars=sidecars, **changes)  # type: ignore[arg-type]
