"""The one error type both processes raise, carrying Triton's protocol-neutral status.

Front ends map a Status to HTTP or gRPC exactly once, with the tables below.
"""

from __future__ import annotations

import enum

import grpc


class Status(enum.Enum):
    """Triton's error codes (TRITONSERVER_Error_Code), independent of transport."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


HTTP_STATUS: dict[Status, int] = {
    Status.UNKNOWN: 400,
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.INVALID_ARG: 400,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
    Status.ALREADY_EXISTS: 400,
    Status.CANCELLED: 400,
}

GRPC_STATUS: dict[Status, grpc.StatusCode] = {
    Status.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Status.INTERNAL: grpc.StatusCode.INTERNAL,
    Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Status.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Status.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Status.CANCELLED: grpc.StatusCode.CANCELLED,
}

# The way back, for errors a sidecar returned over gRPC. Codes Triton never
# sends (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ...) fold into the nearest status.
_FROM_GRPC: dict[grpc.StatusCode, Status] = {code: status for status, code in GRPC_STATUS.items()}
_FROM_GRPC.update(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED: Status.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED: Status.UNAVAILABLE,
        grpc.StatusCode.FAILED_PRECONDITION: Status.INVALID_ARG,
        grpc.StatusCode.OUT_OF_RANGE: Status.INVALID_ARG,
        grpc.StatusCode.PERMISSION_DENIED: Status.UNAVAILABLE,
        grpc.StatusCode.UNAUTHENTICATED: Status.UNAVAILABLE,
        grpc.StatusCode.ABORTED: Status.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS: Status.INTERNAL,
    }
)


def status_from_grpc(code: grpc.StatusCode) -> Status:
    return _FROM_GRPC.get(code, Status.UNKNOWN)


_CODE_STRING = {
    Status.UNKNOWN: "Unknown",
    Status.INTERNAL: "Internal",
    Status.NOT_FOUND: "Not found",
    Status.INVALID_ARG: "Invalid argument",
    Status.UNAVAILABLE: "Unavailable",
    Status.UNSUPPORTED: "Unsupported",
    Status.ALREADY_EXISTS: "Already exists",
    Status.CANCELLED: "Cancelled",
}


class Cause(enum.Enum):
    """Why an error happened, where the gateway acts on it (a field, so that no one matches
    message texts); it crosses the hop from sidecar to gateway beside the status."""

    UNKNOWN_SEQUENCE = "unknown-sequence"  # a sequence's later request reached a replica that does not hold it
    # The model answered with an error (Triton's error response), where other errors refuse
    # the request before it runs: on a gRPC stream Triton words the two differently.
    RESPONSE = "response"
    # A decoupled model asked for one answer (ModelInfer): Triton's HTTP front words it its own way.
    DECOUPLED = "decoupled"
    # The model or version a request names is unknown or not READY: Triton's model lookup,
    # which its HTTP front makes before it reads an infer body (and answers untyped).
    UNKNOWN_MODEL = "unknown-model"


# The gRPC trailing metadata key that carries a Cause (the lane has its own field).
CAUSE_METADATA = "turnout-cause"
# A stream's in-band refusal has no status of its own; for a caller that sent
# CAUSE_METADATA, its response's parameter of this name holds the Status's name.
REFUSAL_STATUS_PARAMETER = "turnout_refusal_status"


def decoupled_refused() -> TurnoutError:
    """A decoupled model (or ensemble) asked for one answer, as the gRPC front words it; the
    HTTP front words it its own way (Cause.DECOUPLED)."""
    return TurnoutError(
        Status.UNSUPPORTED, "ModelInfer RPC doesn't support models with decoupled transaction policy", Cause.DECOUPLED
    )


def unknown_model(message: str, status: Status = Status.NOT_FOUND) -> TurnoutError:
    """Triton's model lookup failed: `message` is its "Request for unknown model: ..." text."""
    return TurnoutError(status, message, Cause.UNKNOWN_MODEL)


def model_not_found(name: str, version: str | int = "") -> TurnoutError:
    """Triton's lookup of a model, or of one version of it, found none."""
    which = f"'{name}' version {version}" if version != "" else f"'{name}'"
    return unknown_model(f"Request for unknown model: {which} is not found")


def cause_named(text: str) -> Cause | None:
    """The Cause a peer sent; None for none, or for one this side does not know."""
    try:
        return Cause(text) if text else None
    except ValueError:
        return None


class TurnoutError(Exception):
    """An error with a Triton status and Triton's message text, and its Cause where the
    gateway acts on one."""

    def __init__(self, status: Status, message: str, cause: Cause | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.cause = cause

    def __repr__(self) -> str:
        return f"TurnoutError({self.status.name}, {self.message!r})"

    def as_string(self) -> str:
        """Triton's Status::AsString, as its version states give a load failure's reason."""
        return f"{_CODE_STRING[self.status]}: {self.message}"

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.status]

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return GRPC_STATUS[self.status]


def invalid_arg(message: str) -> TurnoutError:
    return TurnoutError(Status.INVALID_ARG, message)


def load_failed(model: str, reason: str) -> TurnoutError:
    """Triton's answer to a load that failed past the repository poll: a line per model,
    each ending in a newline (a load of several models lists each that failed)."""
    return invalid_arg(f"load failed for model '{model}': {reason}\n")


def not_found(message: str) -> TurnoutError:
    return TurnoutError(Status.NOT_FOUND, message)


def unavailable(message: str) -> TurnoutError:
    return TurnoutError(Status.UNAVAILABLE, message)


def internal(message: str) -> TurnoutError:
    return TurnoutError(Status.INTERNAL, message)


def unsupported(message: str) -> TurnoutError:
    return TurnoutError(Status.UNSUPPORTED, message)
