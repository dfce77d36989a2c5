"""The sidecar's entry in Consul: registration with its address, meta (framework, device,
lane and metrics addresses, whether it speaks TLS, READY and failed models and versions) and a gRPC
health check, kept current on load and unload, and removed on graceful shutdown. Consul
being away never stops the sidecar serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import ssl
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from protos.consul_access import host_port, refused
from protos.ready import join_host_port
from sidecars.models import ModelManager
from sidecars.server import FLEET_HEALTH_SERVICE
from sidecars.settings import SidecarSettings

log = logging.getLogger(__name__)

REFRESH_SECS = 10.0  # re-register this often anyway: a restarted agent forgets us
META_VALUE_LIMIT = 512  # Consul's limit on one meta value
_WILDCARD = ("0.0.0.0", "::", "")


class ConsulUnreachable(Exception):
    pass


class ConsulDenied(ConsulUnreachable):
    """The agent's ACLs refused the request (HTTP 403): its message is the whole story."""


def models_meta(manager: ModelManager) -> dict[str, str]:
    """`models: "name:1,2;other:1"`, the READY versions, and `failed` alike, the versions
    whose load failed (`name:` when it failed before any version), so gateways count a
    model every replica failed against their readiness; each split over `models_0`,
    `models_1`, ... when longer than one meta value may be."""
    ready = {name: [v.version_text for v in manager.ready_versions(name)] for name in manager.model_names()}
    meta = _listing("models", {name: versions for name, versions in ready.items() if versions})
    failed = manager.failed_versions()
    if failed:
        meta.update(_listing("failed", failed))
    return meta


def _listing(key: str, models: dict[str, list[str]]) -> dict[str, str]:
    text = ";".join(f"{name}:{','.join(versions)}" for name, versions in models.items())
    if len(text) <= META_VALUE_LIMIT:
        return {key: text}
    chunks = [text[i : i + META_VALUE_LIMIT] for i in range(0, len(text), META_VALUE_LIMIT)]
    return {f"{key}_{i}": chunk for i, chunk in enumerate(chunks)}


def advertised_host(settings: SidecarSettings) -> str:
    """The address others reach us at: --advertise-address, else the bound host, else
    (bound to a wildcard) the local address of the route to the Consul agent."""
    if settings.advertise_address:
        return settings.advertise_address
    if settings.host not in _WILDCARD:
        return settings.host
    consul_host = host_port(settings.consul).rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((consul_host, 9))  # UDP connect sends nothing; it only picks the route
        host = str(probe.getsockname()[0])
    if ipaddress.ip_address(host).is_loopback:
        log.warning(
            "bound to %s but advertising %s to Consul (the route to the agent at %s is loopback): "
            "gateways on other hosts cannot reach this sidecar; give --advertise-address",
            settings.host,
            host,
            consul_host,
        )
    return host


class ConsulRegistration:
    """Registers one sidecar with the local Consul agent and keeps the entry current."""

    def __init__(
        self, settings: SidecarSettings, manager: ModelManager, grpc_port: int, lane_port: int, metrics_port: int = 0
    ) -> None:
        """`lane_port`, `metrics_port`: the TCP infer lane's and /metrics' ports, 0 when
        there is none to advertise (meta `lane` and `metrics`, each `host:port`)."""
        self._settings = settings
        self._manager = manager
        self.host = advertised_host(settings)
        self.port = grpc_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._lane = f"{host}:{lane_port}" if lane_port else ""
        self._metrics = f"{host}:{metrics_port}" if metrics_port else ""
        self.service_id = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{settings.consul_service}-{self.host}-{grpc_port}")
        # Raises ConsulAccessError where a token file or TLS file cannot be read.
        self._http = settings.consul_access.client(settings.consul, timeout=5.0)
        # httpx logs every request at INFO; a registration or watch round is not news.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    def definition(self) -> dict[str, Any]:
        meta = {"framework": self._settings.framework, "device": self._settings.device}
        if self._settings.grpc_use_ssl:
            # Gateways connect with TLS, to gRPC and the lane alike, only where this says so.
            meta["tls"] = "true"
        if self._lane:
            meta["lane"] = self._lane
        if self._metrics:
            # Prometheus (compose/prometheus.yml) and the gateway's fleet scrape read it.
            meta["metrics"] = self._metrics
            meta["metrics_port"] = self._metrics.rpartition(":")[2]
        meta.update(models_meta(self._manager))
        target = join_host_port(self.host, self.port)
        check: dict[str, Any] = {
            "CheckID": f"{self.service_id}-health",
            "Name": "sidecar gRPC health",
            "GRPC": f"{target}/{FLEET_HEALTH_SERVICE}",
            "Interval": self._settings.consul_check_interval,
            "Timeout": self._settings.consul_check_interval,
            # Consul runs the first check only after an interval; start from what we know.
            "Status": "critical" if self._manager.exiting else "passing",
            "DeregisterCriticalServiceAfter": self._settings.consul_deregister_after,
        }
        if self._settings.grpc_use_ssl:
            # The check asks whether we serve, not who we are (gateways verify that), so the
            # agent need not trust our CA; with mutual TLS it must present a certificate
            # our root signed (its own TLS settings).
            check.update(GRPCUseTLS=True, TLSSkipVerify=True)
        return {
            "ID": self.service_id,
            "Name": self._settings.consul_service,
            "Address": self.host,
            "Port": self.port,
            "Tags": [self._settings.framework],
            "Meta": meta,
            "Check": check,
        }

    async def _put(self, path: str, what: str, body: dict[str, Any] | None = None) -> None:
        try:
            response = await self._http.put(path, json=body)
        except (httpx.HTTPError, ssl.SSLError) as exc:  # a refused client certificate shows after the handshake
            raise ConsulUnreachable(f"{exc!r}") from exc
        if response.status_code == 403:
            raise ConsulDenied(refused(self._settings.consul, what, response.text))
        if response.status_code != 200:
            raise ConsulUnreachable(f"HTTP {response.status_code}: {response.text.strip()}")

    async def register(self) -> None:
        what = f"registering service '{self._settings.consul_service}'"
        await self._put("/v1/agent/service/register", what, self.definition())

    async def run(self) -> None:
        """Register (retrying with backoff until Consul answers), then re-register on every
        change of the READY set and every REFRESH_SECS. Runs until cancelled."""

        def say_retrying(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            wait = state.next_action.sleep if state.next_action else 0.0
            if isinstance(error, ConsulDenied):
                # A token problem: say exactly that on every attempt, not "unreachable".
                log.error("%s (attempt %d; retrying in %.1f s)", error, state.attempt_number, wait)
                return
            log.warning(
                "consul at %s unreachable (attempt %d): %s; retrying in %.1f s",
                self._settings.consul,
                state.attempt_number,
                error,
                wait,
            )

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(ConsulUnreachable),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            before_sleep=say_retrying,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self.register()
        log.info(
            "registered with consul at %s as %s (%s:%d)", self._settings.consul, self.service_id, self.host, self.port
        )
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._manager.changed.wait(), REFRESH_SECS)
            self._manager.changed.clear()
            try:
                await self.register()
            except ConsulDenied as exc:
                log.error("could not update the registration: %s", exc)
            except ConsulUnreachable as exc:
                log.warning("consul at %s: could not update the registration: %s", self._settings.consul, exc)

    async def deregister(self) -> None:
        """Remove our entry; a Consul that does not answer is logged, not waited for."""
        try:
            await self._put(f"/v1/agent/service/deregister/{self.service_id}", f"deregistering '{self.service_id}'")
        except ConsulUnreachable as exc:
            log.warning("consul at %s: could not deregister: %s", self._settings.consul, exc)
        else:
            log.info("deregistered %s from consul", self.service_id)

    async def close(self) -> None:
        await self._http.aclose()
