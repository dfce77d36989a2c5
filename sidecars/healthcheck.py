"""`python -m sidecars.healthcheck`: a container health check. Exits 0 when the sidecar on
this host answers gRPC health SERVING (all its models ready), 1 otherwise.

It reads the port and the TLS settings from the TURNOUT_SIDECAR_* variables the sidecar
itself reads, so the check follows them. Under TLS it trusts the sidecar's root
certificate (TURNOUT_HEALTHCHECK_ROOT_CERT, else the sidecar's --grpc-root-cert) and, where
the sidecar wants client certificates, presents the sidecar's own certificate and key."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, timeout: float, credentials: grpc.ChannelCredentials | None = None, tls_name: str = "") -> bool:
    """Whether the sidecar at `address` (host:port) reports itself ready."""
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        options = [("grpc.ssl_target_name_override", tls_name)] if tls_name else []
        channel = grpc.secure_channel(address, credentials, options=options)
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def tls_credentials(root_cert: str, mutual: bool, cert: str, key: str) -> grpc.ChannelCredentials:
    """Trust `root_cert`; with `mutual`, present the sidecar's own certificate as ours."""
    if not root_cert:
        raise click.UsageError("a TLS sidecar's health check needs TURNOUT_HEALTHCHECK_ROOT_CERT or --grpc-root-cert")
    client = (Path(key).read_bytes(), Path(cert).read_bytes()) if mutual else (None, None)
    return grpc.ssl_channel_credentials(Path(root_cert).read_bytes(), *client)


@click.command(context_settings={"auto_envvar_prefix": "TURNOUT_SIDECAR", "show_default": True})
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="the sidecar's gRPC port")
@click.option("--host", default="127.0.0.1", help="the sidecar's bind address; a wildcard is reached on loopback")
@click.option("--timeout", default=3.0, type=click.FloatRange(min=0.1), envvar="TURNOUT_HEALTHCHECK_TIMEOUT")
@click.option("--grpc-use-ssl", default=False, type=click.BOOL, help="the sidecar serves TLS")
@click.option("--grpc-use-ssl-mutual", default=False, type=click.BOOL, help="the sidecar wants client certificates")
@click.option("--grpc-server-cert", default="", help="the sidecar's certificate (our client certificate)")
@click.option("--grpc-server-key", default="", help="its key")
@click.option("--grpc-root-cert", default="", help="the CA the sidecar trusts for clients")
@click.option("--root-cert", default="", envvar="TURNOUT_HEALTHCHECK_ROOT_CERT", help="the CA to trust")
@click.option(
    "--tls-name", default="", envvar="TURNOUT_HEALTHCHECK_TLS_NAME", help="the name the sidecar's certificate holds"
)
def main(
    port: int,
    host: str,
    timeout: float,
    grpc_use_ssl: bool,
    grpc_use_ssl_mutual: bool,
    grpc_server_cert: str,
    grpc_server_key: str,
    grpc_root_cert: str,
    root_cert: str,
    tls_name: str,
) -> None:
    """Exit 0 if the sidecar on this host is ready, else 1."""
    # A sidecar bound to a wildcard answers on loopback too.
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    credentials = None
    if grpc_use_ssl or grpc_use_ssl_mutual:
        trusted = root_cert or grpc_root_cert
        credentials = tls_credentials(trusted, grpc_use_ssl_mutual, grpc_server_cert, grpc_server_key)
    sys.exit(0 if check(f"{target}:{port}", timeout, credentials, tls_name) else 1)


if __name__ == "__main__":
    main()
