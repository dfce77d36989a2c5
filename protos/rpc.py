"""The gRPC service both processes serve: its name, its methods, channel limits, TLS
credentials, and the one error ladder every RPC of either server ends through."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NoReturn

import grpc

from protos import grpc_service_pb2 as pb
from protos.status import CAUSE_METADATA, TurnoutError

SERVICE = "inference.GRPCInferenceService"

# A serialized ModelInferRequest parsed; looked up once, since each lookup of FromString on
# a protobuf class goes through its metaclass, which first fails to find it on the type.
parse_infer_request = pb.ModelInferRequest.FromString

# Triton and tritonclient allow INT32_MAX bytes both ways; grpcio's default is 4 MiB.
MAX_MESSAGE_BYTES = 2**31 - 1
MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class Method:
    name: str  # as in the .proto: "ModelInfer"
    request: str  # message type names in grpc_service_pb2
    response: str
    streaming: bool = False

    @property
    def path(self) -> str:
        return f"/{SERVICE}/{self.name}"


METHODS: tuple[Method, ...] = (
    Method("ServerLive", "ServerLiveRequest", "ServerLiveResponse"),
    Method("ServerReady", "ServerReadyRequest", "ServerReadyResponse"),
    Method("ModelReady", "ModelReadyRequest", "ModelReadyResponse"),
    Method("ServerMetadata", "ServerMetadataRequest", "ServerMetadataResponse"),
    Method("ModelMetadata", "ModelMetadataRequest", "ModelMetadataResponse"),
    Method("ModelInfer", "ModelInferRequest", "ModelInferResponse"),
    Method("ModelStreamInfer", "ModelInferRequest", "ModelStreamInferResponse", streaming=True),
    Method("ModelConfig", "ModelConfigRequest", "ModelConfigResponse"),
    Method("ModelStatistics", "ModelStatisticsRequest", "ModelStatisticsResponse"),
    Method("RepositoryIndex", "RepositoryIndexRequest", "RepositoryIndexResponse"),
    Method("RepositoryModelLoad", "RepositoryModelLoadRequest", "RepositoryModelLoadResponse"),
    Method("RepositoryModelUnload", "RepositoryModelUnloadRequest", "RepositoryModelUnloadResponse"),
    Method("SystemSharedMemoryStatus", "SystemSharedMemoryStatusRequest", "SystemSharedMemoryStatusResponse"),
    Method("SystemSharedMemoryRegister", "SystemSharedMemoryRegisterRequest", "SystemSharedMemoryRegisterResponse"),
    Method(
        "SystemSharedMemoryUnregister", "SystemSharedMemoryUnregisterRequest", "SystemSharedMemoryUnregisterResponse"
    ),
    Method("CudaSharedMemoryStatus", "CudaSharedMemoryStatusRequest", "CudaSharedMemoryStatusResponse"),
    Method("CudaSharedMemoryRegister", "CudaSharedMemoryRegisterRequest", "CudaSharedMemoryRegisterResponse"),
    Method("CudaSharedMemoryUnregister", "CudaSharedMemoryUnregisterRequest", "CudaSharedMemoryUnregisterResponse"),
    Method("TraceSetting", "TraceSettingRequest", "TraceSettingResponse"),
    Method("LogSettings", "LogSettingsRequest", "LogSettingsResponse"),
)

BY_NAME: dict[str, Method] = {m.name: m for m in METHODS}


def server_credentials(cert: str, key: str, root: str, mutual: bool) -> grpc.ServerCredentials:
    """Triton's --grpc-use-ssl[-mutual]: the server's certificate and key files and, with
    mutual TLS, the CA file (`root`) that must have signed every client's certificate."""

    def read(path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    roots = read(root) if root else None
    pair = (read(key), read(cert))
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=mutual)


async def abort_call(context: grpc.aio.ServicerContext, error: Exception, method: str, log: logging.Logger) -> NoReturn:
    """End an RPC that raised `error`: a TurnoutError with its gRPC status and Triton's
    text, and its cause in the trailing metadata; anything else is logged on `log` (the
    serving process's) and ends as INTERNAL with its text. Callers let CancelledError and
    grpc.aio.AbortError pass: those already end the call. The server keeps serving either way."""
    if isinstance(error, TurnoutError):
        if error.cause is not None:
            await context.abort(error.grpc_status, error.message, ((CAUSE_METADATA, error.cause.value),))
        await context.abort(error.grpc_status, error.message)
    log.error("%s failed", method, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, str(error) or type(error).__name__)
    raise AssertionError("unreachable: context.abort raises")
