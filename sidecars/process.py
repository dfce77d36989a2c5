"""The sidecar process: builds the object graph from settings, serves, and shuts down
in one ordered sequence on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import ssl
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from protos import event_loop
from protos.lane import LaneServer
from protos.logs import LogSettings
from protos.memory import keep_freed_memory
from protos.ready import SIDECAR_READY, ready_line
from protos.remote import is_remote
from protos.rpc import MESSAGE_SIZE_OPTIONS, server_credentials
from protos.triton_metrics import MetricsEndpoint, on_loop
from sidecars.metrics import SidecarMetrics
from sidecars.models import IndexEntry, ModelManager
from sidecars.registration import ConsulRegistration
from sidecars.runtime import Runtime, RuntimeUnavailable, UnavailableRuntime, runtime_for
from sidecars.server import add_services
from sidecars.settings import ControlMode, SidecarSettings

log = logging.getLogger("sidecars")


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a wildcard or a name reaches further)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def network_exposure(settings: SidecarSettings) -> tuple[str, str]:
    """(refusal, warning): whether the sidecar may serve where settings say. On a host other
    machines reach, gRPC and the infer lane both run inferences, past every restriction the
    gateway enforces, so they need mutual TLS: only holders of a certificate our root signed
    (gateways) get in. --allow-unauthenticated-network turns the refusal into a warning."""
    if is_loopback(settings.host) or settings.grpc_use_ssl_mutual:
        return "", ""
    risk = (
        f"on {settings.host} without mutual TLS, any host that reaches this sidecar can run inferences "
        "past the gateway's restricted APIs"
    )
    if settings.allow_unauthenticated_network:
        return "", f"INSECURE: {risk} (--allow-unauthenticated-network)"
    return (
        f"refusing to serve: {risk}. Give --grpc-use-ssl-mutual=true with --grpc-server-cert, --grpc-server-key "
        "and --grpc-root-cert (docs/deploy.md, 'Lane security'), bind --host=127.0.0.1, or accept the risk "
        "with --allow-unauthenticated-network=true"
    ), ""


@dataclass(frozen=True)
class _Tls:
    """--grpc-use-ssl[-mutual]: the gRPC port's credentials and the lane's context, from one
    certificate; with mutual TLS both want a client certificate signed by --grpc-root-cert."""

    credentials: grpc.ServerCredentials
    context: ssl.SSLContext


def _read_tls(settings: SidecarSettings) -> _Tls | None:
    """What --grpc-use-ssl* say to serve with (None: plain text); raises OSError (ssl.SSLError
    included) for certificate files that cannot be used."""
    if not settings.grpc_use_ssl:
        return None
    mutual = settings.grpc_use_ssl_mutual
    credentials = server_credentials(
        settings.grpc_server_cert, settings.grpc_server_key, settings.grpc_root_cert, mutual
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(settings.grpc_server_cert, settings.grpc_server_key)
    if mutual:
        context.load_verify_locations(settings.grpc_root_cert)
        context.verify_mode = ssl.CERT_REQUIRED
    return _Tls(credentials, context)


async def _start_lane(lane: LaneServer, settings: SidecarSettings, tls: _Tls | None) -> tuple[str, str | None]:
    """Serve the infer lane as settings say; returns its address ("off" if none) and the
    Unix socket's folder, to remove at exit. With TLS on, the lane is TLS too, a Unix one
    included: the gateway then trusts one certificate for the whole hop."""
    mode = settings.lane
    context = tls.context if tls is not None else None
    if mode == "auto":
        # A registered sidecar serves gateways on other hosts, which a Unix socket cannot.
        mode = "unix" if is_loopback(settings.host) and not settings.consul else "tcp"
    if mode == "unix" and settings.lane_path:
        # A path a supervisor chose, so a restarted sidecar keeps its address; the
        # socket a killed predecessor left there is ours to replace.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(settings.lane_path)
        return await lane.start_unix(settings.lane_path, context), None
    if mode == "unix":
        # A private folder: socket paths must stay short (108 bytes) and unguessable.
        folder = tempfile.mkdtemp(prefix="turnout-")
        return await lane.start_unix(os.path.join(folder, "lane.sock"), context), folder
    if mode == "tcp":
        return await lane.start_tcp(settings.host, settings.lane_port, context), None
    return "off", None


def _runtime(settings: SidecarSettings) -> Runtime | None:
    """The framework's runtime. Where this machine cannot run it: with --exit-on-error,
    None after one error line (the sidecar refuses to start); without, a stand-in that
    lists the framework's models as UNAVAILABLE with the reason. Options it refuses: None
    after one error line."""
    try:
        return runtime_for(settings.framework, settings.backend_config)
    except ValueError as exc:  # backend-config options that contradict each other
        log.error("%s", exc)
        return None
    except RuntimeUnavailable as exc:
        if settings.exit_on_error:
            log.error("%s", exc)
            return None
        log.warning("%s; its models stay UNAVAILABLE", exc)
        return UnavailableRuntime(str(exc))


async def serve(settings: SidecarSettings) -> int:
    """Run until a stop signal; the exit status is 1 when a start-up load failed under
    --exit-on-error, else 0."""
    refusal, warning = network_exposure(settings)
    if refusal:
        log.error("%s", refusal)
        return 1
    if warning:
        log.warning("%s", warning)
    try:
        tls = _read_tls(settings)
    except OSError as exc:
        log.error("cannot serve TLS: %s", exc)
        return 1
    for problem in _unusable_repositories(settings):
        log.error("%s", problem)
        return 1
    runtime = _runtime(settings)
    if runtime is None:
        return 1
    manager = ModelManager(settings, runtime)
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    service = add_services(server, manager, LogSettings.of(settings))
    address = f"{settings.host}:{settings.port}"
    port = server.add_secure_port(address, tls.credentials) if tls else server.add_insecure_port(address)
    await server.start()

    failures = await manager.start()
    log.info("\n%s", model_table(manager.entries(ready_only=False)))  # Triton logs the same table
    if failures and settings.exit_on_error:
        log.error("exiting: %d model(s) failed to load and --exit-on-error is set", len(failures))
        manager.exiting = True
        await server.stop(0)
        await manager.close()
        return 1
    # The lane opens only once the start-up loads are done: a restarted sidecar that took
    # inferences earlier would answer NOT_FOUND, where a refused connection tells the
    # gateway to retry or fail over.
    lane = LaneServer(service.infer_encoded, stream_handler=service.stream_encoded)
    lane_address, lane_folder = await _start_lane(lane, settings, tls)

    # Only this coroutine, on the main thread's loop, installs signal handlers.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    metrics: MetricsEndpoint | None = None
    metrics_address = "off"
    if settings.allow_metrics:
        render = on_loop(SidecarMetrics(manager).render, loop)
        metrics = MetricsEndpoint(settings.host, settings.metrics_port, render)
        metrics_address = f"{settings.host}:{metrics.port}"
    ready = ready_line(
        SIDECAR_READY,
        grpc=f"{settings.host}:{port}",
        lane=lane_address,
        framework=settings.framework,
        metrics=metrics_address,
    )
    print(ready, flush=True)
    registration, registering = _start_registration(settings, manager, port, lane_address, metrics)
    poller = None
    if settings.model_control_mode is ControlMode.POLL:
        poller = asyncio.create_task(manager.poll_forever())
    await stop.wait()

    # Shutdown: report not ready -> stop accepting and drain in-flight RPCs within the
    # grace period -> release the models.
    log.info("stopping: draining for up to %.0f s", settings.exit_timeout_secs)
    manager.exiting = True
    if registration is not None and registering is not None:
        # Leave the fleet first, so gateways stop sending here while we drain.
        registering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registering
        await registration.deregister()
        await registration.close()
    if poller is not None:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    lane.stop_accepting()
    await asyncio.gather(server.stop(settings.exit_timeout_secs), lane.drain(settings.exit_timeout_secs))
    _remove_lane_folder(lane_folder)
    if metrics is not None:
        metrics.close()
    try:
        await asyncio.wait_for(manager.close(), settings.exit_timeout_secs)
    except TimeoutError:
        log.warning("models did not release within the exit timeout")
    return 0


def _unusable_repositories(settings: SidecarSettings) -> list[str]:
    """Triton's refusal to start on a local repository that is not a folder."""
    problems = []
    for root in settings.model_repositories:
        if is_remote(root):
            continue
        if not os.path.exists(root):
            problems.append(f"failed to stat file {root}")
        elif not os.path.isdir(root):
            problems.append(f"repository path is not a valid directory: {root}")
    return problems


def _start_registration(
    settings: SidecarSettings, manager: ModelManager, port: int, lane_address: str, metrics: MetricsEndpoint | None
) -> tuple[ConsulRegistration | None, asyncio.Task[None] | None]:
    """With --consul: register in the background (serving never waits on Consul)."""
    if not settings.consul:
        return None, None
    # Only a TCP lane is of use to a gateway elsewhere; a Unix one is not advertised.
    tcp_lane = lane_address not in ("off", "") and not lane_address.startswith("unix:")
    lane_port = int(lane_address.rpartition(":")[2]) if tcp_lane else 0
    metrics_port = metrics.port if metrics is not None else 0
    registration = ConsulRegistration(settings, manager, port, lane_port, metrics_port)
    return registration, asyncio.create_task(registration.run())


def _remove_lane_folder(folder: str | None) -> None:
    if folder is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, "lane.sock"))
            os.rmdir(folder)


def run(settings: SidecarSettings) -> int:
    logging.basicConfig(stream=sys.stderr)
    LogSettings.of(settings).apply()
    keep_freed_memory()
    return event_loop.run(serve(settings), settings.event_loop)


def model_table(entries: Sequence[IndexEntry]) -> str:
    """The models this sidecar tried to load and their states, as Triton's start-up table."""
    rows = [("Model", "Version", "Status")]
    rows += [(e.name, e.version, f"{e.state}: {e.reason}" if e.reason else e.state) for e in entries if e.state]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for number, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if number == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)
