"""Where routing policies come from: a YAML file read at start, and a Consul KV prefix
watched live (one key per model, JSON of the same shape), which overrides the file.

An invalid policy is rejected with a logged reason; the last good one stays in force.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import yaml

from gateway.consul import ConsulClient, ConsulWatch
from gateway.routing.versions import ModelPolicy, PolicyError, parse_policies, parse_policy

logger = logging.getLogger(__name__)


def read_routing_file(path: str) -> dict[str, ModelPolicy]:
    """The policies of a `--routing` YAML file; raises PolicyError saying what is wrong."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read routing file {path}: {exc}") from exc
    return parse_policies(document)


class PolicyStore:
    """The policies in force. Lookups never wait: each update swaps in a new mapping."""

    def __init__(self, file_policies: Mapping[str, ModelPolicy] | None = None) -> None:
        self._file = dict(file_policies or {})
        self._kv: dict[str, ModelPolicy] = {}
        self._current: Mapping[str, ModelPolicy] = dict(self._file)

    def get(self, model: str) -> ModelPolicy | None:
        return self._current.get(model)

    def apply_kv(self, prefix: str, entries: list[dict[str, object]] | None) -> None:
        """Apply a kv listing under `prefix`; keys whose value does not parse keep their last good policy."""
        kv: dict[str, ModelPolicy] = {}
        for entry in entries or []:
            key = str(entry.get("Key", ""))
            model = key[len(prefix) :].strip("/")
            if not model or "/" in model:
                continue
            try:
                raw = base64.b64decode(str(entry.get("Value") or "")).decode()
                kv[model] = parse_policy(model, json.loads(raw))
            except (ValueError, PolicyError) as exc:
                previous = self._kv.get(model)
                logger.error("routing policy %s rejected, keeping the last good one: %s", key, exc)
                if previous is not None:
                    kv[model] = previous
                continue
            if self._kv.get(model) != kv[model]:
                logger.info("routing policy for model '%s' from consul key %s: %s", model, key, kv[model])
        for gone in self._kv.keys() - kv.keys():
            logger.info("routing policy for model '%s' removed from consul", gone)
        self._kv = kv
        self._current = {**self._file, **kv}


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
