"""Restricted APIs, as Triton's `--http-restricted-api` and `--grpc-restricted-protocol`:
each API group may require one header (HTTP) or metadata key (gRPC) with one value.

A spec reads `<api>[,<api>...]:<key>=<value>`; the front ends look a group up in the
resulting dict, so an unrestricted API costs one dict miss.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Triton's API groups (src/restricted_features.h).
GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

GRPC_KEY_PREFIX = "triton-grpc-protocol-"

# Which group each RPC of the v2 service belongs to (Triton's grouping).
GRPC_METHOD_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


class RestrictionError(ValueError):
    """A restriction spec that cannot be parsed, names an unknown group, or restricts
    one group twice."""


@dataclass(frozen=True)
class Restriction:
    """The header (HTTP) or metadata key (gRPC, lower-cased) and the value it must carry."""

    key: str
    value: str


def parse_restrictions(specs: Iterable[str], *, grpc: bool = False) -> dict[str, Restriction]:
    """Group -> restriction, from the flag's values; gRPC keys gain Triton's prefix."""
    restrictions: dict[str, Restriction] = {}
    for spec in specs:
        apis, colon, assignment = spec.partition(":")
        key, equals, value = assignment.partition("=")
        if not colon or not equals or not apis or not key:
            raise RestrictionError(f"restricted API spec {spec!r} is not '<api>[,<api>...]:<key>=<value>'")
        # HTTP headers are case-insensitive and gRPC metadata keys are lower case.
        key = (GRPC_KEY_PREFIX + key if grpc else key).lower()
        for api in apis.split(","):
            api = api.strip()
            if api not in GROUPS:
                raise RestrictionError(f"unknown restricted API '{api}'; expected one of {', '.join(GROUPS)}")
            if api in restrictions:
                raise RestrictionError(f"restricted API '{api}' is restricted more than once")
            restrictions[api] = Restriction(key, value)
    return restrictions


def http_refusal(restriction: Restriction) -> str:
    return f"This API is restricted, expecting header '{restriction.key}'"


def grpc_refusal(restriction: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{restriction.key}'"
