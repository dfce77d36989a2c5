"""Server readiness: whether this gateway can serve, decided from what discovery already
knows (a probe never waits on a sidecar), with Triton's --strict-readiness rule applied
to the fleet as to one server.

Discovery publishes a FleetHealth with each change; `unready_reasons` reads it. Under
strict readiness every model version the fleet lists must have a ready replica: one
failing replica of two costs nothing, a model that every replica failed (or whose every
replica fails its health check) makes the gateway unready, and says which. `report`
logs those changes and keeps the per-model gauge, so an operator finds the model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

NOT_SYNCED = "discovery has not synced yet (no answer from Consul)"
NO_REPLICA = "no sidecar replica serves"


@dataclass(frozen=True)
class ModelHealth:
    """One model version the fleet lists (version "" for a model that failed before any
    version was tried): how many replicas have it READY, failed to load it, or list it
    while failing their health check."""

    model: str
    version: str
    ready: int = 0
    failed: int = 0
    unhealthy: int = 0

    @property
    def available(self) -> bool:
        return self.ready > 0

    def reason(self) -> str:
        """Why it has no ready replica, in the words the index and the log use."""
        causes = []
        if self.failed:
            causes.append(f"failed to load on {_replicas(self.failed)}")
        if self.unhealthy:
            causes.append(f"listed by {_replicas(self.unhealthy)} failing the health check")
        return "no ready replica: " + ("; ".join(causes) or "none lists it READY")

    def name(self) -> str:
        return f"model '{self.model}'" + (f" version {self.version}" if self.version else "")


@dataclass(frozen=True)
class SidecarHealth:
    """A sidecar the gateway polls itself (no Consul): whether it answered, and whether
    it said it is ready (its own --strict-readiness rule)."""

    framework: str
    address: str
    reachable: bool
    ready: bool


@dataclass(frozen=True)
class FleetHealth:
    """What discovery knows of the fleet at one moment; never mutated.

    `synced`: discovery has had its first answer. `replicas`: replicas that serve
    (passing their check, or reachable). `models`: each model version listed, under
    Consul. `sidecars`: the polled sidecars' own answers, without Consul."""

    synced: bool = False
    replicas: int = 0
    models: Mapping[tuple[str, str], ModelHealth] = field(default_factory=lambda: MappingProxyType({}))
    sidecars: tuple[SidecarHealth, ...] = ()

    def unavailable(self) -> list[ModelHealth]:
        return [health for _, health in sorted(self.models.items()) if not health.available]


def unready_reasons(health: FleetHealth, *, strict: bool, need_replica: bool) -> list[str]:
    """Why the gateway cannot serve now; empty when it is ready. `need_replica`: a fleet
    with no replica serving is unready (Consul discovery); a fixed set of no sidecars
    (`turnout up` on an empty repository) is ready, as Triton with no models."""
    if not health.synced:
        return [NOT_SYNCED]
    reasons = []
    if need_replica and health.replicas == 0:
        reasons.append(NO_REPLICA)
    for sidecar in health.sidecars:
        if not sidecar.reachable and (strict or health.replicas == 0):
            reasons.append(f"the {sidecar.framework} sidecar at {sidecar.address} does not answer")
        elif sidecar.reachable and not sidecar.ready and strict:
            reasons.append(f"the {sidecar.framework} sidecar at {sidecar.address} is not ready")
    if strict:
        reasons += [f"{model.name()}: {model.reason()}" for model in health.unavailable()]
    return reasons


def report(before: FleetHealth, after: FleetHealth, metrics: GatewayMetrics) -> None:
    """Say what changed between two FleetHealth: models that lost their last ready
    replica (a warning with the reason) or got one back, sidecars that stopped or started
    being ready; and keep turnout_gateway_model_ready_replicas current."""
    for key, health in sorted(after.models.items()):
        previous = before.models.get(key)
        was_available = previous is not None and previous.available
        if not health.available and (was_available or previous is None or previous.reason() != health.reason()):
            logger.warning("%s cannot be served: %s", health.name(), health.reason())
        elif health.available and previous is not None and not was_available:
            logger.info("%s is served again (%d ready replicas)", health.name(), health.ready)
        metrics.set_model_ready_replicas(health.model, health.version, health.ready)
    for key, health in before.models.items():
        if key not in after.models:
            metrics.forget_model(health.model, health.version)
    known = {(s.framework, s.address): s for s in before.sidecars}
    for sidecar in after.sidecars:
        last = known.get((sidecar.framework, sidecar.address))
        state = _sidecar_state(sidecar)
        if last is None and state == "ready":
            continue
        if last is None or _sidecar_state(last) != state:
            level = logging.INFO if state == "ready" else logging.WARNING
            logger.log(level, "the %s sidecar at %s %s", sidecar.framework, sidecar.address, _SAYS[state])


_SAYS = {
    "ready": "is ready",
    "not ready": "says it is not ready (a model failed: see the repository index)",
    "unreachable": "does not answer",
}


def _sidecar_state(sidecar: SidecarHealth) -> str:
    if not sidecar.reachable:
        return "unreachable"
    return "ready" if sidecar.ready else "not ready"


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")
