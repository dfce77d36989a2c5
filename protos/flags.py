"""Command-line rules both programs share: Triton's boolean flags, what a
`--model-repository` value may be, and a `--log-file` that can be written."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import click

from protos.consul_access import ConsulAccess, ConsulAccessError
from protos.remote import RemoteError, check_extra, is_remote, parse_location

# Triton spells booleans `--flag=true|false`; a bare `--flag` means true. Pass as
# `click.option("--name", default=..., **TRITON_BOOL)`.
TRITON_BOOL: dict[str, Any] = {"type": click.BOOL, "is_flag": False, "flag_value": True, "show_default": True}
# `-h` as well as `--help`, on every command.
HELP_OPTIONS = ["-h", "--help"]

RepositoryCallback = Callable[[click.Context, click.Parameter, tuple[str, ...]], tuple[str, ...]]


def model_repositories(*, must_exist: bool) -> RepositoryCallback:
    """A click callback for `--model-repository` values: a folder (which must exist when
    `must_exist`; a sidecar reports a missing one itself, as Triton does) or an s3:// or
    gs:// URL that parses and whose filesystem is installed."""
    folder = click.Path(exists=must_exist, file_okay=False)

    def check(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not is_remote(value):
                folder.convert(value, param, ctx)
                continue
            try:
                check_extra(parse_location(value))
            except RemoteError as exc:
                raise click.BadParameter(str(exc), ctx, param) from exc
        return values

    return check


def model_repository_option(envvar: str, *, must_exist: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--model-repository` (Triton's `--model-store` too), repeatable, as both commands
    take it: the values land in `model_repositories`, checked by `model_repositories`."""
    return click.option(
        "--model-repository",
        "--model-store",
        "model_repositories",
        envvar=envvar,
        multiple=True,
        required=True,
        callback=model_repositories(must_exist=must_exist),
        help="Triton model repository: a folder, s3://[host:port/]bucket/path or gs://bucket/path "
        "(repeatable; a model name may appear in only one).",
    )


def _writable(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value:
        try:
            with open(value, "a"):
                pass
        except OSError as exc:
            raise click.BadParameter(f"cannot write to '{value}': {exc.strerror}", ctx, param) from None
    return value


def log_file_option(envvar: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--log-file`, as every command takes it: checked for writing before anything starts."""
    return click.option(
        "--log-file",
        default="",
        envvar=envvar,
        callback=_writable,
        help="write log lines to this file instead of the console",
    )


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _consul_bool(value: str) -> str:
    # Consul reads CONSUL_HTTP_SSL with Go's strconv.ParseBool.
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return "https"
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return "http"
    raise click.BadParameter(f"CONSUL_HTTP_SSL must be true or false, got '{value}'")


class ConsulEnvOption(click.Option):
    """An option that, set neither on the command line nor in its TURNOUT_ variable, takes
    Consul's own environment variable, so a host set up for the `consul` CLI needs no more."""

    def __init__(self, *args: Any, consul_env: str, convert: Callable[[str], str] = str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consul_env = consul_env
        self.convert = convert

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        value = super().resolve_envvar_value(ctx)
        if value is None and (fallback := os.environ.get(self.consul_env)):
            value = self.convert(fallback)
        return value


def _consul_option(*names: str, consul_env: str, **kwargs: Any) -> Decorator:
    help_text = kwargs.pop("help")
    kwargs.setdefault("default", "")
    return click.option(
        *names, cls=ConsulEnvOption, consul_env=consul_env, help=f"{help_text} (else ${consul_env})", **kwargs
    )


def _installed_loop(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise click.BadParameter("uvloop is not installed (pip install 'turnout[uvloop]')")
    return value


# The flags `turnout up`, `turnout gateway` and `turnout sidecar` have in common: one
# definition each, so their names, defaults, checks and help read the same everywhere.
_SHARED: dict[str, Callable[[], Decorator]] = {
    "model_control_mode": lambda: click.option(
        "--model-control-mode",
        type=click.Choice(["none", "explicit", "poll"]),
        default="none",
        show_default=True,
        help="load every model at start (none), on request (explicit), or as the repository changes (poll)",
    ),
    "repository_poll_secs": lambda: click.option(
        "--repository-poll-secs",
        type=click.FloatRange(min=0.1),
        default=15.0,
        show_default=True,
        help="poll mode: seconds between repository scans",
    ),
    "exit_on_error": lambda: click.option(
        "--exit-on-error", default=True, help="stop the start when a model fails to load", **TRITON_BOOL
    ),
    "strict_readiness": lambda: click.option(
        "--strict-readiness",
        default=True,
        help="ready only when every model loaded is READY (in a fleet: on at least one replica)",
        **TRITON_BOOL,
    ),
    "disable_auto_complete_config": lambda: click.option(
        "--disable-auto-complete-config",
        is_flag=True,
        default=False,
        help="take configs as they are: no inputs, outputs or batching read from model files",
    ),
    "exit_timeout_secs": lambda: click.option(
        "--exit-timeout-secs",
        type=click.FloatRange(min=0),
        default=30.0,
        show_default=True,
        help="on SIGTERM, how long requests in flight may take to finish",
    ),
    "event_loop": lambda: click.option(
        "--event-loop",
        type=click.Choice(["auto", "asyncio", "uvloop"]),
        default="auto",
        show_default=True,
        callback=_installed_loop,
        help="the event loop: uvloop where installed (auto), or asyncio's own",
    ),
    "log_verbose": lambda: click.option(
        "--log-verbose", type=click.IntRange(min=0), default=0, show_default=True, help="verbose logging level"
    ),
    "log_info": lambda: click.option("--log-info", default=True, **TRITON_BOOL),
    "log_warning": lambda: click.option("--log-warning", default=True, **TRITON_BOOL),
    "log_error": lambda: click.option("--log-error", default=True, **TRITON_BOOL),
    "log_format": lambda: click.option(
        "--log-format", type=click.Choice(["default", "ISO8601", "json"]), default="default", show_default=True
    ),
    "log_file": log_file_option,
    "allow_metrics": lambda: click.option(
        "--allow-metrics", default=True, help="serve Prometheus metrics", **TRITON_BOOL
    ),
    "grpc_use_ssl": lambda: click.option(
        "--grpc-use-ssl", default=False, help="serve gRPC (and a sidecar's infer lane) over TLS", **TRITON_BOOL
    ),
    "grpc_use_ssl_mutual": lambda: click.option(
        "--grpc-use-ssl-mutual", default=False, help="TLS that requires client certificates", **TRITON_BOOL
    ),
    "grpc_server_cert": lambda: click.option("--grpc-server-cert", default="", help="PEM server certificate (chain)"),
    "grpc_server_key": lambda: click.option("--grpc-server-key", default="", help="PEM private key"),
    "grpc_root_cert": lambda: click.option(
        "--grpc-root-cert", default="", help="PEM CA certificates that sign client certificates"
    ),
    "consul_token": lambda: _consul_option(
        "--consul-token", consul_env="CONSUL_HTTP_TOKEN", help="Consul ACL token, sent as X-Consul-Token"
    ),
    "consul_token_file": lambda: _consul_option(
        "--consul-token-file",
        consul_env="CONSUL_HTTP_TOKEN_FILE",
        help="file holding the Consul ACL token; --consul-token wins",
    ),
    "consul_scheme": lambda: _consul_option(
        "--consul-scheme",
        consul_env="CONSUL_HTTP_SSL",
        convert=_consul_bool,
        type=click.Choice(["http", "https"]),
        default="http",
        help="http or https to the Consul agent; an https:// --consul implies https",
    ),
    "consul_ca_cert": lambda: _consul_option(
        "--consul-ca-cert", consul_env="CONSUL_CACERT", help="PEM CA certificates that sign the agent's certificate"
    ),
    "consul_client_cert": lambda: _consul_option(
        "--consul-client-cert", consul_env="CONSUL_CLIENT_CERT", help="PEM client certificate for the agent"
    ),
    "consul_client_key": lambda: _consul_option(
        "--consul-client-key", consul_env="CONSUL_CLIENT_KEY", help="PEM private key of --consul-client-cert"
    ),
    "consul_datacenter": lambda: click.option(
        "--consul-datacenter", default="", help="Consul datacenter to use (default: the agent's own)"
    ),
}
LOG_FLAGS = ("log_verbose", "log_info", "log_warning", "log_error", "log_format", "log_file")
CONSUL_FLAGS = (
    "consul_token",
    "consul_token_file",
    "consul_scheme",
    "consul_ca_cert",
    "consul_client_cert",
    "consul_client_key",
    "consul_datacenter",
)
TLS_FLAGS = ("grpc_use_ssl", "grpc_use_ssl_mutual", "grpc_server_cert", "grpc_server_key", "grpc_root_cert")


def shared_options(*names: str) -> list[Decorator]:
    """The shared flags `names`, as click decorators, in that order."""
    return [_SHARED[name]() for name in names]


def shared(*names: str) -> Decorator:
    """Apply the shared flags `names` to a command, listed in that order in its help."""

    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(shared_options(*names)):
            function = option(function)
        return function

    return apply


def consul_access(flags: dict[str, Any]) -> ConsulAccess:
    """The ConsulAccess the CONSUL_FLAGS in `flags` describe (removed from `flags`)."""
    values = {name: flags.pop(name) for name in CONSUL_FLAGS}
    context = click.get_current_context(silent=True)
    if context is not None and values["consul_token"]:
        # As the consul CLI: a token beats a token file, unless only the file was given
        # on the command line (then the token came from the environment).
        given = click.core.ParameterSource.COMMANDLINE
        if context.get_parameter_source("consul_token_file") == given != context.get_parameter_source("consul_token"):
            values["consul_token"] = ""
    if bool(values["consul_client_cert"]) != bool(values["consul_client_key"]):
        raise click.UsageError("--consul-client-cert and --consul-client-key go together")
    access = ConsulAccess(
        scheme=values["consul_scheme"],
        token=values["consul_token"],
        token_file=values["consul_token_file"],
        ca_cert=values["consul_ca_cert"],
        client_cert=values["consul_client_cert"],
        client_key=values["consul_client_key"],
        datacenter=values["consul_datacenter"],
    )
    try:  # read the token file and TLS files now, so a bad path stops the start
        access.secret()
        if access.ca_cert or access.client_cert:
            access.verify()
    except ConsulAccessError as exc:
        raise click.UsageError(str(exc)) from None
    return access
