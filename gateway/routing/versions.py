"""Weighted version routing: a model's policy (weights, sticky header, shadow) and the
choice of the version that serves one request.

Sticky keys use weighted rendezvous hashing: each key goes to the version with the
highest `weight / -ln(hash(key, version))`, so every gateway makes the same choice,
and a weight change moves only the keys the new weights need to move.
"""

from __future__ import annotations

import enum
import hashlib
import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

_HASH_SPAN = float(2**64)


class PolicyError(ValueError):
    """A routing policy that cannot be applied; the message says why."""


class Reason(enum.Enum):
    """Why a request went to the version it did (a metric label)."""

    EXPLICIT = "explicit"  # the request named its version
    STICKY = "sticky"  # the sticky key's hash chose it
    WEIGHTED = "weighted"  # a seeded random draw by weight
    DEFAULT = "default"  # no policy, or no policy version ready: the sidecar's newest
    SEQUENCE = "sequence"  # a sequence's later requests keep the version of its START


@dataclass(frozen=True)
class Shadow:
    version: str
    fraction: float


@dataclass(frozen=True)
class ModelPolicy:
    """One model's routing policy; build it with `parse_policy`."""

    weights: tuple[tuple[str, float], ...]
    sticky_header: str = ""
    shadow: Shadow | None = None


@dataclass(frozen=True)
class Decision:
    version: str  # "" = let the sidecar pick its newest READY version
    reason: Reason
    skipped: tuple[str, ...] = ()  # weighted versions left out for want of a ready instance
    shadow: str = ""  # the version to mirror this request to, if any
    sticky_key: str = field(default="", repr=False)


def _version(text: object) -> str:
    value = str(text).strip()
    if not value.isdigit() or int(value) < 1:
        raise PolicyError(f"version {text!r} is not a positive integer")
    return str(int(value))


def parse_policy(model: str, raw: object) -> ModelPolicy:
    """Validate one model's policy: `{weights: {"1": 90, "2": 10}, sticky_header: x-user,
    shadow: {version: "2", fraction: 0.1}}`. Raises PolicyError with the reason."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"policy for model '{model}' must be a mapping")
    unknown = set(raw) - {"weights", "sticky_header", "shadow"}
    if unknown:
        raise PolicyError(f"policy for model '{model}' has unknown keys {sorted(unknown)}")
    weights_raw = raw.get("weights")
    if not isinstance(weights_raw, Mapping) or not weights_raw:
        raise PolicyError(f"policy for model '{model}' needs a non-empty 'weights' mapping")
    weights: dict[str, float] = {}
    for key, value in weights_raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise PolicyError(f"weight of version {key!r} of model '{model}' must be a number >= 0")
        weights[_version(key)] = float(value)
    if sum(weights.values()) <= 0:
        raise PolicyError(f"weights of model '{model}' must not all be zero")
    sticky = raw.get("sticky_header", "") or ""
    if not isinstance(sticky, str):
        raise PolicyError(f"sticky_header of model '{model}' must be a string")
    shadow = None
    shadow_raw = raw.get("shadow")
    if shadow_raw is not None:
        if not isinstance(shadow_raw, Mapping) or "version" not in shadow_raw:
            raise PolicyError(f"shadow of model '{model}' must be a mapping with a 'version'")
        fraction = shadow_raw.get("fraction", 1.0)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
            raise PolicyError(f"shadow fraction of model '{model}' must be between 0 and 1")
        shadow = Shadow(_version(shadow_raw["version"]), float(fraction))
    return ModelPolicy(tuple(sorted(weights.items(), key=lambda kv: int(kv[0]))), sticky.lower(), shadow)


def parse_policies(raw: object) -> dict[str, ModelPolicy]:
    """A whole routing document: `{models: {<model>: <policy>}}`."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("models", {}), Mapping):
        raise PolicyError("a routing document must be a mapping with a 'models' mapping")
    models: Mapping[str, Any] = raw.get("models") or {}
    return {str(name): parse_policy(str(name), policy) for name, policy in models.items()}


def sticky_score(key: str, version: str, weight: float) -> float:
    """Weighted rendezvous score; the same on every gateway (no per-process hash seed)."""
    digest = hashlib.blake2b(f"{version}\0{key}".encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / _HASH_SPAN  # in (0, 1)
    return weight / -math.log(unit)


class VersionChooser:
    """Chooses the version for each request from the current policies.

    `rng` draws the unsticky choices; pass a seeded `random.Random` for replayable runs.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(
        self,
        policy: ModelPolicy | None,
        requested: str,
        headers: Mapping[str, str],
        ready: Collection[str] | None,
        draw_key: str = "",
    ) -> Decision:
        """`ready`: the versions some healthy instance serves (None = unknown: all are).
        `draw_key` (a sequence's) replaces the random draw by weight with the weighted
        rendezvous choice on it, which every gateway makes alike."""
        if policy is None:
            return Decision(requested, Reason.EXPLICIT if requested else Reason.DEFAULT)
        shadow = self._shadow(policy)
        if requested:
            return Decision(requested, Reason.EXPLICIT, shadow=shadow if shadow != requested else "")
        live = [(v, w) for v, w in policy.weights if w > 0 and (ready is None or v in ready)]
        skipped = tuple(v for v, w in policy.weights if w > 0 and ready is not None and v not in ready)
        if not live:
            return Decision("", Reason.DEFAULT, skipped)
        key = headers.get(policy.sticky_header, "") if policy.sticky_header else ""
        if key:
            version = max(live, key=lambda vw: sticky_score(key, vw[0], vw[1]))[0]
            reason = Reason.STICKY
        elif draw_key:
            version = max(live, key=lambda vw: sticky_score(draw_key, vw[0], vw[1]))[0]
            reason = Reason.WEIGHTED
        else:
            version = self._draw(live)
            reason = Reason.WEIGHTED
        return Decision(version, reason, skipped, shadow if shadow != version else "", key)

    def _draw(self, live: list[tuple[str, float]]) -> str:
        point = self._rng.random() * sum(w for _, w in live)
        for version, weight in live:
            point -= weight
            if point < 0:
                return version
        return live[-1][0]

    def _shadow(self, policy: ModelPolicy) -> str:
        shadow = policy.shadow
        if shadow is None or shadow.fraction <= 0:
            return ""
        return shadow.version if self._rng.random() < shadow.fraction else ""
