"""The gateway process: its composition root, and its lifecycle from start to drain.

`run(settings)` builds settings -> metrics -> registry -> upstream clients -> Gateway
-> front ends, serves until SIGTERM/SIGINT, then shuts down in order. This module is
the only owner of signals in the gateway process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import socket
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import grpc
import uvicorn
from prometheus_client import CollectorRegistry

from gateway.consul import ConsulClient, ConsulDenied, ConsulUnavailable
from gateway.core import Gateway
from gateway.discovery import ConsulRegistry
from gateway.grpc_front import build_grpc_server
from gateway.grpc_server import Server as GrpcServer
from gateway.http.protocol import HttpProtocol
from gateway.metrics import GatewayMetrics
from gateway.metrics_port import FleetMetrics, MetricsServer
from gateway.registry import ModelRegistry, StaticRegistry
from gateway.restrictions import parse_restrictions
from gateway.routing.dispatch import Dispatcher
from gateway.routing.policy_sources import PolicyStore, read_routing_file, watch_kv
from gateway.routing.replicas import Balancer
from gateway.routing.versions import PolicyError
from gateway.settings import GatewaySettings
from gateway.shm import SharedMemory
from gateway.tracing.tracer import Tracer
from gateway.upstream import SidecarClient, SidecarTls
from gateway.workers import WORKER_READY, Siblings, control_server
from protos import event_loop
from protos.consul_access import ConsulAccessError
from protos.logs import LogSettings
from protos.memory import keep_freed_memory
from protos.ready import GATEWAY_READY, join_host_port, ready_line
from protos.rpc import server_credentials

if TYPE_CHECKING:
    from starlette.types import ASGIApp

logger = logging.getLogger(__name__)

FIRST_DISCOVERY_SECS = 5.0  # how long start-up waits for Consul's first answer


class _HttpServer(uvicorn.Server):
    """uvicorn, minus its signal handlers: `serve` below owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class PortUnavailable(Exception):
    """A front end's port could not be bound; the text names the port and its flag."""


def port_unavailable(what: str, host: str, port: int, flag: str, reason: str) -> PortUnavailable:
    return PortUnavailable(f"cannot serve {what} on {join_host_port(host, port)} ({flag}): {reason}")


def _bind(host: str, port: int, shared: bool = False) -> socket.socket:
    """A listening socket; `shared`: one of a gateway's workers' (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on accepted sockets that do, and
    # without it a response's head and body wait out the peer's delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _build_http_app(gateway: Gateway, settings: GatewaySettings) -> ASGIApp:
    # Imported here: the HTTP front is a separate module, and this one must import without it.
    from gateway.http.front import build_http_app

    app: ASGIApp = build_http_app(gateway, settings)
    return app


def _grpc_credentials(settings: GatewaySettings) -> grpc.ServerCredentials:
    return server_credentials(
        settings.grpc_server_cert, settings.grpc_server_key, settings.grpc_root_cert, settings.grpc_use_ssl_mutual
    )


def _sidecar_tls(settings: GatewaySettings) -> SidecarTls | None:
    """--sidecar-use-ssl and --sidecar-ssl-*: how to reach sidecars over TLS, None for plain."""
    if not settings.sidecar_use_ssl:
        return None
    return SidecarTls(
        settings.sidecar_ssl_root_cert,
        settings.sidecar_ssl_cert,
        settings.sidecar_ssl_key,
        settings.sidecar_ssl_server_name,
    )


async def _consul_denies(consul: ConsulClient, settings: GatewaySettings, deadline: float) -> str | None:
    """Consul's refusal of what the gateway must read, if it refuses by the loop-time
    `deadline`; an agent that does not answer is left to the first discovery wait."""
    prefix = settings.routing_kv_prefix.lstrip("/")
    reads = (
        (f"/v1/health/service/{settings.consul_service}", f"reading service '{settings.consul_service}'"),
        (f"/v1/kv/{prefix}", f"reading key '{prefix}'"),
    )
    try:
        async with asyncio.timeout_at(deadline):
            for path, what in reads:
                await consul.check_read(path, what)
    except ConsulDenied as exc:
        return str(exc)
    except (ConsulUnavailable, TimeoutError):
        pass
    return None


def run(settings: GatewaySettings) -> int:
    """Serve until SIGTERM/SIGINT; return the process exit status. With
    settings.workers > 1, this process keeps that many workers (gateway.workers)."""
    if settings.workers > 1:
        from gateway import workers

        return workers.run(settings)
    keep_freed_memory()
    try:
        return event_loop.run(serve(settings), settings.event_loop)
    except (PortUnavailable, OSError) as exc:
        print(f"turnout gateway: {exc}", file=sys.stderr, flush=True)
        return 1


async def serve(
    settings: GatewaySettings,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[dict[str, str]], None] | None = None,
) -> int:
    """Run the gateway in the current event loop until `stop` is set or a signal arrives.

    `on_ready` receives the bound addresses ({"grpc": "host:port", ...}) once all serve.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError):  # only the main thread may own signals
            loop.add_signal_handler(signum, stop.set)

    logs = LogSettings.of(settings)
    logs.apply()
    metrics_registry = CollectorRegistry()
    metrics = GatewayMetrics(metrics_registry)
    try:
        file_policies = read_routing_file(settings.routing_file) if settings.routing_file else {}
    except PolicyError as exc:
        print(f"turnout gateway: {settings.routing_file}: {exc}", file=sys.stderr, flush=True)
        return 1
    rng = random.Random(settings.routing_seed)
    balancer = Balancer(random.Random(rng.random()), metrics, settings.sidecar_max_inflight)
    try:
        tls = _sidecar_tls(settings)
    except OSError as exc:  # ssl.SSLError included
        print(f"turnout gateway: cannot use the sidecar TLS files: {exc}", file=sys.stderr, flush=True)
        return 1
    clients = [SidecarClient(s.framework, s.address, s.lane, s.metrics, tls) for s in settings.sidecars]
    try:
        consul = ConsulClient(settings.consul, settings.consul_access) if settings.consul else None
    except ConsulAccessError as exc:
        print(f"turnout gateway: {exc}", file=sys.stderr, flush=True)
        return 1
    discovery = ConsulRegistry(consul, settings.consul_service, balancer, metrics, tls) if consul is not None else None
    models: ModelRegistry = discovery if discovery is not None else StaticRegistry(clients, metrics=metrics)

    def known(model: str) -> bool:
        return models.owner(model) is not None

    policies = PolicyStore(file_policies, known=known)
    dispatcher = Dispatcher(models, policies, balancer, metrics, rng)
    shared_memory = SharedMemory(settings.allow_client_shm)
    try:
        tracer = Tracer(settings.trace)
    except ImportError as exc:  # OpenTelemetry mode without the SDK
        print(
            f"turnout gateway: --trace-config mode=opentelemetry needs the OpenTelemetry SDK "
            f"(pip install 'turnout[trace]'): {exc}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    worker = settings.worker
    siblings = Siblings(worker.siblings) if worker is not None else None
    gateway = Gateway(
        settings, models, shared_memory, metrics, tracer=tracer, logs=logs, dispatcher=dispatcher, siblings=siblings
    )
    # The Consul watches run for the gateway's whole life; cancelled in the finally below.
    watches: list[asyncio.Task[None]] = []

    grpc_server: grpc.aio.Server | GrpcServer | None = None
    http_server: _HttpServer | None = None
    http_socket: socket.socket | None = None
    metrics_server: MetricsServer | None = None
    control: grpc.aio.Server | None = None
    # A worker counts only the ensembles it ran: the parent adds its siblings' (gateway.workers).
    ensembles = gateway.ensembles.statistics
    fleet = FleetMetrics(lambda: models.sidecars, ensembles=ensembles if worker is None else tuple)
    try:
        # One start-up allowance for both: the ACL check, then the first answer.
        deadline = asyncio.get_running_loop().time() + FIRST_DISCOVERY_SECS
        if consul is not None and (denied := await _consul_denies(consul, settings, deadline)) is not None:
            logger.error("%s", denied)
            return 1
        watches.append(asyncio.create_task(models.watch()))
        if not await models.wait_first(max(0.0, deadline - asyncio.get_running_loop().time())) and consul:
            # Serve anyway: live, but not ready until Consul answers (the watch keeps
            # asking); once it has answered, its absence is survived on the last fleet.
            logger.error(
                "cannot reach the Consul agent at %s (--consul): no answer in %.0f s; not ready until it answers",
                settings.consul,
                FIRST_DISCOVERY_SECS,
            )
        if consul is not None:
            # After the fleet's first answer, so that KV policies' arms are checked against it.
            watches.append(asyncio.create_task(watch_kv(consul, settings.routing_kv_prefix, policies)))
        await models.refresh()
        unknown = policies.unknown_file_arms(known)
        for reason in unknown:
            logger.error("%s: %s", settings.routing_file, reason)
        if unknown and consul is None:
            # Sidecars named on the command line are all known by now; those of a fleet
            # may still be registering, so there such arms wait (skipped until they serve).
            return 1
        refused = await gateway.refused_ensembles()
        for name, reason in sorted(refused.items()):
            logger.error("ensemble '%s' cannot be served: %s", name, reason)
        if refused and settings.exit_on_error:
            logger.error("exiting: %d ensemble(s) failed to load and --exit-on-error is set", len(refused))
            return 1
        addresses: dict[str, str] = {}

        if settings.allow_http:
            try:
                http_socket = _bind(settings.host, settings.http_port, shared=worker is not None)
            except OSError as exc:
                raise port_unavailable(
                    "HTTP", settings.host, settings.http_port, "--http-port", str(exc.strerror)
                ) from None
            http_port = http_socket.getsockname()[1]
            config = uvicorn.Config(
                _build_http_app(gateway, settings),
                http=HttpProtocol,
                lifespan="off",
                ws="none",
                proxy_headers=False,  # forwarded headers change nothing turnout reads
                server_header=False,  # Triton's answers carry neither
                date_header=False,
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=max(1, round(settings.exit_timeout_secs)),
                ssl_certfile=settings.http_ssl_certfile or None,
                ssl_keyfile=settings.http_ssl_keyfile or None,
            )
            http_server = _HttpServer(config)
            addresses["http"] = join_host_port(settings.host, http_port)

        if settings.allow_grpc:
            grpc_server = build_grpc_server(
                gateway,
                settings,
                parse_restrictions(settings.grpc_restricted_protocol, grpc=True),
                shared=worker is not None,
            )
            grpc_address = join_host_port(settings.host, settings.grpc_port)
            try:
                if settings.grpc_use_ssl:
                    grpc_port = grpc_server.add_secure_port(grpc_address, _grpc_credentials(settings))
                else:
                    grpc_port = grpc_server.add_insecure_port(grpc_address)
            except RuntimeError:  # grpc says only "Failed to bind to address"
                raise port_unavailable(
                    "gRPC", settings.host, settings.grpc_port, "--grpc-port", "address in use or not available"
                ) from None
            await grpc_server.start()
            addresses["grpc"] = join_host_port(settings.host, grpc_port)

        if settings.allow_metrics and worker is not None:
            # The parent serves the metrics port, from every worker's parts (gateway.workers).
            metrics_server = MetricsServer(
                metrics_registry, "127.0.0.1", 0, fleet.render, asyncio.get_running_loop(), own_models=ensembles
            )
            addresses["metrics"] = f"127.0.0.1:{metrics_server.port}"
        elif settings.allow_metrics:
            try:
                metrics_server = MetricsServer(
                    metrics_registry, settings.host, settings.metrics_port, fleet.render, asyncio.get_running_loop()
                )
            except OSError as exc:
                raise port_unavailable(
                    "metrics", settings.host, settings.metrics_port, "--metrics-port", str(exc.strerror)
                ) from None
            addresses["metrics"] = join_host_port(settings.host, metrics_server.port)
        if worker is not None:
            control = control_server(worker.control, gateway.apply_shared, gateway.ensembles.statistics)
            await control.start()

        async with asyncio.TaskGroup() as tasks:
            if http_server is not None and http_socket is not None:
                http_task = tasks.create_task(http_server.serve(sockets=[http_socket]))
                while not http_server.started and not http_task.done():
                    await asyncio.sleep(0.01)
            print(ready_line(GATEWAY_READY if worker is None else WORKER_READY, **addresses), flush=True)
            if on_ready is not None:
                on_ready(addresses)

            await stop.wait()
            await _shutdown(gateway, settings, grpc_server, http_server)
    finally:
        # A start that failed half way leaves a front end to close here (a second stop is a no-op).
        if grpc_server is not None:
            await grpc_server.stop(0)
        if http_socket is not None and (http_server is None or not http_server.started):
            http_socket.close()
        # Close upstreams last: in-flight requests needed them until the drain ended.
        if metrics_server is not None:
            metrics_server.close()
        if control is not None:
            await control.stop(0)
        await gateway.siblings.close()
        await fleet.close()
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await gateway.close()
        # After the drain: the traces of the last requests are written or exported.
        await tracer.close()
        await balancer.close()
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        if discovery is not None:
            await discovery.close()
        if consul is not None:
            await consul.close()
        shared_memory.close()
    return 0


async def _shutdown(
    gateway: Gateway,
    settings: GatewaySettings,
    grpc_server: grpc.aio.Server | GrpcServer | None,
    http_server: _HttpServer | None,
) -> None:
    # 1. Report not ready; new inference requests are refused from here on.
    gateway.start_draining()
    logger.info("draining for up to %.1f s", settings.exit_timeout_secs)
    # 2. Stop accepting and 3. drain in-flight work, both front ends at once, each
    #    within exit_timeout_secs (grpc's grace; uvicorn's timeout_graceful_shutdown).
    if http_server is not None:
        http_server.should_exit = True  # its serve task, held by the TaskGroup, then returns
    if grpc_server is not None:
        await grpc_server.stop(settings.exit_timeout_secs)
