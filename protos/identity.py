"""Who answers ServerMetadata: the name and version Triton's clients expect, and the
protocol extensions each of our two servers implements end to end."""

from __future__ import annotations

from collections.abc import Sequence

from protos import grpc_service_pb2 as pb

SERVER_NAME = "triton"
SERVER_VERSION = "2.73.0"  # the Triton protocol level we match

# In Triton's order. Only what works end to end: no cuda_shared_memory or generate.
GATEWAY_EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
# A sidecar serves models only: client shared memory, trace and log settings are the gateway's.
SIDECAR_EXTENSIONS = tuple(e for e in GATEWAY_EXTENSIONS if e not in {"system_shared_memory", "trace", "logging"})


def server_metadata(extensions: Sequence[str]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=extensions)
