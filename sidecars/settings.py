"""The sidecar's settings: one frozen value built by the CLI and passed down explicitly."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protos.consul_access import ConsulAccess


class ControlMode(enum.Enum):
    """How models get loaded: all at start, on request, or by rescanning the repository."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


@dataclass(frozen=True)
class SidecarSettings:
    framework: str
    model_repositories: tuple[str, ...]  # local folders and s3:// / gs:// URLs
    host: str = "127.0.0.1"
    port: int = 0
    model_control_mode: ControlMode = ControlMode.NONE
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    exit_on_error: bool = True
    strict_readiness: bool = True
    auto_complete_config: bool = True
    model_config_name: str = ""  # Triton's: configs/<name>.pbtxt instead of config.pbtxt where a model has it
    # List and load (so refuse, with the reason) model folders no turnout framework
    # claims: `python` or unknown backends, no model file. `turnout up` asks one sidecar.
    report_unassigned: bool = True
    default_max_batch_size: int = 4
    backend_config: tuple[tuple[str, str], ...] = ()
    exit_timeout_secs: float = 30.0
    event_loop: str = "auto"  # auto | asyncio | uvloop (protos.event_loop)
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"  # default | ISO8601 | json (protos.logs)
    log_file: str = ""  # lines go to this file instead of the console (Triton's --log-file)
    metrics_port: int = 0  # this sidecar's /metrics; 0 binds a free port (on the ready line)
    allow_metrics: bool = True
    lane: str = "auto"  # infer lane: auto (Unix socket on loopback, else TCP) | unix | tcp | off
    lane_port: int = 0
    lane_path: str = ""  # Unix lane socket path; "" = a private temporary folder (a supervisor fixes it to restart us)
    # Fleet registration (sidecars.registration); "" = do not register.
    consul: str = ""  # HOST:PORT of the local Consul agent's HTTP API
    consul_service: str = "turnout-sidecar"
    consul_access: ConsulAccess = field(default_factory=ConsulAccess)  # token, TLS, datacenter
    advertise_address: str = ""  # how others reach us; "" = the bound host (or the route to Consul)
    device: str = "cpu"  # advertised in the registration's meta
    consul_check_interval: str = "1s"
    consul_deregister_after: str = "1m"  # Consul drops an entry critical this long (its minimum is 1m)
    # TLS on the gRPC port and the infer lane, named as the gateway's --grpc-use-ssl* (PEM file paths).
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False  # also require a client certificate signed by grpc_root_cert
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    # Serve on a non-loopback host without mutual TLS: anyone who reaches it may infer.
    allow_unauthenticated_network: bool = False
