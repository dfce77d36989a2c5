"""One inference on its way to a sidecar: the version the routing policy picks, the
replica the balancer picks, and failover to another replica when the first could not
be reached, within the request's deadline.

The request stays in the bytes it arrived in: a chosen version is appended as one more
`model_version` field, which protobuf parsing lets win over any earlier value.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.balancer import Balancer
from gateway.metrics import GatewayMetrics
from gateway.policies import PolicyStore
from gateway.policy import Decision, Reason, VersionChooser
from gateway.registry import ModelRegistry
from gateway.upstream import SidecarClient, SidecarUnreachable
from protos.status import TurnoutError, not_found, unavailable

_MODEL_VERSION_TAG = b"\x12"  # field 2 (model_version), wire type 2 (length-delimited)
DEFAULT_BUDGET_SECS = 30.0  # failover stops here when the client set no deadline


@dataclass(frozen=True)
class RequestContext:
    """What a front end passes beside the request: its headers (HTTP) or metadata (gRPC),
    lower-cased, and the client's deadline on the time.monotonic() clock, if any."""

    headers: Mapping[str, str] = field(default_factory=dict)
    deadline: float | None = None


NO_CONTEXT = RequestContext()


def with_version(encoded: bytes, version: str) -> bytes:
    """`encoded` (a serialized ModelInferRequest) with its model_version set to `version`."""
    data = version.encode()
    length = len(data)
    varint = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        if length:
            varint.append(byte | 0x80)
        else:
            varint.append(byte)
            break
    return encoded + _MODEL_VERSION_TAG + bytes(varint) + data


class Dispatcher:
    """Chooses version and replica for each inference and sends it, failing over."""

    def __init__(
        self,
        registry: ModelRegistry,
        policies: PolicyStore,
        balancer: Balancer,
        metrics: GatewayMetrics,
        rng: random.Random,
    ) -> None:
        self._registry = registry
        self._policies = policies
        self._balancer = balancer
        self._metrics = metrics
        self._chooser = VersionChooser(rng)

    def decide(self, model: str, requested: str, context: RequestContext) -> Decision:
        policy = self._policies.get(model)
        if policy is None and not requested:
            return Decision("", Reason.DEFAULT)
        ready = self._registry.ready_versions(model)
        decision = self._chooser.choose(policy, requested, context.headers, ready)
        # Label only versions the policy or the fleet knows: a client's version text is unbounded.
        known = decision.version in (ready or ()) or (
            policy is not None and any(v == decision.version for v, _ in policy.weights)
        )
        self._metrics.count_route(model, decision, decision.version if known or not decision.version else "other")
        return decision

    async def send(self, model: str, version: str, payload: bytes, context: RequestContext) -> bytes:
        """Send to one replica serving `model` (`version` if given); a replica that could
        not be reached is ejected and the next one tried, until the deadline."""
        candidates = self._registry.replicas(model, version)
        if not candidates:
            await self._registry.find(model)  # an unknown name may be new: look once more
            candidates = self._registry.replicas(model, version)
        if not candidates:
            raise not_found(f"Request for unknown model: '{model}' is not found")
        deadline = context.deadline or time.monotonic() + DEFAULT_BUDGET_SECS
        tried: list[SidecarClient] = []
        while True:
            client = self._balancer.choose(candidates, tried)
            if client is None:
                raise unavailable(f"no replica of model '{model}' could be reached")
            tried.append(client)
            try:
                with self._balancer.track(client):
                    return await client.infer(payload)
            except SidecarUnreachable as exc:
                self._balancer.eject(client, exc.message)
                if time.monotonic() >= deadline or len(tried) >= len(candidates):
                    self._metrics.count_failover(model, "exhausted")
                    raise
                self._metrics.count_failover(model, "retried")

    async def send_shadow(self, model: str, version: str, payload: bytes) -> bytes:
        """One try on one replica of `version`: shadows never fail over or eject."""
        candidates = self._registry.replicas(model, version)
        client = self._balancer.choose(candidates)
        if client is None:
            raise TurnoutError(not_found("").status, f"no replica serves '{model}' version {version}")
        with self._balancer.track(client):
            return await client.infer(with_version(payload, version))
