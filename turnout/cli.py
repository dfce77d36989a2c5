"""The `turnout` command: `up` (gateway + sidecars on one machine), `gateway`, `sidecar`.

Flags follow Triton's names where clients feel them; every flag also reads an
environment variable with the TURNOUT_ prefix (TURNOUT_UP_HTTP_PORT, ...).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from click.core import ParameterSource

from gateway.settings import GatewaySettings, SidecarAddress
from protos.flags import (
    CONSUL_FLAGS,
    HELP_OPTIONS,
    LOG_FLAGS,
    TLS_FLAGS,
    TRITON_BOOL,
    consul_access,
    model_repository_option,
    shared,
    shared_options,
)
from protos.ready import join_host_port, quiet_port


def _check_restrictions(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> tuple[str, ...]:
    from gateway.restrictions import RestrictionError, parse_restrictions

    try:
        parse_restrictions(specs)
    except RestrictionError as exc:
        raise click.BadParameter(str(exc)) from exc
    return specs


def _trace_config(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> Any:
    """--trace-config, with Triton's deprecated --trace-* flags read first (so, as in
    Triton, --trace-config overrides them), into one TraceConfig; each ignored setting
    gets one warning line."""
    from gateway.tracing.config import TraceConfigError, parse_trace_config

    deprecated = []
    for flag, spec in _DEPRECATED_TRACE_FLAGS.items():
        for value in ctx.params.pop(flag, ()) or ():
            deprecated.append(f"{spec}={value}")
    try:
        config, warnings = parse_trace_config([*deprecated, *specs])
    except TraceConfigError as exc:
        raise click.BadParameter(str(exc)) from exc
    for warning in warnings:
        click.echo(f"turnout: {warning}", err=True)
    return config


# Triton's deprecated spellings of --trace-config settings.
_DEPRECATED_TRACE_FLAGS = {
    "trace_file": "triton,file",
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "trace_log_frequency": "triton,log-frequency",
}


# Triton's gRPC transport flags, each a grpc server option (milliseconds); their defaults
# are GatewaySettings' (Triton's, which are grpc's own).
_GRPC_TRANSPORT = {
    "grpc-keepalive-time": "Milliseconds between the keepalive pings the server sends.",
    "grpc-keepalive-timeout": "Milliseconds a keepalive ping waits for its answer.",
    "grpc-http2-max-pings-without-data": "Pings sent while no data is (0: no limit).",
    "grpc-http2-min-recv-ping-interval-without-data": (
        "Milliseconds a client must leave between pings while no data is, else each is a strike."
    ),
    "grpc-http2-max-ping-strikes": "Strikes before the server closes the connection (0: no limit).",
    "grpc-max-connection-age": "Milliseconds a connection may last (0: no limit).",
    "grpc-max-connection-age-grace": "Milliseconds a connection past its age may finish its calls (0: no limit).",
}


def _setting_default(flag: str) -> Any:
    return GatewaySettings.__dataclass_fields__[flag.replace("-", "_")].default


def _grpc_transport_options() -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            f"--{name}", type=click.IntRange(min=0), default=_setting_default(name), show_default=True, help=text
        )
        for name, text in _GRPC_TRANSPORT.items()
    ]
    options.append(
        click.option(
            "--grpc-keepalive-permit-without-calls",
            default=_setting_default("grpc-keepalive-permit-without-calls"),
            help="Let keepalive pings go while no call is in flight.",
            **TRITON_BOOL,
        )
    )
    return options


def _pattern(context: click.Context, parameter: click.Parameter, value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}") from None
    return value


def _gateway_options(function: Callable[..., Any]) -> Callable[..., Any]:
    deprecated_trace = [
        click.option(
            f"--{name.replace('_', '-')}",
            name,
            multiple=True,
            is_eager=True,
            expose_value=True,
            help=f"Triton's deprecated form of --trace-config {spec}=VALUE.",
        )
        for name, spec in _DEPRECATED_TRACE_FLAGS.items()
    ]
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("--host", default="0.0.0.0", show_default=True, help="Address the front ends bind."),
        click.option("--http-port", type=int, default=8000, show_default=True),
        click.option("--grpc-port", type=int, default=8001, show_default=True),
        click.option("--metrics-port", type=int, default=8002, show_default=True),
        click.option("--allow-http", default=True, **TRITON_BOOL),
        click.option("--allow-grpc", default=True, **TRITON_BOOL),
        *shared_options("allow_metrics"),
        *shared_options("model_control_mode"),
        *shared_options("strict_readiness"),
        click.option("--allow-client-shm", default=False, **TRITON_BOOL),
        *shared_options("exit_timeout_secs", "event_loop"),
        click.option("--http-max-input-size", type=click.IntRange(min=1), default=64 * 2**20, show_default=True),
        *shared_options(*LOG_FLAGS),
        *deprecated_trace,
        click.option(
            "--trace-config",
            "trace_config",
            multiple=True,
            callback=_trace_config,
            help="Triton's trace settings, repeatable: level=TIMESTAMPS, rate=N, count=N, mode=triton|opentelemetry, "
            "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
            "opentelemetry,bsp_max_queue_size=N, ...",
        ),
        click.option(
            "--routing",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help=(
                "YAML routing policies: models: {<model>: {weights: {'1': 90, '2': 10}, sticky_header: x-user}}; "
                "weights may name other models' arms ('other:1'), shadow: {version, fraction, rtol, atol} "
                "(docs/deploy.md)."
            ),
        ),
        click.option("--routing-seed", type=int, default=None, help="Seed for weighted draws (replayable runs)."),
        click.option(
            "--gateway-workers",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Gateway processes serving the same ports, to use more cores (Linux: SO_REUSEPORT).",
        ),
        *shared_options(*TLS_FLAGS),
        click.option("--http-ssl-certfile", default="", help="PEM certificate: serve HTTPS (Triton has no HTTP TLS)."),
        click.option("--http-ssl-keyfile", default="", help="PEM private key for HTTPS."),
        click.option(
            "--sidecar-use-ssl",
            default=False,
            help="Reach --sidecar sidecars over TLS (under Consul, each says); the next flags imply it.",
            **TRITON_BOOL,
        ),
        click.option("--sidecar-ssl-root-cert", default="", help="PEM CA certificates that sign sidecar certificates."),
        click.option("--sidecar-ssl-cert", default="", help="PEM client certificate for sidecars with mutual TLS."),
        click.option("--sidecar-ssl-key", default="", help="PEM private key of --sidecar-ssl-cert."),
        click.option(
            "--sidecar-ssl-server-name",
            default="",
            help="The name every sidecar certificate must hold (default: each sidecar's host), "
            "for sidecars on addresses no certificate lists, such as containers.",
        ),
        click.option(
            "--sidecar-max-inflight",
            type=click.IntRange(min=0),
            default=1024,
            show_default=True,
            help="Requests in flight per sidecar beyond which new ones get UNAVAILABLE at once (0: no limit).",
        ),
        *_grpc_transport_options(),
        click.option(
            "--grpc-infer-response-compression-level",
            type=click.Choice(["none", "low", "medium", "high"], case_sensitive=False),
            default="none",
            show_default=True,
            help="Compress infer responses (gzip, which every gRPC client accepts) unless none.",
        ),
        click.option(
            "--http-header-forward-pattern",
            default="",
            callback=_pattern,
            help="Regular expression: HTTP headers whose names it matches reach the model as request parameters.",
        ),
        click.option(
            "--grpc-header-forward-pattern",
            default="",
            callback=_pattern,
            help="Regular expression: gRPC metadata whose keys it matches reach the model as request parameters.",
        ),
        click.option(
            "--grpc-stream-max-inflight",
            type=click.IntRange(min=0),
            default=1024,
            show_default=True,
            help="Requests of one gRPC stream read and not yet answered; beyond them the gateway reads no more "
            "of that stream until an answer leaves, so its client waits (0: no limit).",
        ),
        click.option(
            "--http-restricted-api",
            multiple=True,
            callback=_check_restrictions,
            help="<api>[,<api>...]:<key>=<value>: those APIs need HTTP header <key>: <value> (repeatable).",
        ),
        click.option(
            "--grpc-restricted-protocol",
            multiple=True,
            callback=_check_restrictions,
            help="<api>[,<api>...]:<key>=<value>: those RPCs need metadata triton-grpc-protocol-<key> (repeatable).",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _gateway_settings(sidecars: tuple[SidecarAddress, ...], **flags: Any) -> GatewaySettings:
    keys = GatewaySettings.__dataclass_fields__.keys()
    # As Triton: mutual TLS implies TLS, and TLS needs a certificate and its key.
    if flags.get("grpc_use_ssl_mutual"):
        flags["grpc_use_ssl"] = True
        if not flags.get("grpc_root_cert"):
            raise click.UsageError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    if flags.get("grpc_use_ssl") and not (flags.get("grpc_server_cert") and flags.get("grpc_server_key")):
        raise click.UsageError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if bool(flags.get("http_ssl_certfile")) != bool(flags.get("http_ssl_keyfile")):
        raise click.UsageError("--http-ssl-certfile and --http-ssl-keyfile go together")
    if bool(flags.get("sidecar_ssl_cert")) != bool(flags.get("sidecar_ssl_key")):
        raise click.UsageError("--sidecar-ssl-cert and --sidecar-ssl-key go together")
    if flags.get("sidecar_ssl_root_cert") or flags.get("sidecar_ssl_cert"):
        flags["sidecar_use_ssl"] = True
    flags["routing_file"] = flags.pop("routing", None) or ""
    flags["workers"] = flags.pop("gateway_workers", 1)
    if "trace_config" in flags:
        flags["trace"] = flags.pop("trace_config")
    return GatewaySettings(sidecars=sidecars, **{k: v for k, v in flags.items() if k in keys})


def _sidecar_arguments(
    *,
    model_repositories: Sequence[str],
    model_control_mode: str,
    exit_on_error: bool,
    strict_readiness: bool,
    repository_poll_secs: float,
    disable_auto_complete_config: bool,
    backend_configs: Sequence[str],
    exit_timeout_secs: float,
    log_verbose: int,
    event_loop: str = "auto",
    log_info: bool = True,
    log_warning: bool = True,
    log_error: bool = True,
    log_format: str = "default",
    log_file: str = "",
) -> list[str]:
    """The sidecar flags every sidecar of a `turnout up` shares, from `up`'s own."""
    arguments = [f"--model-repository={r}" for r in model_repositories]
    arguments += [
        f"--model-control-mode={model_control_mode}",
        f"--repository-poll-secs={repository_poll_secs}",
        f"--exit-timeout-secs={exit_timeout_secs}",
        f"--event-loop={event_loop}",
        f"--log-verbose={log_verbose}",
        f"--log-info={log_info}",
        f"--log-warning={log_warning}",
        f"--log-error={log_error}",
        f"--log-format={log_format}",
        f"--log-file={log_file}",
        "--metrics-port=0",
        f"--exit-on-error={exit_on_error}",
        f"--strict-readiness={strict_readiness}",
    ]
    arguments += [f"--backend-config={c}" for c in backend_configs]
    if disable_auto_complete_config:
        arguments.append("--disable-auto-complete-config")
    return arguments


def _check_ports(flags: dict[str, Any]) -> None:
    """Refuse a front end port that is taken before any sidecar starts (they take seconds)."""
    host = flags["host"]
    for what, flag, allowed in (
        ("HTTP", "http", "allow_http"),
        ("gRPC", "grpc", "allow_grpc"),
        ("metrics", "metrics", "allow_metrics"),
    ):
        port = flags[f"{flag}_port"]
        if not flags[allowed] or port == 0:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                where = join_host_port(host, port)
                raise click.ClickException(f"cannot serve {what} on {where} (--{flag}-port): {exc.strerror}") from None


# Triton's launch flags that mean nothing here: accepted, so a Triton launch command starts
# turnout unchanged, each with one warning line saying why it does nothing.
_TRITON_NO_OPS = {
    "backend-directory": "turnout's frameworks are built in (onnxruntime, pytorch, tensorrt, ensemble)",
    "model-load-thread-count": "each sidecar loads its models concurrently on its own",
    "pinned-memory-pool-byte-size": "turnout keeps no pinned-memory pool",
    "cuda-memory-pool-byte-size": "each framework manages its own GPU memory",
    "metrics-interval-ms": "metrics are read at scrape time",
    "allow-gpu-metrics": "GPU metrics come with the gpu-metrics extra where a GPU is present",
    "http-thread-count": "the HTTP front end is asynchronous",
    "id": "the server identity is fixed",
    "rate-limit": "instances run requests as their batchers hand them over",
    "rate-limit-resource": "instances run requests as their batchers hand them over",
    "grpc-infer-thread-count": "the gRPC front end is asynchronous",
    "grpc-infer-allocation-pool-size": "answers are not pooled",
    "grpc-max-response-pool-size": "a decoupled model's responses to one request are not bounded, as in Triton by "
    "default",
    "buffer-manager-thread-count": "turnout has no buffer manager",
    "cuda-virtual-address-size": "each framework manages its own GPU memory",
    "enable-peer-access": "each framework manages its own GPU memory",
    "host-policy": "each framework places its own threads and memory",
    "min-supported-compute-capability": "each framework checks the GPUs it can use",
    "model-load-gpu-limit": "each framework manages its own GPU memory",
    "model-load-retry-count": "a model that fails to load is not retried",
    "repoagent-directory": "turnout runs no repository agents",
    "cache-config": "turnout keeps no response cache: every request runs its model",
    "cache-directory": "turnout keeps no response cache: every request runs its model",
    "response-cache-byte-size": "turnout keeps no response cache: every request runs its model",
    "allow-cpu-metrics": "CPU metrics are always exported",
    "metrics-config": "turnout's metric families are fixed",
    "reuse-http-port": "each front end binds its port alone (--gateway-workers share them)",
    "reuse-grpc-port": "each front end binds its port alone (--gateway-workers share them)",
    "allow-sagemaker": "turnout serves no SageMaker endpoint",
    "sagemaker-port": "turnout serves no SageMaker endpoint",
    "sagemaker-safe-port-range": "turnout serves no SageMaker endpoint",
    "sagemaker-thread-count": "turnout serves no SageMaker endpoint",
    "allow-vertex-ai": "turnout serves no Vertex AI endpoint",
    "vertex-ai-port": "turnout serves no Vertex AI endpoint",
    "vertex-ai-thread-count": "turnout serves no Vertex AI endpoint",
    "vertex-ai-default-model": "turnout serves no Vertex AI endpoint",
}

# Triton's launch flags whose meaning turnout cannot give: accepted only with the value
# that asks for Triton's default behaviour, else the start is refused, saying why.
_TRITON_REFUSED = {
    "model-namespacing": "a model name may appear in only one model repository",
}
_DEFAULT_VALUES = frozenset({"", "false", "0", "off", "no"})
_FRONT_ADDRESSES = ("http-address", "grpc-address", "metrics-address")


def _triton_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Triton's --strict-model-config, and its flags that have no meaning for turnout."""
    function = click.option(
        "--strict-model-config",
        default=None,
        help="Triton's: true = no auto-complete, the config must be complete (as --disable-auto-complete-config).",
        **{**TRITON_BOOL, "show_default": False},
    )(function)
    helps = [(name, f"no effect ({why})") for name, why in _TRITON_NO_OPS.items()]
    helps += [(name, f"with its default value only ({why})") for name, why in _TRITON_REFUSED.items()]
    for name, text in reversed(helps):
        function = click.option(
            f"--{name}",
            name.replace("-", "_"),
            multiple=True,
            expose_value=True,
            help=f"Accepted from Triton's command line; {text}.",
        )(function)
    for name in reversed(_FRONT_ADDRESSES):
        function = click.option(
            f"--{name}",
            name.replace("-", "_"),
            default=None,
            help="Triton's: the address that front end binds. turnout binds all of them to one: the ones "
            "given must agree (Triton's metrics front follows --http-address), and they set --host.",
        )(function)
    return function


def _warn_triton_no_ops(flags: dict[str, Any]) -> None:
    for name, why in _TRITON_NO_OPS.items():
        for value in flags.pop(name.replace("-", "_"), ()):
            click.echo(f"turnout: ignoring --{name}={value}: {why}", err=True)
    for name, why in _TRITON_REFUSED.items():
        for value in flags.pop(name.replace("-", "_"), ()):
            if value.strip().lower() not in _DEFAULT_VALUES:
                raise click.UsageError(f"turnout cannot honour --{name}={value}: {why}")
    _front_addresses(flags)


def _front_addresses(flags: dict[str, Any]) -> None:
    """Triton's per-front addresses, each 0.0.0.0 unless given (the metrics front's, the
    HTTP front's): turnout binds every front end to one address, so those of the enabled
    fronts must agree, and become --host."""
    given = {name: flags.pop(name.replace("-", "_")) for name in _FRONT_ADDRESSES}
    if all(value is None for value in given.values()):
        return
    http = given["http-address"] or "0.0.0.0"
    wanted = {
        "--http-address": (flags["allow_http"], http),
        "--grpc-address": (flags["allow_grpc"], given["grpc-address"] or "0.0.0.0"),
        "--metrics-address": (flags["allow_metrics"], given["metrics-address"] or http),
    }
    bound = {flag: address for flag, (enabled, address) in wanted.items() if enabled}
    if len(set(bound.values())) > 1:
        named = ", ".join(f"{flag}={address}" for flag, address in bound.items())
        raise click.UsageError(f"turnout binds every front end to one address; these differ: {named}")
    if not bound:
        return
    address = next(iter(bound.values()))
    host_given = click.get_current_context().get_parameter_source("host") is not ParameterSource.DEFAULT
    if host_given and flags["host"] != address:
        raise click.UsageError(f"--host={flags['host']} and the front end address {address} differ")
    flags["host"] = address


def _sidecar_tls_arguments(flags: dict[str, Any]) -> list[str]:
    """`turnout up` with TLS to its sidecars: they serve --sidecar-ssl-cert and want it back
    from the gateway, signed by --sidecar-ssl-root-cert (mutual TLS under one root). So the
    certificate must name 127.0.0.1, where the sidecars listen, and may serve as a client's."""
    if not any(flags.get(f) for f in ("sidecar_use_ssl", "sidecar_ssl_root_cert", "sidecar_ssl_cert")):
        return []
    root, cert, key = flags["sidecar_ssl_root_cert"], flags["sidecar_ssl_cert"], flags["sidecar_ssl_key"]
    if not (root and cert and key):
        raise click.UsageError(
            "turnout up with TLS to its sidecars needs --sidecar-ssl-root-cert, --sidecar-ssl-cert "
            "and --sidecar-ssl-key"
        )
    return [
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={cert}",
        f"--grpc-server-key={key}",
        f"--grpc-root-cert={root}",
    ]


def _bls_gateway_arguments(model_repositories: Sequence[str], flags: dict[str, Any], config_name: str) -> list[str]:
    """Where python models' BLS requests go: this gateway's gRPC port, on loopback. Only a
    repository with python models needs it; --grpc-port=0 then picks the free port here,
    since the sidecars start before the gateway binds it. Over TLS, BLS trusts
    --grpc-root-cert (else the server certificate itself, which must then be self-signed)
    and, under mutual TLS, presents the gateway's own certificate: it is BLS's client."""
    from turnout.scan import models_in

    if not flags["allow_grpc"]:
        return []
    found = models_in(model_repositories, config_name).values()
    if not any(model.framework == "python" for model in found):
        return []
    host = flags["host"]
    loopback = "::1" if ":" in host else "127.0.0.1"
    if flags["grpc_port"] == 0:
        # Not a port the kernel picks: a sidecar binding port 0 could be given it too.
        flags["grpc_port"] = quiet_port(host)
    address = join_host_port(loopback, flags["grpc_port"])
    arguments = [f"--backend-config=gateway={address}"]
    if not (flags.get("grpc_use_ssl") or flags.get("grpc_use_ssl_mutual")):
        return arguments
    root, cert, key = (flags.get(name) or "" for name in ("grpc_root_cert", "grpc_server_cert", "grpc_server_key"))
    if root or cert:  # without either the gateway refuses its flags before it serves
        arguments.append(f"--backend-config=gateway-root-cert={os.path.abspath(root or cert)}")
    if flags.get("grpc_use_ssl_mutual") and cert and key:
        arguments.append(f"--backend-config=gateway-cert={os.path.abspath(cert)}")
        arguments.append(f"--backend-config=gateway-key={os.path.abspath(key)}")
    return arguments


@click.group(context_settings={"auto_envvar_prefix": "TURNOUT", "help_option_names": HELP_OPTIONS})
@click.version_option(package_name="turnout")
def cli() -> None:
    """A Triton-compatible inference gateway with one sidecar process per framework."""


@cli.command()
@model_repository_option("TURNOUT_UP_MODEL_REPOSITORY", must_exist=True)
@click.option(
    "--load-model",
    "load_models",
    envvar="TURNOUT_UP_LOAD_MODEL",
    multiple=True,
    help="Model to load at start in explicit mode; '*' = all.",
)
@shared("exit_on_error", "repository_poll_secs", "disable_auto_complete_config")
@click.option(
    "--backend-config",
    "backend_configs",
    envvar="TURNOUT_UP_BACKEND_CONFIG",
    multiple=True,
    help="e.g. default-max-batch-size=4",
)
@click.option(
    "--model-config-name",
    default="",
    help="Triton's: a model's configs/<name>.pbtxt configures it instead of its config.pbtxt, where it has one.",
)
@_triton_options
@_gateway_options
def up(
    model_repositories: tuple[str, ...],
    load_models: tuple[str, ...],
    exit_on_error: bool,
    repository_poll_secs: float,
    disable_auto_complete_config: bool,
    backend_configs: tuple[str, ...],
    model_config_name: str,
    **flags: Any,
) -> None:
    """Serve a model repository: the gateway plus one sidecar per framework it needs."""
    from protos.logs import LogSettings
    from turnout.supervisor import Supervisor

    _warn_triton_no_ops(flags)
    if flags.pop("strict_model_config"):
        disable_auto_complete_config = True

    arguments = _sidecar_arguments(
        model_repositories=model_repositories,
        model_control_mode=flags["model_control_mode"],
        exit_on_error=exit_on_error,
        strict_readiness=flags["strict_readiness"],
        repository_poll_secs=repository_poll_secs,
        disable_auto_complete_config=disable_auto_complete_config,
        backend_configs=backend_configs,
        exit_timeout_secs=flags["exit_timeout_secs"],
        log_verbose=flags["log_verbose"],
        event_loop=flags["event_loop"],
        log_info=flags["log_info"],
        log_warning=flags["log_warning"],
        log_error=flags["log_error"],
        log_format=flags["log_format"],
        log_file=flags["log_file"],
    )
    if model_config_name:
        arguments.append(f"--model-config-name={model_config_name}")
    arguments += _sidecar_tls_arguments(flags)
    _check_ports(flags)
    arguments += _bls_gateway_arguments(model_repositories, flags, model_config_name)
    logs = LogSettings(
        log_file=flags["log_file"],
        log_info=flags["log_info"],
        log_warning=flags["log_warning"],
        log_error=flags["log_error"],
        log_verbose_level=flags["log_verbose"],
        log_format=flags["log_format"],
    )
    supervisor = Supervisor(
        model_repositories,
        arguments,
        load_models=load_models,
        model_config_name=model_config_name,
        exit_timeout_secs=flags["exit_timeout_secs"],
        logs=logs,
    )
    sys.exit(supervisor.run(lambda sidecars: _gateway_settings(sidecars, exit_on_error=exit_on_error, **flags)))


@cli.command()
@click.option(
    "--sidecar",
    "sidecars",
    envvar="TURNOUT_GATEWAY_SIDECAR",
    multiple=True,
    help="FRAMEWORK=HOST:PORT[,LANE[,METRICS]] of a sidecar to route to (repeatable); LANE is its infer lane "
    "('' for none), METRICS the host:port of its /metrics.",
)
@click.option(
    "--consul",
    default="",
    help="HOST:PORT (or http[s]://HOST:PORT) of a Consul agent's HTTP API: discover sidecars there.",
)
@click.option("--consul-service", default="turnout-sidecar", show_default=True, help="Service the sidecars register.")
@click.option(
    "--routing-kv-prefix",
    default="turnout/routing/",
    show_default=True,
    help="Consul KV prefix watched for routing policies (one JSON value per model).",
)
@shared(*CONSUL_FLAGS)
@_gateway_options
def gateway(sidecars: tuple[str, ...], **flags: Any) -> None:
    """Run the gateway alone, routing to sidecars that already run (--sidecar) or that
    Consul lists (--consul)."""
    from gateway.app import run

    if not sidecars and not flags["consul"]:
        raise click.UsageError("give --sidecar (repeatable) or --consul")
    addresses = []
    for spec in sidecars:
        framework, sep, rest = spec.partition("=")
        address, _, extra = rest.partition(",")
        lane, _, metrics = extra.partition(",")
        if not sep or not address:
            raise click.BadParameter(f"expected FRAMEWORK=HOST:PORT[,LANE], got {spec!r}", param_hint="--sidecar")
        addresses.append(SidecarAddress(framework, address, lane, metrics))
    access = consul_access(flags)
    sys.exit(run(_gateway_settings(tuple(addresses), consul_access=access, **flags)))


@cli.command(add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def sidecar(ctx: click.Context) -> None:
    """Run one framework sidecar (see `turnout sidecar --help`)."""
    # The sidecar is its own program; exec it so it owns its signals and its pid.
    os.execv(sys.executable, [sys.executable, "-m", "sidecars", *ctx.args])


@cli.command(add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Measure a Triton-protocol server under load (see `turnout bench --help`)."""
    # The load tool is a client with its own dependencies (tritonclient[all]); it is
    # imported only when asked for, so a server-only install runs everything else.
    from bench.loadgen.command import bench as command

    command.main(args=ctx.args, prog_name="turnout bench", auto_envvar_prefix="TURNOUT_BENCH")


def main() -> None:
    cli(prog_name="turnout")  # also under `python -m turnout`
