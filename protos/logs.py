"""Triton's logging extension as both processes apply it: the log settings, the three
line formats (Triton's `default` and `ISO8601`, and `json`), and the request id that the
gateway passes to the sidecar and every log line about a request carries."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from protos.status import invalid_arg, unsupported
from protos.wire import string_parameter

# The request being served in this task ("" outside one); set by the gateway per
# inference and by the sidecar from what the gateway passed.
REQUEST_ID: ContextVar[str] = ContextVar("turnout_request_id", default="")
# The request parameter carrying the gateway's id when the client gave none; the
# sidecar reads and strips it.
REQUEST_ID_PARAMETER = "turnout_request_id"
LOG_FORMATS = ("default", "ISO8601", "json")

_LEVEL_LETTERS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "E"}


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class TritonFormatter(logging.Formatter):
    """Triton's text lines: `I1129 20:28:27.123456 4242 module:12] message` (default) or
    `2026-11-29T20:28:27Z I 4242 module:12] message` (ISO8601), the request id leading
    the message as Triton words it."""

    def __init__(self, iso8601: bool) -> None:
        super().__init__()
        self._iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LEVEL_LETTERS.get(record.levelname, "I")
        message = record.getMessage()
        request_id = getattr(record, "request_id", "")
        if request_id:
            message = f"[request id: {request_id}] {message}"
        where = f"{record.name}:{record.lineno}"
        if self._iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            line = f"{stamp} {letter} {record.process} {where}] {message}"
        else:
            micros = int((record.created % 1) * 1_000_000)
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
            line = f"{letter}{stamp}.{micros:06d} {record.process} {where}] {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, process, logger, message, request_id."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int((record.created % 1) * 1000):03d}Z",
            "level": record.levelname,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            document["request_id"] = request_id
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def formatter_for(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    return TritonFormatter(iso8601=log_format == "ISO8601")


LogValue = bool | int | str


class LogOptions(Protocol):
    """The log options a process's settings carry (Triton's --log-* flags)."""

    @property
    def log_file(self) -> str: ...
    @property
    def log_info(self) -> bool: ...
    @property
    def log_warning(self) -> bool: ...
    @property
    def log_error(self) -> bool: ...
    @property
    def log_verbose(self) -> int: ...
    @property
    def log_format(self) -> str: ...


@dataclass
class LogSettings:
    """Triton's log settings, applied to the Python loggers of this process. With a
    `log_file` (`--log-file`, fixed once started, as in Triton), lines go to that file
    (appended) instead of the console."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    _TYPES = {
        "log_file": str,
        "log_info": bool,
        "log_warning": bool,
        "log_error": bool,
        "log_verbose_level": int,
        "log_format": str,
    }

    @classmethod
    def of(cls, options: LogOptions) -> LogSettings:
        """The settings a process starts with, from its command line."""
        return cls(
            log_file=options.log_file,
            log_info=options.log_info,
            log_warning=options.log_warning,
            log_error=options.log_error,
            log_verbose_level=options.log_verbose,
            log_format=options.log_format,
        )

    def as_dict(self) -> dict[str, LogValue]:
        return {key: getattr(self, key) for key in self._TYPES}

    def update(self, updates: Mapping[str, LogValue]) -> dict[str, LogValue]:
        """Apply settings read by `log_updates` (or the HTTP front's reader), all or none."""
        for key, value in updates.items():
            if key == "log_file" or type(value) is not self._TYPES.get(key):
                raise invalid_arg(f"cannot set logging setting '{key}' to {value!r}")
        for key, value in updates.items():
            setattr(self, key, value)
        self.apply()
        return self.as_dict()

    def level(self) -> int:
        if self.log_verbose_level > 0:
            return logging.DEBUG
        if self.log_info:
            return logging.INFO
        if self.log_warning:
            return logging.WARNING
        if self.log_error:
            return logging.ERROR
        return logging.CRITICAL + 1

    def apply(self, logger: logging.Logger | None = None) -> None:
        """Set the level of `logger` (the root logger by default) from these settings and,
        for the root logger, the line format of its handlers (a stderr one if it has none)."""
        target = logger or logging.getLogger()
        target.setLevel(self.level())
        if logger is not None:
            return
        # Verbose is about requests. The HTTP client's line per request (each metrics scrape,
        # each Consul watch round) shows only at verbose level; its wire chatter never.
        verbose = self.log_verbose_level > 0
        logging.getLogger("httpx").setLevel(self.level() if verbose else max(self.level(), logging.WARNING))
        for chatty in ("httpcore", "hpack"):
            logging.getLogger(chatty).setLevel(max(self.level(), logging.INFO))
        self._route(target)
        if not target.handlers:
            target.addHandler(logging.StreamHandler(sys.stderr))
        formatter = formatter_for(self.log_format)
        for handler in target.handlers:
            handler.setFormatter(formatter)
            if not any(isinstance(f, _RequestIdFilter) for f in handler.filters):
                handler.addFilter(_RequestIdFilter())

    def _route(self, root: logging.Logger) -> None:
        """Send the root logger's lines to `log_file`, or back to the console. The state
        lives on the root logger (a process may hold several LogSettings views of it)."""
        current = next((h for h in root.handlers if isinstance(h, _LogFileHandler)), None)
        wanted = os.path.abspath(self.log_file) if self.log_file else ""
        if (current.baseFilename if current is not None else "") == wanted:
            return
        console = list(root.handlers) if current is None else current.console
        for handler in list(root.handlers):
            root.removeHandler(handler)
        if current is not None:
            current.close()
        for handler in [_LogFileHandler(wanted, console)] if wanted else console:
            root.addHandler(handler)


class _LogFileHandler(logging.FileHandler):
    """The `log_file` handler; keeps the console handlers it stands in for."""

    def __init__(self, path: str, console: list[logging.Handler]) -> None:
        super().__init__(path, encoding="utf-8")  # appends, as Triton does
        self.console = console


# The settings a client may change, in the order Triton reads them, with the value kind
# each must have. The log file is set at start only (--log-file), as in Triton.
_CHANGEABLE = (
    ("log_info", "bool_param", "boolean"),
    ("log_warning", "bool_param", "boolean"),
    ("log_error", "bool_param", "boolean"),
    ("log_verbose_level", "uint32_param", "int32"),
    ("log_format", "string_param", "string"),
)
LOG_FILE_FIXED = "log file location can not be updated through network protocol"


def log_updates(request: object) -> dict[str, LogValue]:
    """A LogSettingsRequest's settings as plain values, refused as Triton's gRPC front
    refuses them: the log file at all, a value of the wrong kind, an unknown format.
    Other names are ignored."""
    settings = request.settings  # type: ignore[attr-defined]
    if "log_file" in settings:
        raise unsupported(LOG_FILE_FIXED)
    updates: dict[str, LogValue] = {}
    for key, choice, kind in _CHANGEABLE:
        if key not in settings:
            continue
        value = settings[key]
        if value.WhichOneof("parameter_choice") != choice:
            raise invalid_arg(f"expect {kind} for '{key}'")
        updates[key] = getattr(value, choice)
    if "log_format" in updates and updates["log_format"] not in LOG_FORMATS:
        raise invalid_arg(f"invalid argument for log_format, got: {updates['log_format']}")
    return updates


def fill_log_response(current: Mapping[str, LogValue], response: object) -> None:
    """Write settings into a LogSettingsResponse."""
    for key, setting in current.items():
        entry = response.settings[key]  # type: ignore[attr-defined]
        if isinstance(setting, bool):
            entry.bool_param = setting
        elif isinstance(setting, int):
            entry.uint32_param = setting
        else:
            entry.string_param = setting


def request_id_parameter(request_id: str) -> bytes:
    """The serialized `parameters` entry {REQUEST_ID_PARAMETER: string_param=request_id} of a
    ModelInferRequest: appended to a serialized request, protobuf merges it in (no re-encode)."""
    return string_parameter(REQUEST_ID_PARAMETER, request_id)
