"""`python -m sidecars.healthcheck`: a container health check. Exits 0 when the sidecar on
this host answers gRPC health SERVING (all its models ready), 1 otherwise.

It reads the port from TURNOUT_SIDECAR_PORT, the variable the sidecar itself reads, so the
check follows a port changed in the environment."""

from __future__ import annotations

import sys

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, timeout: float) -> bool:
    """Whether the sidecar at `address` (host:port) reports itself ready."""
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


@click.command(context_settings={"auto_envvar_prefix": "TURNOUT_SIDECAR", "show_default": True})
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="the sidecar's gRPC port")
@click.option("--host", default="127.0.0.1", help="the sidecar's bind address; a wildcard is reached on loopback")
@click.option("--timeout", default=3.0, type=click.FloatRange(min=0.1), envvar="TURNOUT_HEALTHCHECK_TIMEOUT")
def main(port: int, host: str, timeout: float) -> None:
    """Exit 0 if the sidecar on this host is ready, else 1."""
    # A sidecar bound to a wildcard answers on loopback too.
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    sys.exit(0 if check(f"{target}:{port}", timeout) else 1)


if __name__ == "__main__":
    main()
