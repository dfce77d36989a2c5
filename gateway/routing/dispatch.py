"""One inference on its way to a sidecar: the version the routing policy picks, the
replica the balancer picks, and failover to another replica when the first could not
be reached, within the request's deadline.

The request stays in the bytes it arrived in: a chosen version is appended as one more
`model_version` field, which protobuf parsing lets win over any earlier value.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.registry import ModelRegistry
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.replicas import Balancer
from gateway.routing.sequences import Pin, SequencePins
from gateway.routing.versions import Decision, Reason, VersionChooser
from gateway.tracing.trace import Trace
from gateway.upstream import SidecarClient, SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import not_found, unavailable
from protos.trace import take_report, trace_parameter
from protos.wire import length_delimited

_MODEL_VERSION_FIELD = pb.ModelInferRequest.MODEL_VERSION_FIELD_NUMBER
DEFAULT_BUDGET_SECS = 30.0  # failover stops here when the client set no deadline


def with_version(encoded: bytes, version: str) -> bytes:
    """`encoded` (a serialized ModelInferRequest) with its model_version set to `version`."""
    return encoded + length_delimited(_MODEL_VERSION_FIELD, version.encode())


class Dispatcher:
    """Chooses version and replica for each inference and sends it, failing over."""

    def __init__(
        self,
        registry: ModelRegistry,
        policies: PolicyStore,
        balancer: Balancer,
        metrics: GatewayMetrics,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` reads deadlines (the front ends' time.monotonic() ones) and times
        sequence pins; tests inject a fake one."""
        self._registry = registry
        self._policies = policies
        self._balancer = balancer
        self._metrics = metrics
        self._chooser = VersionChooser(rng)
        self._clock = clock
        self._pins = SequencePins(clock)

    def decide(self, model: str, requested: str, context: RequestContext) -> Decision:
        if context.sequence is not None:
            return self._decide_sequence(model, requested, context, context.sequence)
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

    def _decide_sequence(
        self, model: str, requested: str, context: RequestContext, sequence: SequenceFlags
    ) -> Decision:
        """A sequence keeps the version its START got; a START is routed like any request,
        but to a definite version (the newest READY one when nothing else chooses) and
        never shadowed, since a shadow would see the sequence's later requests alone."""
        pin = None if sequence.start else self._pins.get(model, sequence)
        if pin is not None:
            decision = Decision(pin.version, Reason.SEQUENCE)
            self._metrics.count_route(model, decision, pin.version or "default")
            return decision
        decision = replace(self.decide(model, requested, replace(context, sequence=None)), shadow="")
        if not decision.version:
            ready = self._registry.ready_versions(model)
            if ready:
                decision = replace(decision, version=max(ready, key=int))
        return decision

    def models_changed(self) -> None:
        """A load or unload went through: cached per-model facts may be stale."""
        self._pins.forget_idle_times()

    async def send(self, model: str, version: str, payload: bytes, context: RequestContext) -> bytes:
        """Send to one replica serving `model` (`version` if given); a replica that could
        not be reached is ejected and the next one tried, until the deadline. A sequence's
        requests after its START go where the START went, with no failover."""
        sequence = context.sequence
        if sequence is not None and not sequence.start:
            pin = self._pins.get(model, sequence)
            if pin is not None:
                if sequence.end:
                    self._pins.end(model, sequence)
                return await self._send_pinned(model, sequence, pin, payload, context)
        candidates = self._registry.replicas(model, version)
        if not candidates:
            await self._registry.find(model)  # an unknown name may be new: look once more
            candidates = self._registry.replicas(model, version)
        if not candidates:
            raise not_found(f"Request for unknown model: '{model}' is not found")
        deadline = context.deadline or self._clock() + DEFAULT_BUDGET_SECS
        tried: list[SidecarClient] = []
        while True:
            client = self._balancer.choose(candidates, tried)
            if client is None:
                raise unavailable(f"no replica of model '{model}' could be reached")
            tried.append(client)
            if sequence is not None and sequence.start and not sequence.end:
                # Before the send: a stream's next requests of this sequence may follow at once.
                self._pins.bind(model, sequence, version, client)
            try:
                with self._balancer.track(client):
                    return await client.infer(payload, _traceparent(context), context.responses)
            except SidecarUnreachable as exc:
                self._balancer.eject(client, exc.message)
                if self._clock() >= deadline or len(tried) >= len(candidates):
                    self._metrics.count_failover(model, "exhausted")
                    raise
                self._metrics.count_failover(model, "retried")

    async def forward(self, model: str, version: str, payload: bytes, context: RequestContext) -> bytes:
        """`send`, or `send_traced` when the request is traced (`context.trace`)."""
        trace = context.trace
        if trace is None:
            return await self.send(model, version, payload, context)
        return await self.send_traced(trace, model, version, payload, context)

    async def send_traced(
        self, trace: Trace, model: str, version: str, payload: bytes, context: RequestContext
    ) -> bytes:
        """`send` for a traced request: marked so that its sidecar reports its timestamps
        (protos.trace), whose entry leaves the response here, before anyone reads it."""
        sent = trace.now()
        response = await self.send(model, version, payload + trace_parameter(trace.traceparent), context)
        received = trace.now()
        response, report = take_report(response)
        trace.sidecar_answered(report, sent, received)
        return response

    async def _send_pinned(
        self, model: str, sequence: SequenceFlags, pin: Pin, payload: bytes, context: RequestContext
    ) -> bytes:
        """Only the pinned replica holds the sequence's state: if it is gone, say so
        rather than move the sequence to a replica that would start it afresh."""
        client = pin.replica
        lost = f"sequence {sequence.id} of model '{model}' was started on replica {client.address}, which"
        if client not in self._registry.replicas(model, pin.version):
            raise unavailable(f"{lost} no longer serves it; start the sequence again")
        try:
            with self._balancer.track(client):
                return await client.infer(payload, _traceparent(context), context.responses)
        except SidecarUnreachable as exc:
            self._balancer.eject(client, exc.message)
            raise unavailable(f"{lost} could not be reached; start the sequence again") from exc

    async def send_shadow(self, model: str, version: str, payload: bytes) -> bytes:
        """One try on one replica of `version`: shadows never fail over or eject."""
        candidates = self._registry.replicas(model, version)
        client = self._balancer.choose(candidates)
        if client is None:
            raise not_found(f"no replica serves '{model}' version {version}")
        with self._balancer.track(client):
            return await client.infer(with_version(payload, version))


def _traceparent(context: RequestContext) -> str:
    """The W3C context a traced request passes to its sidecar ("" when untraced)."""
    trace = context.trace
    return trace.traceparent if trace is not None else ""
