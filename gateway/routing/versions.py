"""Weighted version routing: a model's policy (weights, sticky header, shadow) and the
choice of the arm that serves one request.

An arm is a version of the called model ("2") or, in an experiment across models,
another model that answers under the called name: "resnet_trt:1" (its version 1) or
"resnet_trt" (its newest READY version). The arm's spelling is the response's
`model_version` and the metric label, so the same arm reads the same everywhere.

Sticky keys use weighted rendezvous hashing: each key goes to the version with the
highest `weight / -ln(hash(key, version))`, so every gateway makes the same choice,
and a weight change moves only the keys the new weights need to move.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

_HASH_SPAN = float(2**64)
ARM_SEPARATOR = ":"
# numpy.isclose's defaults: a shadow's floating outputs within them read "same".
DEFAULT_RTOL = 1e-05
DEFAULT_ATOL = 1e-08


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
class Tolerance:
    """How far a shadow's floating output may stray and still read "same":
    |shadow - primary| <= atol + rtol * |primary| elementwise, as numpy.isclose."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


@dataclass(frozen=True)
class Shadow:
    version: str  # the arm the copies go to
    fraction: float
    tolerance: Tolerance = Tolerance()
    outputs: tuple[tuple[str, Tolerance], ...] = ()  # per output name, over `tolerance`

    def tolerance_of(self, output: str) -> Tolerance:
        return dict(self.outputs).get(output, self.tolerance)


@dataclass(frozen=True)
class ModelPolicy:
    """One model's routing policy; build it with `parse_policy`. `weights` pairs arm
    spellings with weights: by version number when all are versions of the model, else
    in the order written (the first is the default arm)."""

    weights: tuple[tuple[str, float], ...]
    sticky_header: str = ""
    shadow: Shadow | None = None

    # Asked per request: computed once per policy (a policy never changes, it is replaced).
    @functools.cached_property
    def routes_elsewhere(self) -> bool:
        """Whether some weighted arm is another model: an experiment across models."""
        return any(arm_target(arm)[0] for arm, _ in self.weights)

    @functools.cached_property
    def _all_arms(self) -> tuple[str, ...]:
        weighted = tuple(arm for arm, _ in self.weights)
        if self.shadow is not None and self.shadow.version not in weighted:
            return (*weighted, self.shadow.version)
        return weighted

    def arms(self) -> tuple[str, ...]:
        """Every arm the policy sends to: the weighted ones, then the shadow's."""
        return self._all_arms


@dataclass(slots=True, unsafe_hash=True)
class Decision:
    """Where one request goes. Made for every request, so not frozen (a frozen dataclass's
    `__init__` costs several times a plain one's); derive with dataclasses.replace."""

    version: str  # "" = let the sidecar pick its newest READY version
    reason: Reason
    skipped: tuple[str, ...] = ()  # weighted arms left out for want of a ready instance
    shadow: str = ""  # the arm to mirror this request to, if any
    sticky_key: str = field(default="", repr=False)
    model: str = ""  # the model that serves, when an arm of another model does ("" = the called one)
    shadow_policy: Shadow | None = field(default=None, repr=False, compare=False)

    @property
    def arm(self) -> str:
        """The arm's spelling: the response's model_version and the metric label."""
        return arm_name(self.model, self.version)


def arm_name(model: str, version: str) -> str:
    """The spelling of the arm that `model` ("" = the called model) at `version` serves."""
    if not model:
        return version
    return f"{model}{ARM_SEPARATOR}{version}" if version else model


def arm_target(arm: str) -> tuple[str, str]:
    """(model, version) of an arm spelled by `parse_policy`: model "" is the called model,
    version "" the newest READY one."""
    if arm.isdigit():
        return "", arm
    model, separator, version = arm.rpartition(ARM_SEPARATOR)
    if separator and version.isdigit():
        return model, version
    return arm, ""


def _version(text: object) -> str:
    value = str(text).strip()
    if not value.isdigit() or int(value) < 1:
        raise PolicyError(f"version {text!r} is not a positive integer")
    return str(int(value))


def _arm(model: str, text: object) -> str:
    """The canonical spelling of an arm of `model`: a version ("2"), or another model with
    or without a version ("resnet_trt:1", "resnet_trt"); the model itself is its versions."""
    value = str(text).strip()
    if value.isdigit() or value.lstrip("-").isdigit():
        return _version(value)
    target, separator, version = value.rpartition(ARM_SEPARATOR)
    if separator and version.strip().isdigit():
        target, version = target.strip(), _version(version)
    else:
        target, version = value, ""
    if not target or "/" in target or any(c.isspace() for c in target):
        raise PolicyError(f"arm {text!r} of model '{model}' does not name a model")
    if target == model:
        if not version:
            raise PolicyError(f"arm {text!r} of model '{model}' names the model itself; name one of its versions")
        return version
    return arm_name(target, version)


def _fraction_or_tolerance(model: str, what: str, value: object, upper: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        value = -1.0  # rejected below, with the same message as one out of range
    if not 0 <= value <= upper:
        bound = f"between 0 and {upper:g}" if math.isfinite(upper) else "a finite number >= 0"
        raise PolicyError(f"shadow {what} of model '{model}' must be {bound}")
    return float(value)


def _tolerance(model: str, raw: Mapping[str, Any], default: Tolerance, where: str = "") -> Tolerance:
    return Tolerance(
        _fraction_or_tolerance(model, f"rtol{where}", raw.get("rtol", default.rtol)),
        _fraction_or_tolerance(model, f"atol{where}", raw.get("atol", default.atol)),
    )


def _shadow(model: str, raw: object) -> Shadow:
    if not isinstance(raw, Mapping) or "version" not in raw:
        raise PolicyError(f"shadow of model '{model}' must be a mapping with a 'version'")
    unknown = set(raw) - {"version", "fraction", "rtol", "atol", "outputs"}
    if unknown:
        raise PolicyError(f"shadow of model '{model}' has unknown keys {sorted(unknown)}")
    fraction = _fraction_or_tolerance(model, "fraction", raw.get("fraction", 1.0), 1.0)
    tolerance = _tolerance(model, raw, Tolerance())
    outputs_raw = raw.get("outputs") or {}
    if not isinstance(outputs_raw, Mapping):
        raise PolicyError(f"shadow outputs of model '{model}' must map output names to {{rtol, atol}}")
    outputs = []
    for name, each in outputs_raw.items():
        if not isinstance(each, Mapping) or set(each) - {"rtol", "atol"}:
            raise PolicyError(f"shadow output '{name}' of model '{model}' takes only 'rtol' and 'atol'")
        outputs.append((str(name), _tolerance(model, each, tolerance, f" of output '{name}'")))
    return Shadow(_arm(model, raw["version"]), fraction, tolerance, tuple(outputs))


def parse_policy(model: str, raw: object) -> ModelPolicy:
    """Validate one model's policy: `{weights: {"1": 90, "2": 10}, sticky_header: x-user,
    shadow: {version: "2", fraction: 0.1, rtol: 1e-3}}`; weights may name other models'
    arms (`{"resnet_onnx:3": 90, "resnet_trt:1": 10}`). Raises PolicyError with the reason."""
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
        arm = _arm(model, key)
        if arm in weights:
            raise PolicyError(f"arm '{arm}' of model '{model}' is weighted twice")
        weights[arm] = float(value)
    if sum(weights.values()) <= 0:
        raise PolicyError(f"weights of model '{model}' must not all be zero")
    sticky = raw.get("sticky_header", "") or ""
    if not isinstance(sticky, str):
        raise PolicyError(f"sticky_header of model '{model}' must be a string")
    shadow = _shadow(model, raw["shadow"]) if raw.get("shadow") is not None else None
    pairs = tuple(weights.items())
    if all(arm.isdigit() for arm in weights):
        pairs = tuple(sorted(pairs, key=lambda kv: int(kv[0])))
    return ModelPolicy(pairs, sticky.lower(), shadow)


def parse_policies(raw: object) -> dict[str, ModelPolicy]:
    """A whole routing document: `{models: {<model>: <policy>}}`."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("models", {}), Mapping):
        raise PolicyError("a routing document must be a mapping with a 'models' mapping")
    models: Mapping[str, Any] = raw.get("models") or {}
    policies = {str(name): parse_policy(str(name), policy) for name, policy in models.items()}
    check_links(policies)
    return policies


def check_links(policies: Mapping[str, ModelPolicy], only: str = "") -> None:
    """Arms name models that serve: an arm may not name a model that an experiment routes
    to other models in turn (a chain, or a cycle back), since which would answer is unclear.
    With `only`, just the links from or to that model are checked."""
    for name, policy in policies.items():
        for arm in policy.arms():
            target = arm_target(arm)[0]
            if only and only not in (name, target):
                continue
            onward = policies.get(target) if target else None
            if onward is None or not onward.routes_elsewhere:
                continue
            back = any(arm_target(a)[0] == name for a in onward.arms())
            shape = f"a cycle: '{name}' -> '{target}' -> '{name}'" if back else "a chain"
            raise PolicyError(
                f"arm '{arm}' of model '{name}' names model '{target}', which routes to other models ({shape}); "
                "arms must name models that serve"
            )


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
        """`ready`: the arms some healthy instance serves (None = unknown: all are). A
        requested version names an arm, or else a version of the called model.
        `draw_key` (a sequence's) replaces the random draw by weight with the weighted
        rendezvous choice on it, which every gateway makes alike."""
        if policy is None:
            return Decision(requested, Reason.EXPLICIT if requested else Reason.DEFAULT)
        shadow = self._shadow(policy)
        if requested:
            if requested in policy.arms():
                return _decided(requested, Reason.EXPLICIT, (), shadow)
            return Decision(
                requested, Reason.EXPLICIT, shadow=shadow.version if shadow and shadow.version != requested else ""
            )
        live = [(v, w) for v, w in policy.weights if w > 0 and (ready is None or v in ready)]
        skipped = tuple(v for v, w in policy.weights if w > 0 and ready is not None and v not in ready)
        if not live:
            if policy.routes_elsewhere:
                # The called name may serve nothing itself: the first arm answers (or says why not).
                return _decided(next(v for v, w in policy.weights if w > 0), Reason.DEFAULT, skipped, None)
            return Decision("", Reason.DEFAULT, skipped)
        key = headers.get(policy.sticky_header, "") if policy.sticky_header else ""
        if key:
            arm = max(live, key=lambda vw: sticky_score(key, vw[0], vw[1]))[0]
            reason = Reason.STICKY
        elif draw_key:
            arm = max(live, key=lambda vw: sticky_score(draw_key, vw[0], vw[1]))[0]
            reason = Reason.WEIGHTED
        else:
            arm = self._draw(live)
            reason = Reason.WEIGHTED
        return _decided(arm, reason, skipped, shadow, key)

    def _draw(self, live: list[tuple[str, float]]) -> str:
        point = self._rng.random() * sum(w for _, w in live)
        for version, weight in live:
            point -= weight
            if point < 0:
                return version
        return live[-1][0]

    def _shadow(self, policy: ModelPolicy) -> Shadow | None:
        shadow = policy.shadow
        if shadow is None or shadow.fraction <= 0:
            return None
        return shadow if self._rng.random() < shadow.fraction else None


def _decided(arm: str, reason: Reason, skipped: tuple[str, ...], shadow: Shadow | None, key: str = "") -> Decision:
    """The decision to send to `arm`, mirrored to `shadow` unless that is the same arm."""
    model, version = arm_target(arm)
    mirrored = shadow if shadow is not None and shadow.version != arm else None
    return Decision(version, reason, skipped, mirrored.version if mirrored else "", key, model, mirrored)
