"""`--trace-config`, as Triton's command line reads it, into one frozen TraceConfig.

Triton's syntax: `<setting>=<value>` for the global settings (level, rate, count, mode)
and `<mode>,<setting>=<value>` for a mode's own: `triton,file=...`, `triton,log-frequency=N`,
`opentelemetry,url=...`, `opentelemetry,resource=<key>=<value>` (repeatable) and the batch
span processor's `opentelemetry,bsp_max_queue_size=N`, `bsp_schedule_delay=MS`,
`bsp_max_export_batch_size=N`. As in Triton, the settings of the mode not chosen are
ignored, and so are names Triton does not know (each with a warning here).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any


class TraceMode(enum.Enum):
    TRITON = "triton"
    OPENTELEMETRY = "opentelemetry"


# Levels in the order Triton lists them; OFF is the empty set.
TIMESTAMPS = "TIMESTAMPS"
TENSORS = "TENSORS"
LEVEL_ORDER = (TIMESTAMPS, TENSORS)

DEFAULT_OTEL_URL = "http://localhost:4318/v1/traces"
DEFAULT_SERVICE_NAME = "triton-inference-server"


_BATCH_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")


class TraceConfigError(ValueError):
    """A --trace-config value Triton refuses; the text is Triton's."""


@dataclass(frozen=True)
class OpenTelemetryConfig:
    """Where spans go and how they are batched (Triton's defaults)."""

    url: str = DEFAULT_OTEL_URL
    resource: tuple[tuple[str, str], ...] = (("service.name", DEFAULT_SERVICE_NAME),)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512


@dataclass(frozen=True)
class TraceConfig:
    """The start-up trace settings: what the trace API reports until a client changes
    them, and what clearing a global setting returns to."""

    level: frozenset[str] = frozenset()  # empty: OFF
    rate: int = 1000
    count: int = -1
    mode: TraceMode = TraceMode.TRITON
    file: str = ""
    log_frequency: int = 0
    opentelemetry: OpenTelemetryConfig = field(default_factory=OpenTelemetryConfig)


def parse_level(text: str) -> frozenset[str]:
    """One level value as Triton's parser takes it (any case): OFF (or false), TIMESTAMPS
    (or true, on, min, max), TENSORS."""
    lowered = text.lower()
    if lowered in ("false", "off"):
        return frozenset()
    if lowered in ("true", "on", "min", "max", "timestamps"):
        return frozenset({TIMESTAMPS})
    if lowered == "tensors":
        return frozenset({TENSORS})
    raise TraceConfigError(f"invalid value for trace level option: {lowered}")


def _mode(text: str) -> TraceMode:
    lowered = text.lower()
    for mode in TraceMode:
        if mode.value == lowered:
            return mode
    raise TraceConfigError(
        f'invalid value for trace mode option: {lowered}. Available options are "triton" and "opentelemetry"'
    )


def _split(spec: str) -> tuple[TraceMode | None, str, str]:
    """`[<mode>,]<setting>=<value>` as Triton's ParseTraceConfigOption cuts it."""
    comma = spec.find(",")
    mode = None
    if comma == 0:
        raise TraceConfigError(
            "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or "
            f"<setting>=<value>. Got {spec}"
        )
    if comma > 0:
        mode = _mode(spec[:comma])
    equals = spec.find("=", comma + 1)
    setting, value = spec[comma + 1 : equals], spec[equals + 1 :]
    if equals < 0 or not setting or not value:
        raise TraceConfigError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {spec}")
    return mode, setting, value


def _integer(value: str, where: str, minimum: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceConfigError(f'Bad option: "--trace-config {where}". invalid value: {value}') from None
    if number < minimum:
        raise TraceConfigError(f'Bad option: "--trace-config {where}". value must be >= {minimum}: {value}')
    return number


def parse_trace_config(specs: Sequence[str]) -> tuple[TraceConfig, list[str]]:
    """The TraceConfig the `--trace-config` values give, and a warning for each setting
    that has no effect. Raises TraceConfigError with Triton's text."""
    parsed = [_split(spec) for spec in specs]
    warnings: list[str] = []
    config = TraceConfig()
    level: set[str] = set()
    level_off = False
    for mode, setting, value in parsed:
        if mode is not None:
            continue
        if setting == "level":
            one = parse_level(value)
            level_off |= not one  # an explicit OFF wins, as in Triton
            level |= one
        elif setting == "rate":
            config = replace(config, rate=_integer(value, "rate"))
        elif setting == "count":
            config = replace(config, count=_integer(value, "count", minimum=-1))
        elif setting == "mode":
            config = replace(config, mode=_mode(value))
        else:
            warnings.append(f"--trace-config {setting}={value} is not a trace setting; ignored")
    config = replace(config, level=frozenset() if level_off else frozenset(level))
    otel = config.opentelemetry
    resource = dict(otel.resource)
    for mode, setting, value in parsed:
        if mode is None:
            continue
        where = f"{mode.value},{setting}"
        if mode is not config.mode:
            warnings.append(f"--trace-config {where}={value} ignored: the trace mode is {config.mode.value}")
        elif mode is TraceMode.TRITON and setting == "file":
            config = replace(config, file=value)
        elif mode is TraceMode.TRITON and setting == "log-frequency":
            config = replace(config, log_frequency=_integer(value, where))
        elif mode is TraceMode.OPENTELEMETRY and setting == "url":
            otel = replace(otel, url=value)
        elif mode is TraceMode.OPENTELEMETRY and setting == "resource":
            key, _, attribute = value.partition("=")
            resource[key] = attribute
        elif mode is TraceMode.OPENTELEMETRY and setting in _BATCH_SETTINGS:
            changes: dict[str, Any] = {setting: _integer(value, where)}
            otel = replace(otel, **changes)
        else:
            warnings.append(f"--trace-config {where}={value} is not a {mode.value} setting; ignored")
    otel = replace(otel, resource=tuple(resource.items()))
    if otel.bsp_max_export_batch_size > otel.bsp_max_queue_size:
        raise TraceConfigError("--trace-config opentelemetry,bsp_max_export_batch_size exceeds bsp_max_queue_size")
    if TENSORS in config.level:
        warnings.append("trace level TENSORS records no tensors in turnout; only TIMESTAMPS are traced")
    return replace(config, opentelemetry=otel), warnings
