"""A request's sequence as the v2 protocol carries it: the `sequence_id`, `sequence_start`
and `sequence_end` parameters, read with Triton's texts for values of the wrong type.

The sidecar reads them strictly (a wrong type is the client's error); the gateway only
needs to know which sequence a request belongs to, and leaves errors to the sidecar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protos import grpc_service_pb2 as pb
from protos.status import TurnoutError, invalid_arg, unsupported

# Triton refuses longer string correlation ids when the request is built.
MAX_STRING_SEQUENCE_ID = 128


@dataclass(frozen=True)
class SequenceFlags:
    """A request's `sequence_id` (0 or "" when it gave none) and its START and END flags."""

    id: int | str
    start: bool
    end: bool


def as_int64(value: int) -> int:
    """A uint64 (an HTTP sequence id or timeout) as the int64 parameter that carries it:
    Triton reads an int64 id or timeout back as a uint64, so nothing is lost."""
    return value - 2**64 if value >= 2**63 else value


def read_sequence(parameters: Any) -> SequenceFlags:
    """The sequence parameters of a request's `parameters` map; raises TurnoutError with
    Triton's text for a wrong type. An id is an int64 (read as uint64) or a string."""
    sequence_id: int | str = 0
    if "sequence_id" in parameters:
        parameter = parameters["sequence_id"]
        which = parameter.WhichOneof("parameter_choice")
        if which == "string_param":
            text: str = parameter.string_param
            if len(text) > MAX_STRING_SEQUENCE_ID:
                raise unsupported("string correlation ID cannot be longer than 128 characters")
            sequence_id = text
        elif which == "int64_param":
            sequence_id = parameter.int64_param % 2**64  # Triton reads an int64 id as uint64
        else:
            raise invalid_arg("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
    return SequenceFlags(sequence_id, _flag(parameters, "sequence_start"), _flag(parameters, "sequence_end"))


def sequence_of(request: pb.ModelInferRequest) -> SequenceFlags | None:
    """The request's sequence, or None for requests outside one (no or zero id) and for
    parameters the sidecar will refuse. Costs one empty-map check for requests without
    parameters."""
    parameters = request.parameters
    if not parameters or "sequence_id" not in parameters:
        return None
    try:
        sequence = read_sequence(parameters)
    except TurnoutError:
        return None
    return sequence if sequence.id not in (0, "") else None


def _flag(parameters: Any, key: str) -> bool:
    if key not in parameters:
        return False
    parameter = parameters[key]
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
    return bool(parameter.bool_param)
