"""Protobuf messages <-> the JSON shapes Triton's HTTP API uses for everything but
inference: model config, metadata, statistics, repository index, shared-memory
status, trace and log settings.
"""

from __future__ import annotations

import binascii
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from gateway.shm import CUDA_IPC_HANDLE_SIZE
from gateway.tracing.settings import CHANGEABLE as TRACE_CHANGEABLE
from gateway.tracing.settings import parse_setting
from protos.grpc_service_pb2 import (
    CudaSharedMemoryRegisterRequest,
    CudaSharedMemoryStatusResponse,
    LogSettingsRequest,
    LogSettingsResponse,
    ModelMetadataResponse,
    ModelStatisticsResponse,
    RepositoryIndexResponse,
    RepositoryModelLoadRequest,
    RepositoryModelUnloadRequest,
    ServerMetadataResponse,
    SystemSharedMemoryRegisterRequest,
    SystemSharedMemoryStatusResponse,
    TraceSettingRequest,
    TraceSettingResponse,
)
from protos.logs import LOG_FILE_FIXED, LOG_FORMATS
from protos.model_config_pb2 import ModelConfig
from protos.status import internal, invalid_arg, unavailable, unsupported

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)

# int64 config fields Triton leaves as JSON strings (it rewrites only the others).
_CONFIG_STRING_INT64 = frozenset(
    {
        ("inference.ModelInstanceGroup.SecondaryDevice", "device_id"),
        ("inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "dim"),
        # Triton means to rewrite these but looks for them in the wrong object.
        ("inference.ModelSequenceBatching.InitialState", "dims"),
    }
)


def _numbers(descriptor: Descriptor, value: dict[str, Any], keep: frozenset[tuple[str, str]]) -> None:
    """Rewrite, in place, the 64-bit integers MessageToDict printed as strings, and put
    the keys in the .proto's declaration order, as Triton prints them."""
    for fd in descriptor.fields:
        if fd.name not in value:
            continue
        item = value[fd.name]
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            sub = fd.message_type
            if sub.GetOptions().map_entry:
                value_fd = sub.fields_by_name["value"]
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    for v in item.values():
                        _numbers(value_fd.message_type, v, keep)
                elif value_fd.type in _INT64_TYPES:
                    value[fd.name] = {k: int(v) for k, v in item.items()}
            elif isinstance(item, list):
                for v in item:
                    _numbers(sub, v, keep)
            else:
                _numbers(sub, item, keep)
        elif fd.type in _INT64_TYPES and (descriptor.full_name, fd.name) not in keep:
            value[fd.name] = [int(v) for v in item] if isinstance(item, list) else int(item)
    ordered = {fd.name: value[fd.name] for fd in descriptor.fields if fd.name in value}
    value.clear()
    value.update(ordered)


def _to_dict(message: Message, keep: frozenset[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    value: dict[str, Any] = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _numbers(message.DESCRIPTOR, value, keep)
    return value


def model_config(config: ModelConfig) -> dict[str, Any]:
    """ModelConfig as Triton prints it: proto names, enum names, defaults shown, int64 as numbers."""
    return _to_dict(config, _CONFIG_STRING_INT64)


def server_metadata(response: ServerMetadataResponse) -> dict[str, Any]:
    return {"name": response.name, "version": response.version, "extensions": list(response.extensions)}


def model_metadata(response: ModelMetadataResponse) -> dict[str, Any]:
    return {
        "name": response.name,
        "versions": list(response.versions),
        "platform": response.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in response.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in response.outputs],
    }


def statistics(response: ModelStatisticsResponse) -> dict[str, Any]:
    """Each model's entry in Triton's key order: response_stats follows inference_stats
    (the proto numbers it last)."""
    document = _to_dict(response)
    for index, entry in enumerate(document.get("model_stats", [])):
        if "response_stats" in entry and "inference_stats" in entry:
            keys = [key for key in entry if key != "response_stats"]
            keys.insert(keys.index("inference_stats") + 1, "response_stats")
            document["model_stats"][index] = {key: entry[key] for key in keys}
    return document


def repository_index(response: RepositoryIndexResponse) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for model in response.models:
        entry: dict[str, Any] = {"name": model.name}
        if model.version:
            entry["version"] = model.version
        if model.state:
            entry["state"] = model.state
        if model.reason:  # Triton leaves an empty reason out
            entry["reason"] = model.reason
        entries.append(entry)
    return entries


def system_shm_status(response: SystemSharedMemoryStatusResponse) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in response.regions.values()
    ]


def cuda_shm_status(response: CudaSharedMemoryStatusResponse) -> list[dict[str, Any]]:
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in response.regions.values()]


def _object(document: Any) -> dict[str, Any]:
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise internal("failed to parse the request JSON buffer: Invalid value. at 0")
    return document


def _member(document: dict[str, Any], name: str, kind: str) -> Any:
    if name not in document:
        raise internal(f"attempt to access non-existing object member '{name}'")
    value = document[name]
    if kind == "string" and not isinstance(value, str):
        raise internal("attempt to access JSON non-string as string")
    # Past 64 bits JSON numbers are doubles to rapidjson (Triton's parser), as here.
    if kind == "uint" and (type(value) is not int or not 0 <= value < 2**64):
        raise internal("attempt to access JSON non-unsigned-integer as unsigned-integer")
    if kind == "int" and (type(value) is not int or not -(2**63) <= value < 2**63):
        raise internal("attempt to access JSON non-signed-integer as signed-integer")
    return value


def system_shm_register(name: str, document: Any) -> SystemSharedMemoryRegisterRequest:
    """As current Triton reads a register request: `key` and `byte_size` must be there
    (INVALID_ARG when not), then each of a JSON kind TritonJson takes (INTERNAL)."""
    body = document if isinstance(document, dict) else {}
    if "key" not in body:
        raise invalid_arg("Shared memory register request has no 'key' field")
    key = _member(body, "key", "string")
    offset = _member(body, "offset", "uint") if "offset" in body else 0
    if "byte_size" not in body:
        raise invalid_arg("Shared memory register request has no 'byte_size' field")
    return SystemSharedMemoryRegisterRequest(
        name=name, key=key, offset=offset, byte_size=_member(body, "byte_size", "uint")
    )


_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_NOT_BASE64 = bytes(sorted(set(range(256)) - set(_BASE64_ALPHABET)))


def decode_base64(text: str) -> bytes:
    """Base64 as Triton decodes it (libb64): every character outside the alphabet, '='
    and line breaks among them, is skipped wherever it stands, and bits left over at the
    end that make no whole byte are dropped. It never fails."""
    digits = text.encode("utf-8", "surrogateescape").translate(None, _NOT_BASE64)
    whole = len(digits) - len(digits) % 4
    tail = digits[whole:]
    padded = digits[:whole] + (tail + b"=" * (4 - len(tail)) if len(tail) > 1 else b"")
    return binascii.a2b_base64(padded)


def cuda_shm_register(name: str, document: Any) -> CudaSharedMemoryRegisterRequest:
    body = _object(document)
    handle = body.get("raw_handle")
    if not isinstance(handle, dict):
        raise invalid_arg("Shared memory register request has no 'raw_handle' field")
    b64 = _member(handle, "b64", "string")
    byte_size = _member(body, "byte_size", "uint")
    device_id = _member(body, "device_id", "uint")
    raw = decode_base64(b64)
    if len(raw) != CUDA_IPC_HANDLE_SIZE:
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return CudaSharedMemoryRegisterRequest(name=name, raw_handle=raw, device_id=device_id, byte_size=byte_size)


def load_request(model_name: str, document: Any) -> RepositoryModelLoadRequest:
    """Load parameters as Triton's HTTP front reads them: each value a string, "config"
    kept as it is and "file:<path>" base64-decoded to bytes_param; any other name is
    refused there, before the load (its texts, INTERNAL)."""
    request = RepositoryModelLoadRequest(model_name=model_name)
    for key, value in _parameters(document).items():
        if not isinstance(value, str):
            raise internal("attempt to access JSON non-string as string")
        if key == "config":
            request.parameters[key].string_param = value
        elif key.startswith("file:"):
            request.parameters[key].bytes_param = decode_base64(value)
        else:
            raise internal("unexpected error on creating Triton parameter")
    return request


def _parameters(document: Any) -> dict[str, Any]:
    """A load request's "parameters" object ({} when it has none)."""
    if not isinstance(document, dict) or "parameters" not in document:
        return {}
    params = document["parameters"]
    if not isinstance(params, dict):
        raise internal("attempt to get members for non-object")
    return params


def unload_request(model_name: str, document: Any) -> RepositoryModelUnloadRequest:
    """As Triton's HTTP front: only a boolean `unload_dependents` counts; another value
    unloads the model alone (Triton drops that error)."""
    request = RepositoryModelUnloadRequest(model_name=model_name)
    params = document.get("parameters") if isinstance(document, dict) else None
    if isinstance(params, dict) and type(params.get("unload_dependents")) is bool:
        request.parameters["unload_dependents"].bool_param = params["unload_dependents"]
    return request


def trace_request(model_name: str, document: Any) -> TraceSettingRequest:
    """A trace settings update as Triton's HTTP front reads it, setting by setting in its
    order: `trace_level` an array of strings, the others a string each, null to clear;
    the trace file never; other names ignored. A JSON value of the wrong kind is INTERNAL
    in TritonJson's words; a value it cannot take, INVALID_ARG in Triton's."""
    request = TraceSettingRequest(model_name=model_name)
    if not isinstance(document, dict):
        return request
    if "trace_file" in document:
        raise unsupported("trace file location can not be updated through network protocol")
    for key in TRACE_CHANGEABLE:
        if key not in document:
            continue
        value = document[key]
        values: list[str] = []
        if value is not None:
            if key == "trace_level" and not isinstance(value, list):
                raise internal("attempt to access JSON non-array as array")
            values = value if key == "trace_level" else [value]
            if not all(isinstance(v, str) for v in values):
                raise internal("attempt to access JSON non-string as string")
            parse_setting(key, values, http=True)
        request.settings[key].value.extend(values)
    return request


# Protobuf maps keep no order; Triton prints settings in these orders.
_TRACE_ORDER = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_LOG_ORDER = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


def _ordered(keys: Any, order: tuple[str, ...]) -> list[str]:
    rank = {key: index for index, key in enumerate(order)}
    return sorted(keys, key=lambda key: (rank.get(key, len(order)), key))


def trace_settings(response: TraceSettingResponse) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key in _ordered(response.settings, _TRACE_ORDER):
        setting = response.settings[key]
        values = list(setting.value)
        if key == "trace_level" or len(values) > 1:
            result[key] = values
        else:
            result[key] = values[0] if values else ""
    return result


def log_request(document: Any) -> LogSettingsRequest:
    """A logging update as Triton's HTTP front reads it: a null value changes nothing,
    the log file cannot change, a value of the wrong JSON kind is INTERNAL in TritonJson's
    words, an unknown format UNAVAILABLE; other names are ignored."""
    request = LogSettingsRequest()
    if not isinstance(document, dict):
        return request
    if document.get("log_file") is not None:
        raise unsupported(LOG_FILE_FIXED)
    for key in ("log_info", "log_warning", "log_error"):
        if document.get(key) is not None:
            request.settings[key].bool_param = _as(document[key], bool, "boolean")
    verbose = document.get("log_verbose_level")
    if verbose is not None:
        if type(verbose) is not int or not 0 <= verbose < 2**64:
            raise internal("attempt to access JSON non-unsigned-integer as unsigned-integer")
        request.settings["log_verbose_level"].uint32_param = verbose % 2**32  # Triton keeps an int32 of it
    log_format = document.get("log_format")
    if log_format is not None:
        if _as(log_format, str, "string") not in LOG_FORMATS:
            raise unavailable(f"invalid argument for --log_format, got: {log_format}")
        request.settings["log_format"].string_param = log_format
    return request


def _as(value: Any, kind: type, name: str) -> Any:
    if type(value) is not kind:
        raise internal(f"attempt to access JSON non-{name} as {name}")
    return value


def log_settings(response: LogSettingsResponse) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key in _ordered(response.settings, _LOG_ORDER):
        setting = response.settings[key]
        which = setting.WhichOneof("parameter_choice")
        result[key] = getattr(setting, which) if which else None
    return result
