"""Business-logic scripting: a python model's `InferenceRequest(...).exec()` runs on the
gateway's gRPC port, so it reaches any model of the fleet through the gateway's routing
(any framework, weighted versions, failover). Errors come back inside the response, as
Triton's BLS gives them. Runs in a model instance's process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc

from protos import codec
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from protos.datatypes import from_name, from_numpy
from protos.rpc import MESSAGE_SIZE_OPTIONS
from protos.sequence import as_int64
from protos.status import CAUSE_METADATA, REFUSAL_STATUS_PARAMETER, Cause, Status, cause_named, status_from_grpc
from sidecars.python import backend_utils as pb_utils
from sidecars.python.channel import GatewayTls

_NO_GATEWAY = (
    "BLS needs the gateway's gRPC port: `turnout up` passes it to the python sidecar when gRPC is on; "
    "a sidecar started alone takes --backend-config gateway=HOST:PORT (and gateway-root-cert=PEM, "
    "gateway-cert=PEM, gateway-key=PEM where that port serves TLS)"
)


class BlsClient:
    def __init__(self, gateway: str, tls: GatewayTls | None = None) -> None:
        self._gateway = gateway
        self._tls = tls
        self._stub: pb_grpc.GRPCInferenceServiceStub | None = None

    def _service(self) -> pb_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            tls = self._tls
            if tls is None:
                channel = grpc.insecure_channel(self._gateway, options=MESSAGE_SIZE_OPTIONS)
            else:
                credentials = grpc.ssl_channel_credentials(
                    _read(tls.root_cert), _read(tls.key) if tls.key else None, _read(tls.cert) if tls.cert else None
                )
                options: list[tuple[str, int | str]] = list(MESSAGE_SIZE_OPTIONS)
                if tls.server_name:
                    options.append(("grpc.ssl_target_name_override", tls.server_name))
                channel = grpc.secure_channel(self._gateway, credentials, options=options)
            self._stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return self._stub

    def execute(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        if not self._gateway:
            failed = _failed(Status.UNAVAILABLE.value, _NO_GATEWAY)
            return pb_utils.ResponseIterator(iter([failed])) if decoupled else failed
        try:
            message = _message(request)
        except (pb_utils.TritonModelException, codec.CodecError) as exc:
            failed = _failed(Status.INVALID_ARG.value, str(exc))
            return pb_utils.ResponseIterator(iter([failed])) if decoupled else failed
        timeout = request.timeout() / 1e6 if request.timeout() else None
        if decoupled:
            return pb_utils.ResponseIterator(self._stream(message, timeout))
        try:
            return _response(self._service().ModelInfer(message, timeout=timeout, metadata=_ASK_CAUSE))
        except grpc.RpcError as exc:
            return _call_failed(request.model_name, exc)

    def _stream(self, message: pb.ModelInferRequest, timeout: float | None) -> Iterator[pb_utils.InferenceResponse]:
        """The responses of one request on ModelStreamInfer, up to the one marked final;
        as Triton's iterator, the final flag sent alone is an empty last response."""
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        try:
            answers = self._service().ModelStreamInfer(iter([message]), timeout=timeout, metadata=_ASK_CAUSE)
            for answer in answers:
                final = answer.infer_response.parameters.get("triton_final_response")
                if final is None:  # refused before it ran: the stream says so without a final flag
                    named = answer.infer_response.parameters.get(REFUSAL_STATUS_PARAMETER)
                    status = (
                        Status.__members__.get(named.string_param, Status.INTERNAL)
                        if named is not None
                        else Status.INTERNAL
                    )
                    yield _refused(message.model_name, status, None, answer.error_message)
                    return
                if answer.error_message:
                    yield _failed(Status.INTERNAL.value, answer.error_message)
                else:
                    yield _response(answer.infer_response)
                if final.bool_param:
                    return
        except grpc.RpcError as exc:
            yield _failed(status_from_grpc(exc.code()).value, exc.details() or str(exc.code()))


# Sent with each call, so that the gateway tells a model's error response from a refusal.
_ASK_CAUSE = ((CAUSE_METADATA, "1"),)


def _call_failed(model: str, error: grpc.RpcError) -> pb_utils.InferenceResponse:
    """A failed one-answer call: the model's own error response as it is, else a refusal."""
    details = error.details() or str(error.code())
    causes = [str(value) for key, value in error.trailing_metadata() or () if key == CAUSE_METADATA]
    cause = cause_named(causes[0]) if causes else None
    status = status_from_grpc(error.code())
    if cause is Cause.RESPONSE:
        return _failed(status.value, details)
    return _refused(model, status, cause, details)


def _refused(model: str, status: Status, cause: Cause | None, details: str) -> pb_utils.InferenceResponse:
    """A request refused before it ran, as the python backend's BLS gives it: an internal
    error naming the model before the text; a model it cannot find is not ready, a
    decoupled model asked for one answer gets the backend's own sentence."""
    if cause is Cause.DECOUPLED:
        details = (
            f"Model {model} is using the decoupled. The current BLS request call doesn't support models using the "
            "decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls "
            "for decoupled models.'"
        )
    elif status is Status.NOT_FOUND:
        details = f"Failed for execute the inference request. Model '{model}' is not ready."
    return _failed(Status.INTERNAL.value, f"Model {model} - Error when running inference: {details}")


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _failed(code: str, message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _message(request: pb_utils.InferenceRequest) -> pb.ModelInferRequest:
    version = request.model_version
    message = pb.ModelInferRequest(
        model_name=request.model_name,
        model_version=str(version) if version is not None and version >= 0 else "",
        id=request.request_id(),
    )
    for tensor in request.inputs():
        array = tensor.as_numpy()
        datatype = from_numpy(array.dtype)
        if datatype is None:
            raise pb_utils.TritonModelException(f"input '{tensor.name()}': unsupported numpy dtype {array.dtype}")
        message.inputs.add(name=tensor.name(), datatype=datatype.name, shape=list(array.shape))
        message.raw_input_contents.append(codec.to_raw(array, datatype))
    for name in request.requested_output_names():
        message.outputs.add(name=name)
    correlation_id = request.correlation_id()
    if correlation_id:
        if isinstance(correlation_id, str):
            message.parameters["sequence_id"].string_param = correlation_id
        else:
            message.parameters["sequence_id"].int64_param = as_int64(correlation_id)
        flags = request.flags()
        message.parameters["sequence_start"].bool_param = bool(
            flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        )
        message.parameters["sequence_end"].bool_param = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    for key, value in json.loads(request.parameters() or "{}").items():
        codec.set_parameter(message.parameters[key], value)
    if request.timeout():
        message.parameters["timeout"].int64_param = request.timeout()
    return message


def _response(message: pb.ModelInferResponse) -> pb_utils.InferenceResponse:
    tensors = []
    for index, output in enumerate(message.outputs):
        datatype = from_name(output.datatype)
        if datatype is None:
            continue
        shape = list(output.shape)
        if index < len(message.raw_output_contents):
            array = codec.from_raw(message.raw_output_contents[index], datatype, shape)
        else:
            array = codec.from_contents(_contents(output.contents, datatype.contents_field), datatype, shape)
        tensors.append(pb_utils.Tensor(output.name, array))
    parameters = {}
    for key, value in message.parameters.items():
        which = value.WhichOneof("parameter_choice")
        if which in ("bool_param", "int64_param", "uint64_param", "string_param") and not key.startswith("triton_"):
            parameters[key] = getattr(value, which)
    return pb_utils.InferenceResponse(output_tensors=tensors, parameters=parameters)


def _contents(contents: pb.InferTensorContents, field: str | None) -> list[Any]:
    return list(getattr(contents, field)) if field else []
