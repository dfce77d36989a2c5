"""The trace settings in force, as Triton's TraceManager keeps them: the global setting
and per-model overrides, each with its own sampling state, changed through the trace
API and read once per inference request.

An update replaces a setting, never changes it: a model's setting takes the values the
API gave it (kept across later updates until cleared) and the global setting's for the
rest, and is made again when the global setting changes; clearing every value of a
model's setting drops it. Sampling is Triton's: with rate N, every N-th request of the
setting is traced while its count (-1: unlimited) lasts. Everything here runs on the
event loop thread, so it needs no lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.tracing.config import LEVEL_ORDER, TraceConfig, TraceMode
from gateway.tracing.files import TraceFile, TraceFiles
from protos.cnum import c_stoi
from protos.status import invalid_arg, unsupported

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
# The settings a client may change, by their protocol names.
CHANGEABLE = ("trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass(frozen=True)
class Values:
    level: frozenset[str]
    rate: int
    count: int
    log_frequency: int


@dataclass(eq=False)
class Setting:
    """One setting in force (Triton's TraceSetting): its values, which of them the API
    set (`specified`), and its state: requests counted, traces made and collected, and
    the traces waiting to be written to its file."""

    level: frozenset[str]
    rate: int
    count: int  # traces still to make; -1: no limit
    log_frequency: int
    mode: TraceMode
    file_name: str
    file: TraceFile | None
    specified: frozenset[str] = frozenset()
    sampled: int = 0
    created: int = 0
    collected: int = 0
    pending: list[str] = field(default_factory=list)
    retired: bool = False

    @property
    def invalid_reason(self) -> str:
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode is TraceMode.TRITON and not self.file_name:
            return "trace file name is not given"
        return ""

    @property
    def valid(self) -> bool:
        return not self.invalid_reason and self.count != 0

    def sample(self, force: bool = False) -> bool:
        """Whether this request is traced (Triton's SampleTrace): every `rate`-th request
        counted while the setting is valid, as long as `count` lasts; `force` (a client's
        propagated OpenTelemetry context) traces it regardless. Rate 0 counts nothing."""
        hit = False
        if self.rate != 0:
            if not self.valid and not force:
                return False
            self.sampled += 1
            hit = self.sampled % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
                self.created += 1
            elif hit and self.count == 0:
                hit = False
        return hit or force

    def collect(self, trace: str) -> None:
        """Take one finished trace's JSON objects (Triton's WriteTrace): they go to the
        next indexed file once `log_frequency` traces are waiting, or once the count is
        spent and every trace it made is in; else they wait for the setting to retire."""
        self.pending.append(trace)
        self.collected += 1
        if self.retired:
            self._save(indexed=self.log_frequency != 0)
        elif (self.log_frequency and len(self.pending) >= self.log_frequency) or (
            # Triton compares with every request counted, which holds only at rate 1;
            # the traces made is what it means.
            self.count == 0 and self.collected >= self.created
        ):
            self._save(indexed=True)

    def retire(self) -> None:
        """Replaced or shut down: what waits goes to the main file (to the next indexed
        one with a log frequency), and traces still running write as they finish."""
        self.retired = True
        if self.pending:
            self._save(indexed=self.log_frequency != 0)

    def _save(self, indexed: bool) -> None:
        if self.file is not None and self.pending:
            self.file.save(self.pending, indexed)
        self.pending = []

    def values(self) -> Values:
        return Values(self.level, self.rate, self.count, self.log_frequency)


class TraceSettings:
    """The global trace setting and the models' own; `config` holds the start-up values
    (where clearing a global value returns). `files` receives Triton-mode traces."""

    def __init__(self, config: TraceConfig, files: TraceFiles | None = None) -> None:
        self._config = config
        self._files = files
        self._default = Values(config.level, config.rate, config.count, config.log_frequency)
        self.global_setting = self._make(self._default, frozenset())
        self._models: dict[str, Setting] = {}
        self._following_global: set[str] = set()  # models whose setting takes global values

    @property
    def mode(self) -> TraceMode:
        return self._config.mode

    def get(self, model: str) -> Setting:
        """The setting a request for `model` samples with (once per request: one lookup)."""
        return self._models.get(model, self.global_setting)

    def update(self, model: str, updates: Mapping[str, Sequence[str]]) -> None:
        """Apply a client's update ("" = the global setting) as Triton reads one: the
        settings it knows, in its order (a key with no values clears it), every other
        name ignored. Raises TurnoutError with Triton's text, having changed nothing."""
        if "trace_file" in updates:
            raise unsupported("trace file location can not be updated through network protocol")
        given: dict[str, object] = {}
        cleared: set[str] = set()
        for key in CHANGEABLE:
            if key not in updates:
                continue
            value = parse_setting(key, updates[key])
            if value is None:
                cleared.add(key)
            elif value is not _UNCHANGED:
                given[key] = value
        self._update(model, given, cleared)
        if not model:
            # Models that take some values from the global setting take the new ones.
            for name in sorted(self._following_global):
                self._update(name, {}, set())

    def _update(self, model: str, given: Mapping[str, object], cleared: set[str]) -> None:
        current = self._models.get(model) if model else self.global_setting
        fallback = self.global_setting.values() if model else self._default
        specified = {
            key
            for key in CHANGEABLE
            if key not in cleared and (key in given or (current is not None and key in current.specified))
        }
        changes: dict[str, Any] = {
            _FIELDS[key]: given[key] if key in given else _value_of(current, key) for key in specified
        }
        values = replace(fallback, **changes)
        if model and not specified:
            dropped = self._models.pop(model, None)
            self._following_global.discard(model)
            if dropped is not None:
                dropped.retire()
            return
        setting = self._make(values, frozenset(specified))
        if not setting.valid and setting.level:
            raise invalid_arg(f"Attempting to set invalid trace setting :{setting.invalid_reason}")
        if model:
            # A model's setting never names its own file, so it always follows the global one in part.
            self._following_global.add(model)
            old = self._models.get(model)
            self._models[model] = setting
        else:
            old = self.global_setting
            self.global_setting = setting
        if old is not None:
            old.retire()

    def _make(self, values: Values, specified: frozenset[str]) -> Setting:
        path = self._config.file if self._config.mode is TraceMode.TRITON else ""
        file = self._files.get(path) if path and self._files is not None else None
        return Setting(
            values.level,
            values.rate,
            values.count,
            values.log_frequency,
            self._config.mode,
            path,
            file,
            specified,
        )

    def report(self, model: str) -> dict[str, tuple[str, ...]]:
        """What the trace API answers for `model` ("" = global): Triton's keys and, in
        OpenTelemetry mode, the exporter's settings instead of the file's."""
        setting = self.get(model)
        levels = tuple(level for level in LEVEL_ORDER if level in setting.level) or ("OFF",)
        answer: dict[str, tuple[str, ...]] = {
            "trace_level": levels,
            "trace_rate": (str(setting.rate),),
            "trace_count": (str(setting.count),),
        }
        if self._config.mode is TraceMode.TRITON:
            answer["log_frequency"] = (str(setting.log_frequency),)
            answer["trace_file"] = (self._config.file,)
        answer["trace_mode"] = (self._config.mode.value,)
        if self._config.mode is TraceMode.OPENTELEMETRY:
            otel = self._config.opentelemetry
            answer["url"] = (otel.url,)
            answer["resource"] = tuple(f"{key}={value}" for key, value in otel.resource)
            answer["bsp_max_queue_size"] = (str(otel.bsp_max_queue_size),)
            answer["bsp_schedule_delay"] = (str(otel.bsp_schedule_delay),)
            answer["bsp_max_export_batch_size"] = (str(otel.bsp_max_export_batch_size),)
        return answer

    def close(self) -> None:
        """Shutting down: every setting's waiting traces go to their files."""
        for setting in (self.global_setting, *self._models.values()):
            setting.retire()


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def _value_of(setting: Setting | None, key: str) -> object:
    assert setting is not None
    return getattr(setting, _FIELDS[key])


_UNCHANGED = object()  # a trace_level update naming no level Triton knows


def parse_setting(key: str, values: Sequence[str], http: bool = False) -> object | None:
    """One setting of an update, in Triton's words when refused (its HTTP front words one
    of them a little differently); None clears it."""
    if not values:
        return None
    if key == "trace_level":
        if "OFF" in values and len(values) > 1:
            raise invalid_arg("Expect only one trace level 'OFF' is specified")
        known = frozenset(v for v in values if v in LEVEL_ORDER)
        if values[0] == "OFF":
            return known
        return known or _UNCHANGED  # Triton passes over names it does not know
    if len(values) != 1:
        raise invalid_arg(f"expect only 1 value for '{key}'")
    text = values[0]
    low, high = (-1, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
    try:
        number = c_stoi(text)
    except ValueError:
        raise invalid_arg(f"Unable to parse '{key}', got: {text}") from None
    except OverflowError:
        raise invalid_arg(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}") from None
    if key == "trace_count":
        if number < -1:
            got = "got:" if http else "got: "
            raise invalid_arg(f"Unable to parse 'trace_count'. Expecting value >= -1, {got}{text}")
        return number
    return number % 2**32  # an int read into Triton's uint32
