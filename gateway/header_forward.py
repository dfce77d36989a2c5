"""Triton's --http-header-forward-pattern and --grpc-header-forward-pattern: the request
headers (gRPC metadata) whose names the pattern matches anywhere reach the model as
string parameters of the inference request, for it to read as its own.

As in Triton, a matching name that is one of the parameters Triton reads itself, or
starts with `triton_`, refuses the request. HTTP header names arrive lowercase here
(the HTTP server folds them), as gRPC metadata keys always are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from protos import grpc_service_pb2 as pb
from protos.status import invalid_arg
from protos.wire import string_parameter

# Triton's kReservedParameterKeys (common.h).
RESERVED = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)


class HeaderForward:
    """One front end's pattern; an empty one forwards nothing."""

    def __init__(self, pattern: str) -> None:
        self._regex = re.compile(pattern) if pattern else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def matching(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (name, value) pairs to forward, in the order the headers came."""
        if self._regex is None:
            return []
        found = []
        for name, value in headers:
            if not self._regex.search(name):
                continue
            if name in RESERVED or name.startswith("triton_"):
                raise invalid_arg(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            found.append((name, value))
        return found


def set_parameters(request: pb.ModelInferRequest, pairs: list[tuple[str, str]]) -> None:
    for name, value in pairs:
        request.parameters[name].string_param = value


def parameters_suffix(pairs: list[tuple[str, str]]) -> bytes:
    """The pairs as serialized `parameters` entries: appended to a serialized request,
    protobuf merges them in (a later entry of a key wins)."""
    return b"".join(string_parameter(name, value) for name, value in pairs)
