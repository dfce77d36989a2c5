"""One inference on its way to a sidecar: the version the routing policy picks, the
replica the balancer picks, and failover to another replica when the first could not
be reached, within the request's deadline.

The request stays in the bytes it arrived in: a chosen version is appended as one more
`model_version` field, which protobuf parsing lets win over any earlier value; an arm of
another model appends its `model_name` the same way, and its response gets the called
name and the arm's spelling appended on the way back.
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
from gateway.routing.versions import Decision, ModelPolicy, Reason, VersionChooser, arm_target
from gateway.tracing.trace import Trace
from gateway.upstream import SidecarClient, SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import not_found, unavailable
from protos.trace import take_report, trace_parameter
from protos.wire import length_delimited

_MODEL_NAME_FIELD = pb.ModelInferRequest.MODEL_NAME_FIELD_NUMBER
_MODEL_VERSION_FIELD = pb.ModelInferRequest.MODEL_VERSION_FIELD_NUMBER
# A response names its model in the same fields as a request.
assert (pb.ModelInferResponse.MODEL_NAME_FIELD_NUMBER, pb.ModelInferResponse.MODEL_VERSION_FIELD_NUMBER) == (
    _MODEL_NAME_FIELD,
    _MODEL_VERSION_FIELD,
)
DEFAULT_BUDGET_SECS = 30.0  # failover stops here when the client set no deadline


def with_version(encoded: bytes, version: str) -> bytes:
    """`encoded` (a serialized ModelInferRequest) with its model_version set to `version`."""
    return encoded + length_delimited(_MODEL_VERSION_FIELD, version.encode())


def with_model(encoded: bytes, model: str) -> bytes:
    """`encoded` (a serialized ModelInferRequest) with its model_name set to `model`."""
    return encoded + length_delimited(_MODEL_NAME_FIELD, model.encode())


def relabelled(response: bytes, model: str, arm: str) -> bytes:
    """A serialized ModelInferResponse that an arm of another model gave, as the called
    `model` answering: model_name the called name, model_version the arm's spelling."""
    return (
        response
        + length_delimited(_MODEL_NAME_FIELD, model.encode())
        + length_delimited(_MODEL_VERSION_FIELD, arm.encode())
    )


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
        ready = self._ready_arms(model, policy)
        decision = self._chooser.choose(policy, requested, context.headers, ready)
        # Label only arms the policy or the fleet knows: a client's version text is unbounded.
        arm = decision.arm
        known = arm in (ready or ()) or (policy is not None and arm in policy.arms())
        self._metrics.count_route(model, decision, arm if known or not arm else "other")
        return decision

    def _ready_arms(self, model: str, policy: ModelPolicy | None) -> frozenset[str] | None:
        """The arms of `model` some healthy instance serves; None when not known."""
        ready = self._registry.ready_versions(model)
        if policy is None or not policy.routes_elsewhere:
            return ready
        arms = set()
        for arm in policy.arms():
            target, version = arm_target(arm)
            versions = self._registry.ready_versions(target) if target else ready
            if versions and (version in versions or not version):
                arms.add(arm)
        return frozenset(arms)

    def experiment(self, model: str) -> ModelPolicy | None:
        """The policy of `model` when it routes to other models (an experiment), else None."""
        policy = self._policies.get(model)
        return policy if policy is not None and policy.routes_elsewhere else None

    def front_arm(self, model: str, requested: str) -> tuple[str, str] | None:
        """For an experiment's called name: the (model, version) that answers its metadata,
        config and readiness: the arm `requested` names, else the first weighted arm that
        is ready (the first weighted one when none is). None when `model` is no experiment
        or `requested` names none of its arms."""
        policy = self.experiment(model)
        if policy is None:
            return None
        if requested:
            if requested not in policy.arms():
                return None
            chosen = requested
        else:
            ready = self._ready_arms(model, policy) or frozenset()
            weighted = [arm for arm, weight in policy.weights if weight > 0]
            chosen = next((arm for arm in weighted if arm in ready), weighted[0])
        target, version = arm_target(chosen)
        return target or model, version

    def experiments(self) -> list[str]:
        """The called names of every experiment in force, sorted."""
        return self._policies.experiments()

    def ready_arms(self, model: str) -> frozenset[str]:
        """The arms of an experiment that some healthy instance serves."""
        return self._ready_arms(model, self.experiment(model)) or frozenset()

    def _decide_sequence(
        self, model: str, requested: str, context: RequestContext, sequence: SequenceFlags
    ) -> Decision:
        """A sequence keeps the version its START got; a START is routed like any request,
        but to a definite version (the newest READY one when nothing else chooses) and
        never shadowed, since a shadow would see the sequence's later requests alone."""
        pin = None if sequence.start else self._pins.get(model, sequence)
        if pin is not None:
            decision = Decision(pin.version, Reason.SEQUENCE, model=pin.model)
            self._metrics.count_route(model, decision, decision.arm or "default")
            return decision
        decision = self.decide(model, requested, replace(context, sequence=None))
        decision = replace(decision, shadow="", shadow_policy=None)
        if not decision.version and not decision.model:
            ready = self._registry.ready_versions(model)
            if ready:
                decision = replace(decision, version=max(ready, key=int))
        return decision

    def models_changed(self) -> None:
        """A load or unload went through: cached per-model facts may be stale."""
        self._pins.forget_idle_times()

    async def send(self, model: str, version: str, payload: bytes, context: RequestContext, served: str = "") -> bytes:
        """Send to one replica serving `model` (`version` if given), or `served` when an
        experiment's arm of another model serves the called `model`; a replica that could
        not be reached is ejected and the next one tried, until the deadline. A sequence's
        requests after its START go where the START went, with no failover."""
        sequence = context.sequence
        if sequence is not None and not sequence.start:
            pin = self._pins.get(model, sequence)
            if pin is not None:
                if sequence.end:
                    self._pins.end(model, sequence)
                return await self._send_pinned(model, sequence, pin, payload, context)
        target = served or model
        candidates = self._registry.replicas(target, version)
        if not candidates:
            await self._registry.find(target)  # an unknown name may be new: look once more
            candidates = self._registry.replicas(target, version)
        if not candidates:
            raise not_found(f"Request for unknown model: '{target}' is not found")
        deadline = context.deadline or self._clock() + DEFAULT_BUDGET_SECS
        tried: list[SidecarClient] = []
        while True:
            client = self._balancer.choose(candidates, tried)
            if client is None:
                raise unavailable(f"no replica of model '{target}' could be reached")
            tried.append(client)
            if sequence is not None and sequence.start and not sequence.end:
                # Before the send: a stream's next requests of this sequence may follow at once.
                self._pins.bind(model, sequence, version, client, served)
            try:
                with self._balancer.track(client):
                    return await client.infer(payload, _traceparent(context))
            except SidecarUnreachable as exc:
                self._balancer.eject(client, exc.message)
                if self._clock() >= deadline or len(tried) >= len(candidates):
                    self._metrics.count_failover(target, "exhausted")
                    raise
                self._metrics.count_failover(target, "retried")

    async def forward(
        self, model: str, version: str, payload: bytes, context: RequestContext, served: str = ""
    ) -> bytes:
        """`send`, or `send_traced` when the request is traced (`context.trace`)."""
        trace = context.trace
        if trace is None:
            return await self.send(model, version, payload, context, served)
        return await self.send_traced(trace, model, version, payload, context, served)

    async def send_traced(
        self, trace: Trace, model: str, version: str, payload: bytes, context: RequestContext, served: str = ""
    ) -> bytes:
        """`send` for a traced request: marked so that its sidecar reports its timestamps
        (protos.trace), whose entry leaves the response here, before anyone reads it."""
        sent = trace.now()
        response = await self.send(model, version, payload + trace_parameter(trace.traceparent), context, served)
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
        if client not in self._registry.replicas(pin.model or model, pin.version):
            raise unavailable(f"{lost} no longer serves it; start the sequence again")
        try:
            with self._balancer.track(client):
                return await client.infer(payload, _traceparent(context))
        except SidecarUnreachable as exc:
            self._balancer.eject(client, exc.message)
            raise unavailable(f"{lost} could not be reached; start the sequence again") from exc

    async def send_shadow(self, model: str, arm: str, payload: bytes) -> bytes:
        """One try on one replica of `model`'s `arm` (a version, or another model's arm):
        shadows never fail over or eject."""
        served, version = arm_target(arm)
        target = served or model
        candidates = self._registry.replicas(target, version)
        client = self._balancer.choose(candidates)
        if client is None:
            raise not_found(f"no replica serves '{target}' version {version}")
        with self._balancer.track(client):
            payload = with_version(payload, version)
            return await client.infer(with_model(payload, served) if served else payload)


def _traceparent(context: RequestContext) -> str:
    """The W3C context a traced request passes to its sidecar ("" when untraced)."""
    trace = context.trace
    return trace.traceparent if trace is not None else ""
