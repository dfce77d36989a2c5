"""The sidecar command line: `python -m sidecars --framework onnxruntime --model-repository DIR`.

Every option may also come from a TURNOUT_SIDECAR_<OPTION> environment variable, named after
the flag (--model-repository: TURNOUT_SIDECAR_MODEL_REPOSITORY; repeatable ones space-separated)."""

from __future__ import annotations

import sys
from typing import Any

import click

from protos.flags import (
    CONSUL_FLAGS,
    HELP_OPTIONS,
    LOG_FLAGS,
    TLS_FLAGS,
    TRITON_BOOL,
    consul_access,
    model_repository_option,
    shared,
)
from sidecars.process import run
from sidecars.runtime import RUNTIMES
from sidecars.settings import ControlMode, SidecarSettings


def _backend_config(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        key, sep, setting = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected <setting>=<value>, got '{value}'", param_hint="--backend-config")
        pairs.append((key, setting))
    return tuple(pairs)


@click.command(
    context_settings={"auto_envvar_prefix": "TURNOUT_SIDECAR", "show_default": True, "help_option_names": HELP_OPTIONS}
)
@click.option("--framework", required=True, type=click.Choice(sorted(RUNTIMES)))
@model_repository_option("TURNOUT_SIDECAR_MODEL_REPOSITORY", must_exist=False)
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="0 binds a free port")
@shared("model_control_mode", "repository_poll_secs")
@click.option(
    "--load-model",
    "load_models",
    envvar="TURNOUT_SIDECAR_LOAD_MODEL",
    multiple=True,
    help="explicit mode: load at start ('*' = all)",
)
@shared("exit_on_error", "strict_readiness", "disable_auto_complete_config")
@click.option(
    "--report-unassigned-models",
    default=True,
    help="list model folders no turnout framework serves, as UNAVAILABLE with the reason",
    **TRITON_BOOL,
)
@click.option("--backend-config", multiple=True, help="<setting>=<value>, e.g. default-max-batch-size=4")
@click.option(
    "--model-config-name",
    default="",
    help="Triton's: a model's configs/<name>.pbtxt configures it instead of its config.pbtxt, where it has one",
)
@shared("exit_timeout_secs", "event_loop", *LOG_FLAGS)
@click.option("--metrics-port", default=0, type=click.IntRange(0, 65535), help="/metrics port; 0 binds a free port")
@shared("allow_metrics")
@click.option(
    "--lane",
    default="auto",
    type=click.Choice(["auto", "unix", "tcp", "off"]),
    help="the gateway's infer lane: a Unix socket on loopback (auto), TCP, or none",
)
@click.option("--lane-port", default=0, type=click.IntRange(0, 65535), help="TCP lane port; 0 binds a free port")
@click.option("--lane-path", default="", help="Unix lane socket path (a stale socket there is replaced)")
@click.option(
    "--consul",
    default="",
    help="HOST:PORT (or http[s]://HOST:PORT) of the local Consul agent: register this sidecar there",
)
@click.option("--consul-service", default="turnout-sidecar", help="the Consul service name to register under")
@click.option("--advertise-address", default="", help="address the gateway and Consul reach this sidecar at")
@click.option("--device", default="cpu", help="the device advertised in the registration's meta")
@click.option("--consul-check-interval", default="1s", help="how often Consul checks our gRPC health")
@click.option("--consul-deregister-after", default="1m", help="Consul drops us after critical this long")
@shared(*CONSUL_FLAGS)
@shared(*TLS_FLAGS)
@click.option(
    "--allow-unauthenticated-network",
    default=False,
    help="serve on a non-loopback --host without mutual TLS (refused otherwise): any host that reaches "
    "the sidecar can then run inferences past the gateway's restricted APIs",
    **TRITON_BOOL,
)
def main(
    framework: str,
    model_repositories: tuple[str, ...],
    host: str,
    port: int,
    model_control_mode: str,
    repository_poll_secs: float,
    load_models: tuple[str, ...],
    exit_on_error: bool,
    strict_readiness: bool,
    disable_auto_complete_config: bool,
    report_unassigned_models: bool,
    backend_config: tuple[str, ...],
    model_config_name: str,
    exit_timeout_secs: float,
    event_loop: str,
    log_verbose: int,
    log_info: bool,
    log_warning: bool,
    log_error: bool,
    log_format: str,
    log_file: str,
    metrics_port: int,
    allow_metrics: bool,
    lane: str,
    lane_port: int,
    lane_path: str,
    consul: str,
    consul_service: str,
    advertise_address: str,
    device: str,
    consul_check_interval: str,
    consul_deregister_after: str,
    grpc_use_ssl: bool,
    grpc_use_ssl_mutual: bool,
    grpc_server_cert: str,
    grpc_server_key: str,
    grpc_root_cert: str,
    allow_unauthenticated_network: bool,
    **consul_flags: Any,
) -> None:
    """Serve one framework's models of a Triton model repository over the v2 gRPC service."""
    # As the gateway's flags: mutual TLS implies TLS, and TLS needs a certificate and its key.
    grpc_use_ssl = grpc_use_ssl or grpc_use_ssl_mutual
    if grpc_use_ssl_mutual and not grpc_root_cert:
        raise click.UsageError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    if grpc_use_ssl and not (grpc_server_cert and grpc_server_key):
        raise click.UsageError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    options = _backend_config(backend_config)
    default_max = dict(options).get("default-max-batch-size", "4")
    try:
        default_max_batch_size = int(default_max)
    except ValueError as exc:
        raise click.BadParameter(f"default-max-batch-size must be an integer, got '{default_max}'") from exc
    settings = SidecarSettings(
        framework=framework,
        model_repositories=model_repositories,
        host=host,
        port=port,
        model_control_mode=ControlMode(model_control_mode),
        repository_poll_secs=repository_poll_secs,
        load_models=load_models,
        exit_on_error=exit_on_error,
        strict_readiness=strict_readiness,
        auto_complete_config=not disable_auto_complete_config,
        report_unassigned=report_unassigned_models,
        model_config_name=model_config_name,
        default_max_batch_size=default_max_batch_size,
        backend_config=options,
        exit_timeout_secs=exit_timeout_secs,
        event_loop=event_loop,
        log_verbose=log_verbose,
        log_info=log_info,
        log_warning=log_warning,
        log_error=log_error,
        log_format=log_format,
        log_file=log_file,
        metrics_port=metrics_port,
        allow_metrics=allow_metrics,
        lane=lane,
        lane_port=lane_port,
        lane_path=lane_path,
        consul=consul,
        consul_service=consul_service,
        consul_access=consul_access(consul_flags),
        advertise_address=advertise_address,
        device=device,
        consul_check_interval=consul_check_interval,
        consul_deregister_after=consul_deregister_after,
        grpc_use_ssl=grpc_use_ssl,
        grpc_use_ssl_mutual=grpc_use_ssl_mutual,
        grpc_server_cert=grpc_server_cert,
        grpc_server_key=grpc_server_key,
        grpc_root_cert=grpc_root_cert,
        allow_unauthenticated_network=allow_unauthenticated_network,
    )
    sys.exit(run(settings))


if __name__ == "__main__":
    main(prog_name="turnout sidecar")
