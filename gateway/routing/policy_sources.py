"""Where routing policies come from: a YAML file read at start, and a Consul KV prefix
watched live (one key per model, JSON of the same shape), which overrides the file.

An invalid policy is rejected with a logged reason; the last good one stays in force.
Invalid is also an arm naming a model the fleet does not know, or one that an experiment
routes to other models in turn (`versions.check_links`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from gateway.consul import ConsulClient, ConsulWatch
from gateway.routing.versions import ModelPolicy, PolicyError, arm_target, check_links, parse_policies, parse_policy

logger = logging.getLogger(__name__)


def read_routing_file(path: str) -> dict[str, ModelPolicy]:
    """The policies of a `--routing` YAML file; raises PolicyError saying what is wrong."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read routing file {path}: {exc}") from exc
    return parse_policies(document)


def unknown_arms(name: str, policy: ModelPolicy, known: Callable[[str], bool]) -> list[str]:
    """Why `policy`'s arms of other models cannot serve: each names a model not `known`."""
    reasons = []
    for arm in policy.arms():
        target = arm_target(arm)[0]
        if target and not known(target):
            reasons.append(f"arm '{arm}' of model '{name}' names unknown model '{target}'")
    return reasons


class PolicyStore:
    """The policies in force. Lookups never wait: each update swaps in a new mapping.

    `known` says whether the fleet knows a model; a KV policy with an arm naming one it
    does not is rejected (None: every model is known)."""

    def __init__(
        self, file_policies: Mapping[str, ModelPolicy] | None = None, known: Callable[[str], bool] | None = None
    ) -> None:
        self._file = dict(file_policies or {})
        self._kv: dict[str, ModelPolicy] = {}
        self._current: Mapping[str, ModelPolicy] = dict(self._file)
        self._known = known

    def get(self, model: str) -> ModelPolicy | None:
        return self._current.get(model)

    def experiments(self) -> list[str]:
        """The called names whose policies route to other models, sorted."""
        return sorted(name for name, policy in self._current.items() if policy.routes_elsewhere)

    def unknown_file_arms(self, known: Callable[[str], bool]) -> list[str]:
        """Why the file's arms of other models cannot serve (checked once the fleet is known)."""
        return [reason for name, policy in self._file.items() for reason in unknown_arms(name, policy, known)]

    def apply_kv(self, prefix: str, entries: list[dict[str, object]] | None) -> None:
        """Apply a kv listing under `prefix`; keys whose value does not parse, or whose arms
        cannot join the other policies, keep their last good policy."""
        parsed: dict[str, tuple[str, ModelPolicy | None, str]] = {}  # model -> (key, policy, why not)
        for entry in entries or []:
            key = str(entry.get("Key", ""))
            model = key[len(prefix) :].strip("/")
            if not model or "/" in model:
                continue
            try:
                raw = base64.b64decode(str(entry.get("Value") or "")).decode()
                parsed[model] = (key, parse_policy(model, json.loads(raw)), "")
            except (ValueError, PolicyError) as exc:
                parsed[model] = (key, None, str(exc))
        # Unchanged policies stand; each changed one joins them if its arms can.
        kv = {m: p for m, (_, p, _) in parsed.items() if p is not None and p == self._kv.get(m)}
        for model, (key, policy, reason) in parsed.items():
            if model in kv:
                continue
            if policy is not None:
                try:
                    kv[model] = self._checked(model, policy, kv)
                    logger.info("routing policy for model '%s' from consul key %s: %s", model, key, policy)
                    continue
                except PolicyError as exc:
                    reason = str(exc)
            previous = self._kv.get(model)
            logger.error("routing policy %s rejected, keeping the last good one: %s", key, reason)
            if previous is not None:
                kv[model] = previous
        for gone in self._kv.keys() - kv.keys():
            logger.info("routing policy for model '%s' removed from consul", gone)
        self._kv = kv
        self._current = {**self._file, **kv}

    def _checked(self, model: str, policy: ModelPolicy, kv: Mapping[str, ModelPolicy]) -> ModelPolicy:
        """`policy` if it can join the others in force; PolicyError saying why not."""
        check_links({**self._file, **kv, model: policy}, model)
        if self._known is not None and (reasons := unknown_arms(model, policy, self._known)):
            raise PolicyError("; ".join(reasons))
        return policy


async def watch_kv(consul: ConsulClient, prefix: str, store: PolicyStore) -> None:
    """Keep `store` in step with the kv prefix, forever (blocking queries)."""
    rounds = ConsulWatch(
        consul,
        f"/v1/kv/{prefix.lstrip('/')}",
        {"recurse": "true"},
        what="routing policies",
        away="keeping the current ones",
        log=logger,
    )
    while True:
        entries, _ = await rounds.next()
        store.apply_kv(prefix.lstrip("/"), entries)
        if rounds.index == 0:
            await asyncio.sleep(0.5)  # no index to block on: poll gently
