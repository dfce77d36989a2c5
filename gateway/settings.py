"""The gateway's settings: one frozen value built by the CLI, passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.tracing.config import TraceConfig
from protos.consul_access import ConsulAccess


@dataclass(frozen=True)
class SidecarAddress:
    """A sidecar the gateway routes to: its framework and gRPC address (host:port)."""

    framework: str
    address: str
    lane: str = ""  # the sidecar's infer lane (protos.lane: "unix:/path" or host:port); "" = ModelInfer over gRPC
    metrics: str = ""  # the sidecar's /metrics (host:port); "" = render its ModelStatistics instead


@dataclass(frozen=True)
class WorkerPlace:
    """One worker of a gateway run with --gateway-workers (gateway.workers): its index,
    its control socket, and its siblings'."""

    index: int
    control: str
    siblings: tuple[str, ...]


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"  # none | explicit | poll
    # The models the sidecars loaded at start only as the steps of a --load-model ensemble.
    startup_steps: tuple[str, ...] = ()
    strict_readiness: bool = True
    # Fail the start when a loaded ensemble's steps cannot run (turnout up's --exit-on-error).
    exit_on_error: bool = False
    allow_client_shm: bool = False
    exit_timeout_secs: float = 30.0
    event_loop: str = "auto"  # auto | asyncio | uvloop (protos.event_loop)
    # Processes serving the same ports (gateway.workers); `worker` is set in each of them.
    workers: int = 1
    worker: WorkerPlace | None = None
    http_max_input_size: int = 64 * 2**20
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""  # lines go to this file instead of the console (Triton's --log-file)
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config, the trace API's start values
    sidecars: tuple[SidecarAddress, ...] = field(default_factory=tuple)
    # The fleet: discover sidecars in Consul (HOST:PORT of an agent's HTTP API) instead of `sidecars`.
    consul: str = ""
    consul_service: str = "turnout-sidecar"
    consul_access: ConsulAccess = field(default_factory=ConsulAccess)  # token, TLS, datacenter
    routing_file: str = ""  # YAML routing policies (gateway.routing.policy_sources)
    routing_kv_prefix: str = "turnout/routing/"  # Consul KV prefix watched for policies, with `consul`
    routing_seed: int | None = None  # seeds the weighted draws and replica picks; None = from the OS
    # Restricted APIs (gateway.restrictions): Triton's `<api>[,<api>...]:<key>=<value>` specs.
    http_restricted_api: tuple[str, ...] = ()
    # Requests in flight per sidecar replica beyond which the gateway refuses at once; 0 = no limit.
    sidecar_max_inflight: int = 1024
    # Requests of one gRPC stream read and not yet answered, beyond which the stream waits; 0 = no limit.
    grpc_stream_max_inflight: int = 1024
    # The gRPC transport, as Triton's flags of the same names set it (milliseconds; a
    # connection age of 0 is none), and the compression of infer responses.
    grpc_keepalive_time: int = 7200000
    grpc_keepalive_timeout: int = 20000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300000
    grpc_http2_max_ping_strikes: int = 2
    grpc_max_connection_age: int = 0
    grpc_max_connection_age_grace: int = 0
    grpc_infer_response_compression_level: str = "none"  # none, low, medium or high
    # Triton's header forwarding: request headers / gRPC metadata whose names match become
    # string parameters of an inference request ("" = none; gateway.header_forward).
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # TLS. gRPC as Triton's --grpc-use-ssl* (PEM file paths); HTTPS, which Triton lacks, through uvicorn.
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False  # also require a client certificate signed by grpc_root_cert
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    http_ssl_certfile: str = ""
    http_ssl_keyfile: str = ""
    # TLS to the sidecars, gRPC and lane alike (gateway.upstream.SidecarTls): for every
    # --sidecar with sidecar_use_ssl; under Consul, for those whose registration says TLS.
    sidecar_use_ssl: bool = False
    sidecar_ssl_root_cert: str = ""  # CAs that sign sidecar certificates; "" = the system's
    sidecar_ssl_cert: str = ""  # our certificate (chain), for sidecars that want mutual TLS
    sidecar_ssl_key: str = ""
    sidecar_ssl_server_name: str = ""  # the name sidecar certificates hold; "" = each sidecar's host
    grpc_restricted_protocol: tuple[str, ...] = ()
