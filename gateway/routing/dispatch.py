"""One inference on its way to a sidecar: the version the routing policy picks, the
replica the balancer picks, and failover to another replica when the first could not
be reached, within the request's deadline; for a sequence, the version and replica its
id places it on, alike on every gateway (`gateway.routing.sequences`).

The request stays in the bytes it arrived in: a chosen version is appended as one more
`model_version` field, which protobuf parsing lets win over any earlier value; an arm of
another model (an experiment, `gateway.routing.versions`) appends its `model_name` the
same way, and its response gets the called name and the arm's spelling appended on the
way back. A sequence's placement runs over arms as over versions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.registry import ModelRegistry
from gateway.routing.experiments import Experiments, ready_arms
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.replicas import Balancer
from gateway.routing.sequences import SequencePins, in_rendezvous_order, placement_key
from gateway.routing.versions import Decision, Reason, VersionChooser, arm_name, arm_target
from gateway.tracing.trace import Trace
from gateway.upstream import SidecarClient, SidecarUnreachable
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags
from protos.status import Cause, TurnoutError, model_not_found, not_found, unavailable
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
    `model` answering: model_name the called name, model_version the arm's spelling. An
    empty one (a decoupled model's final flag alone) stays empty."""
    if not response:
        return response
    return (
        response
        + length_delimited(_MODEL_NAME_FIELD, model.encode())
        + length_delimited(_MODEL_VERSION_FIELD, arm.encode())
    )


# Where no policy and no client names a version: one decision for all such requests.
_DEFAULT = Decision("", Reason.DEFAULT)


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
        self.experiments = Experiments(registry, policies)  # what their called names answer

    def decide(self, model: str, requested: str, context: RequestContext) -> Decision:
        sequence = context.sequence
        if sequence is not None:
            return self._decide_sequence(model, requested, context, sequence)
        decision = self._choose(model, requested, context, "")
        self._count_route(model, decision)
        return decision

    def _choose(self, model: str, requested: str, context: RequestContext, draw_key: str) -> Decision:
        policy = self._policies.get(model)
        if policy is None and not requested:
            return _DEFAULT
        ready = ready_arms(self._registry, model, policy)
        return self._chooser.choose(policy, requested, context.headers, ready, draw_key)

    def _count_route(self, model: str, decision: Decision) -> None:
        # Label only arms the policy or the fleet knows: a client's version text is unbounded.
        arm = decision.arm
        if arm:
            policy = self._policies.get(model)
            named = policy is not None and arm in policy.arms()
            if not named and arm not in (ready_arms(self._registry, model, policy) or ()):
                arm = "other"
        self._metrics.count_route(model, decision, arm)

    def _decide_sequence(
        self, model: str, requested: str, context: RequestContext, sequence: SequenceFlags
    ) -> Decision:
        """A START is routed like any request, but to a definite version (the newest READY
        one when nothing else chooses), by a weighted choice every gateway makes alike (a
        hash of the sequence id, where no sticky key decides), and never shadowed, since a
        shadow would see the sequence's later requests alone. A later request names no
        version unless its client did: `send` finds the version that holds the sequence."""
        if sequence.start or requested:
            decision = self._start_decision(model, requested, context, sequence)
            decision = replace(decision, shadow="", shadow_policy=None)
            self._count_route(model, decision)
            return decision
        pin = self._pins.get(model, sequence)
        if pin is not None:
            expected = arm_name(pin.model, pin.version)
        else:
            expected = self._start_decision(model, "", context, sequence).arm
        decision = Decision("", Reason.SEQUENCE)
        self._metrics.count_route(model, decision, expected or "default")
        return decision

    def _start_decision(self, model: str, requested: str, context: RequestContext, sequence: SequenceFlags) -> Decision:
        decision = self._choose(model, requested, context, placement_key(model, sequence))
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
        experiment's arm of another model answers for the called `model` (the response
        then names the called model and the arm); a replica that could not be reached is
        ejected and the next one tried, until the deadline. A sequence's START goes to the
        first replica of its rendezvous order that can be reached, and its later requests
        where the START went (`_send_in_sequence`)."""
        sequence = context.sequence
        if sequence is not None and not sequence.start:
            return await self._send_in_sequence(model, arm_name(served, version), payload, context, sequence)
        target = served or model
        candidates = await self._replicas(target, version)
        if sequence is not None:
            candidates = in_rendezvous_order(placement_key(model, sequence), candidates)
        deadline = context.deadline or self._clock() + DEFAULT_BUDGET_SECS
        tried: list[SidecarClient] = []
        while True:
            if sequence is not None:
                client = self._balancer.first(candidates, tried)
            else:
                client = self._balancer.choose(candidates, tried)
            if client is None:
                raise unavailable(f"no replica of model '{target}' could be reached")
            tried.append(client)
            if sequence is not None and not sequence.end:
                # Before the send: a stream's next requests of this sequence may follow at once.
                self._pins.bind(model, sequence, version, client, served)
            try:
                with self._balancer.track(client):
                    parts = (
                        _relabelling(context.responses, model, arm_name(served, version))
                        if served
                        else context.responses
                    )
                    response = await client.infer(payload, _traceparent(context), parts)
                return relabelled(response, model, arm_name(served, version)) if served else response
            except SidecarUnreachable as exc:
                self._balancer.eject(client, exc.message)
                if self._clock() >= deadline or len(tried) >= len(candidates):
                    self._metrics.count_failover(target, "exhausted")
                    raise
                self._metrics.count_failover(target, "retried")

    async def _replicas(self, model: str, version: str) -> Sequence[SidecarClient]:
        candidates = self._registry.replicas(model, version)
        if not candidates:
            await self._registry.find(model)  # an unknown name may be new: look once more
            candidates = self._registry.replicas(model, version)
        if not candidates:
            raise model_not_found(model)
        return candidates

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

    async def _send_in_sequence(
        self, model: str, arm: str, payload: bytes, context: RequestContext, sequence: SequenceFlags
    ) -> bytes:
        """A sequence's later request goes where its START went: to the replica this
        gateway pinned it to, else along the order every gateway derives alike (the
        replicas of the arm a START would get now, in the sequence's rendezvous order,
        then those of the other READY arms; only `arm`'s when the client named one), to
        the first replica that holds the sequence. One that does not says so
        (Cause.UNKNOWN_SEQUENCE) and the next is asked. The state never moves: when no
        replica holds the sequence, the answer says its replica is gone, or is Triton's."""
        tried: list[tuple[str, SidecarClient]] = []
        refusal: TurnoutError | None = None  # a replica's answer that it does not hold the sequence
        lost: TurnoutError | None = None  # why the pinned replica could not answer
        pin = self._pins.get(model, sequence)
        pinned = arm_name(pin.model, pin.version) if pin is not None else ""
        if pin is not None and arm in ("", pinned):
            if sequence.end:
                self._pins.end(model, sequence)
            client = pin.replica
            where = f"sequence {sequence.id} of model '{model}' was started on replica {client.address}, which"
            if client not in self._registry.replicas(pin.model or model, pin.version):
                lost = unavailable(f"{where} no longer serves it; start the sequence again")
            else:
                try:
                    with self._balancer.track(client):
                        parts = _relabelling(context.responses, model, pinned)
                        response = await client.infer(_aimed(payload, pinned), _traceparent(context), parts)
                    return _answered(response, model, pinned)
                except SidecarUnreachable as exc:
                    self._balancer.eject(client, exc.message)
                    lost = unavailable(f"{where} could not be reached; start the sequence again")
                    lost.__cause__ = exc
                except TurnoutError as exc:
                    if exc.cause is not Cause.UNKNOWN_SEQUENCE:
                        raise
                    refusal = exc  # it let the sequence go (idle, or ended through another gateway)
            # The pin is stale: the sequence may have started again elsewhere, through another gateway.
            self._pins.end(model, sequence)
            tried.append((pinned, client))
        deadline = context.deadline or self._clock() + DEFAULT_BUDGET_SECS
        unreachable: list[str] = []
        for held, client in await self._sequence_order(model, arm, context, sequence):
            if (held, client) in tried:
                continue
            try:
                with self._balancer.track(client):
                    parts = _relabelling(context.responses, model, held)
                    response = await client.infer(_aimed(payload, held), _traceparent(context), parts)
            except SidecarUnreachable as exc:
                self._balancer.eject(client, exc.message)
                unreachable.append(client.address)
                if self._clock() >= deadline:
                    break
                continue
            except TurnoutError as exc:
                if exc.cause is not Cause.UNKNOWN_SEQUENCE:
                    raise
                refusal = exc
                continue
            if not sequence.end:
                served, version = arm_target(held)
                self._pins.bind(model, sequence, version, client, served)
            return _answered(response, model, held)
        if lost is not None:
            raise lost
        if unreachable:
            raise unavailable(
                f"sequence {sequence.id} of model '{model}' is held by no replica that could be reached "
                f"({', '.join(unreachable)} could not be); start the sequence again"
            )
        if refusal is None:  # pragma: no cover - `_replicas` raised for a model with no replica
            raise unavailable(f"no replica of model '{model}' could be reached")
        raise refusal  # Triton's answer: no replica holds the sequence

    async def _sequence_order(
        self, model: str, arm: str, context: RequestContext, sequence: SequenceFlags
    ) -> list[tuple[str, SidecarClient]]:
        """(arm, replica) pairs in the order a later request of `sequence` asks them."""
        if arm:
            arms = [arm]
        else:
            first = self._start_decision(model, "", context, sequence).arm
            ready = ready_arms(self._registry, model, self._policies.get(model)) or frozenset()
            arms = [first, *sorted(ready - {first}, key=_newest_first, reverse=True)]
        key = placement_key(model, sequence)
        order: list[tuple[str, SidecarClient]] = []
        for each in arms:
            served, version = arm_target(each)
            replicas = await self._replicas(served or model, version)
            order += [(each, client) for client in in_rendezvous_order(key, replicas)]
        return order

    async def send_shadow(self, model: str, arm: str, payload: bytes) -> bytes:
        """One try on one replica of `model`'s `arm` (a version, or another model's arm):
        shadows never fail over or eject."""
        served, version = arm_target(arm)
        target = served or model
        candidates = self._registry.replicas(target, version)
        client = self._balancer.choose(candidates)
        if client is None:
            raise not_found(f"no replica serves '{target}' version {version}")
        payload = with_version(payload, version)  # "" too: the primary's version is not the shadow's
        with self._balancer.track(client):
            return await client.infer(with_model(payload, served) if served else payload)


def _aimed(payload: bytes, arm: str) -> bytes:
    """`payload` sent to `arm`: its version set (when the arm names one), and its model
    when the arm is another model's (with its version, "" too: the client's named the arm)."""
    served, version = arm_target(arm)
    if served:
        return with_model(with_version(payload, version), served)
    return with_version(payload, version) if version else payload


def _answered(response: bytes, model: str, arm: str) -> bytes:
    """The response of `arm`, as `model` answers: relabelled when another model served."""
    return relabelled(response, model, arm) if arm_target(arm)[0] else response


def _relabelling(
    responses: Callable[[bytes | TurnoutError], None] | None, model: str, arm: str
) -> Callable[[bytes | TurnoutError], None] | None:
    """`responses` (where a decoupled model's answers before its last go), each answer
    relabelled as `_answered` does the last; an error answer passes as it is."""
    if responses is None or not arm_target(arm)[0]:
        return responses
    return lambda part: responses(part if isinstance(part, TurnoutError) else relabelled(part, model, arm))


def _newest_first(arm: str) -> tuple[bool, int, str]:
    """Versions by number, then other models' arms by name: the same order on every gateway."""
    return (arm.isdigit(), int(arm) if arm.isdigit() else 0, arm)


def _traceparent(context: RequestContext) -> str:
    """The W3C context a traced request passes to its sidecar ("" when untraced)."""
    trace = context.trace
    return trace.traceparent if trace is not None else ""
