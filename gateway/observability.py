"""The trace and log settings that clients read and change through the API.

Trace settings are a global set plus per-model overrides; every value is a list of
strings, as the protocol carries them. Log settings (protos.logs) apply to Python logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from protos.logs import LogSettings, LogValue
from protos.status import invalid_arg, unsupported

__all__ = ["LogSettings", "LogValue", "TraceSettings"]

TRACE_DEFAULTS: dict[str, tuple[str, ...]] = {
    "trace_file": ("",),
    "trace_level": ("OFF",),
    "trace_rate": ("1000",),
    "trace_count": ("-1",),
    "log_frequency": ("0",),
    "trace_mode": ("triton",),
}
TRACE_LEVELS = frozenset({"OFF", "TIMESTAMPS", "TENSORS"})
_INTEGER_SETTINGS = frozenset({"trace_rate", "trace_count", "log_frequency"})


class TraceSettings:
    """Global trace settings and per-model overrides.

    An update that gives a setting no values clears it: a model's override falls
    back to the global value, a global value falls back to its default.
    """

    def __init__(self) -> None:
        self._global: dict[str, tuple[str, ...]] = dict(TRACE_DEFAULTS)
        self._models: dict[str, dict[str, tuple[str, ...]]] = {}

    def get(self, model: str = "") -> dict[str, tuple[str, ...]]:
        settings = dict(self._global)
        if model:
            settings.update(self._models.get(model, {}))
        return settings

    def update(self, model: str, updates: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
        # Validate everything first, so a bad request changes nothing.
        for key, values in updates.items():
            _validate_trace(key, values)
        target = self._models.setdefault(model, {}) if model else self._global
        for key, values in updates.items():
            if values:
                target[key] = tuple(values)
            elif model:
                target.pop(key, None)
            else:
                target[key] = TRACE_DEFAULTS[key]
        if model and not target:
            self._models.pop(model, None)
        return self.get(model)


def _validate_trace(key: str, values: Sequence[str]) -> None:
    if key not in TRACE_DEFAULTS:
        raise invalid_arg(f"Unknown trace setting '{key}'")
    if not values:
        return
    if key in ("trace_file", "trace_mode"):
        raise unsupported(f"'{key}' can not be updated through network protocol")
    if key == "trace_level":
        for value in values:
            if value not in TRACE_LEVELS:
                raise invalid_arg(f"Unknown trace level '{value}', expected one of OFF, TIMESTAMPS, TENSORS")
        return
    if len(values) != 1:
        raise invalid_arg(f"expect only 1 value for '{key}'")
    if key in _INTEGER_SETTINGS:
        try:
            int(values[0])
        except ValueError:
            raise invalid_arg(f"Unable to parse '{key}', got: {values[0]}") from None
