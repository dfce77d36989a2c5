"""Experiments across models: names whose policies weigh arms of other models
(`resnet` -> `resnet_onnx:3`, `resnet_trt:1`), and what such a called name answers
besides inferences: which arms are ready, and which arm stands for the name in its
metadata, config, readiness and repository index (the first weighted arm that is ready,
else the first weighted one; the one a requested version names).

Reads the policies in force and the registry on every call, so it never holds stale
state; both are swapped, not changed, so no lock is needed.
"""

from __future__ import annotations

from gateway.registry import ModelRegistry
from gateway.routing.policy_sources import PolicyStore
from gateway.routing.versions import ModelPolicy, arm_target
from protos import grpc_service_pb2 as pb
from protos.status import model_not_found

NOT_READY = "no ready replica serves this arm"


def ready_arms(registry: ModelRegistry, model: str, policy: ModelPolicy | None) -> frozenset[str] | None:
    """The arms of `model`'s policy that some healthy instance serves (for a policy of
    versions only: the READY versions); None when not known."""
    ready = registry.ready_versions(model)
    if policy is None or not policy.routes_elsewhere:
        return ready
    arms = set()
    for arm in policy.arms():
        target, version = arm_target(arm)
        versions = registry.ready_versions(target) if target else ready
        if versions and (version in versions or not version):
            arms.add(arm)
    return frozenset(arms)


class Experiments:
    """The experiments in force, as the repository calls see them."""

    def __init__(self, registry: ModelRegistry, policies: PolicyStore) -> None:
        self._registry = registry
        self._policies = policies

    def get(self, model: str) -> ModelPolicy | None:
        """The policy of `model` when it routes to other models, else None."""
        policy = self._policies.get(model)
        return policy if policy is not None and policy.routes_elsewhere else None

    def ready_arms(self, model: str) -> frozenset[str]:
        return ready_arms(self._registry, model, self.get(model)) or frozenset()

    def arms(self, model: str) -> list[str]:
        """An experiment's weighted arms, in the policy's order."""
        policy = self.get(model)
        return [arm for arm, weight in policy.weights if weight > 0] if policy is not None else []

    def front(self, model: str, requested: str) -> tuple[str, str] | None:
        """The (model, version) that answers for an experiment's called name: the arm
        `requested` names, else the first weighted arm that is ready (the first weighted
        one when none is). None for a name that is no experiment, and for a version of a
        called name that is a model too (it answers itself); NOT_FOUND, in Triton's words,
        for a version that is none of its arms."""
        policy = self.get(model)
        if policy is None:
            return None
        if requested:
            if requested not in policy.arms():
                if self._registry.replicas(model, ""):
                    return None
                raise model_not_found(model, requested)
            chosen = requested
        else:
            ready = self.ready_arms(model)
            weighted = self.arms(model)
            chosen = next((arm for arm in weighted if arm in ready), weighted[0])
        target, version = arm_target(chosen)
        return target or model, version

    def as_called(self, answer: pb.ModelMetadataResponse, model: str, requested: str) -> pb.ModelMetadataResponse:
        """An arm's metadata as the called name's: its name, and as versions the arm
        asked for, or the ready arms (what model_version may say)."""
        answer.name = model
        ready = self.ready_arms(model)
        del answer.versions[:]
        answer.versions.extend([requested] if requested else [arm for arm in self.arms(model) if arm in ready])
        return answer

    def in_index(
        self, models: list[pb.RepositoryIndexResponse.ModelIndex]
    ) -> list[pb.RepositoryIndexResponse.ModelIndex]:
        """A repository index with each experiment's called name listed once per arm, as a
        model is per version: READY when a replica serves the arm, else UNAVAILABLE (a
        called name that is a model too keeps its own versions' entries)."""
        listed = {(entry.name, entry.version) for entry in models}
        for name in self._policies.experiments():
            ready = self.ready_arms(name)
            for arm in self.arms(name):
                if (name, arm) in listed:
                    continue
                state, reason = ("READY", "") if arm in ready else ("UNAVAILABLE", NOT_READY)
                models.append(pb.RepositoryIndexResponse.ModelIndex(name=name, version=arm, state=state, reason=reason))
        return models
