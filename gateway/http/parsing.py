"""HTTP inference requests: Triton's JSON/binary request body -> ModelInferRequest, and
how the response must render each output (gateway/http/rendering.py writes it).

This is the one conversion HTTP pays; nothing here imports starlette or decodes
binary tensors (binary inputs travel as slices of the received body).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.http.encoding import as_utf8, parse_json, refuse_too_big_number
from gateway.settings import GatewaySettings
from protos import codec, datatypes
from protos.grpc_service_pb2 import InferParameter, ModelInferRequest
from protos.memo import Memo
from protos.sequence import as_int64
from protos.status import TurnoutError, internal, invalid_arg

INFER_HEADER = "inference-header-content-length"

_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1
# Triton's HTTP_MAX_JSON_NESTING_DEPTH: a `data` value this many arrays deep is refused.
MAX_DATA_NESTING = 100
_DEFAULT_MAX_INPUT_SIZE = GatewaySettings.http_max_input_size

# --- TritonJson-style accessors: each failure is INTERNAL "Unable to parse '<field>': ..." ---


def _missing(name: str) -> TurnoutError:
    return internal(f"Unable to parse '{name}': attempt to access non-existing object member '{name}'")


def _member_array(obj: Mapping[str, Any], name: str) -> list[Any]:
    if name not in obj:
        raise _missing(name)
    value = obj[name]
    if not isinstance(value, list):
        raise internal(f"Unable to parse '{name}': attempt to access JSON non-array as array")
    return value


def _member_string(obj: Mapping[str, Any], name: str) -> str:
    if name not in obj:
        raise _missing(name)
    value = obj[name]
    if not isinstance(value, str):
        raise internal(f"Unable to parse '{name}': attempt to access JSON non-string as string")
    return value


def _as_uint(value: Any, name: str, prefix: str = "Unable to parse") -> int:
    if type(value) is not int or value < 0 or value > _UINT64_MAX:
        raise internal(f"{prefix} '{name}': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _as_bool(value: Any, name: str, prefix: str = "Unable to parse") -> bool:
    if type(value) is not bool:
        raise internal(f"{prefix} '{name}': attempt to access JSON non-boolean as boolean")
    return value


def _as_object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise internal(f"Unable to parse '{name}': attempt to access JSON non-object as object")
    return value


# --- request ---


@dataclass
class OutputRendering:
    """How the response renders each output: binary or JSON. A requested output follows its
    own `binary_data` (JSON without it); the request's `binary_data_output` is for the
    outputs it does not list; the default is JSON."""

    default_binary: bool = False
    binary: dict[str, bool] = field(default_factory=dict)
    shared_memory: set[str] = field(default_factory=set)  # outputs written to a region, not the body

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.default_binary)

    def copy(self) -> OutputRendering:
        return OutputRendering(self.default_binary, dict(self.binary), set(self.shared_memory))


# Checks a shared-memory region, offset and byte size (gateway.shm.SharedMemory.locate).
Locate = Callable[[str, int, int], object]


def header_length(value: str | None, content_length: int) -> int | None:
    """The JSON length from `Inference-Header-Content-Length` (None when absent: all JSON).
    As in Triton, a body with neither header nor content is the raw binary form (0)."""
    if value is None:
        return None if content_length else 0
    try:
        parsed = int(value.strip())
    except ValueError:
        raise invalid_arg(f"Unable to parse Inference-Header-Content-Length, got: {value}") from None
    if parsed < 0 or parsed > content_length:
        raise invalid_arg(f"inference header size should be in range (0, {content_length}), got: {value}")
    return parsed


@dataclass(frozen=True)
class _Known:
    """A JSON header parsed before, of a request whose every input is binary: the request
    without its tensors' bytes, how to render its answer, and each input's byte count."""

    request: ModelInferRequest
    rendering: OutputRendering
    sizes: tuple[int, ...]
    total: int  # the binary part's bytes


# JSON headers of binary requests up to this long are remembered by their bytes, at most
# _KNOWN_HEADERS of them: a client sends one header with every request of one shape.
_KNOWN_HEADER_BYTES = 4096
_KNOWN_HEADERS = 64
_known: Memo[tuple[bytes, str, str], _Known] = Memo(_KNOWN_HEADERS)


def _from_known(known: _Known, body: bytes, json_end: int) -> tuple[ModelInferRequest, OutputRendering] | None:
    """The request of a body whose header is `known`; None when its binary part is not
    the size the header declares (the full parse then words why)."""
    if len(body) - json_end != known.total:
        return None
    request = ModelInferRequest()
    request.CopyFrom(known.request)
    raw = request.raw_input_contents
    offset = json_end
    for size in known.sizes:
        raw.append(body[offset : offset + size])
        offset += size
    return request, known.rendering.copy()


def parse_infer_request(
    body: bytes,
    json_length: int | None,
    model_name: str,
    model_version: str,
    max_input_size: int = _DEFAULT_MAX_INPUT_SIZE,
    locate: Locate | None = None,
) -> tuple[ModelInferRequest, OutputRendering]:
    """Build the ModelInferRequest of an HTTP infer body (not the raw-binary form).

    `json_length` is the Inference-Header-Content-Length (None: the whole body is JSON).
    Binary inputs become `raw_input_contents`, in `inputs` order; JSON `data` becomes
    raw contents too; shared-memory inputs keep their `shared_memory_*` parameters.
    `max_input_size` (--http-max-input-size) bounds the tensor a JSON `data` may declare.
    `locate` checks a shared-memory tensor's region, offset and byte size as each is read,
    raising Triton's error for a region that is not there or too small, in Triton's order.

    A header whose every input is binary (no `data`, no shared memory) is the whole
    request but its tensors' bytes, so once parsed it is remembered by its bytes: the
    next request with that header only has its binary part's size checked and cut.
    """
    json_end = len(body) if json_length is None else json_length
    header = body if json_end == len(body) else memoryview(body)[:json_end]
    key = None
    if json_length is not None and json_end <= _KNOWN_HEADER_BYTES:
        key = (bytes(header), model_name, model_version)
        known = _known.get(key)
        if known is not None:
            parsed = _from_known(known, body, json_end)
            if parsed is not None:
                return parsed
    # Strings keep bytes that are not UTF-8, as Triton's parser keeps them: a BYTES
    # element reaches the model as sent.
    document = parse_json(header, raw_strings=True)
    try:
        if not isinstance(document, dict):  # TritonJson finds no member in it: 'inputs' is the first it must have
            raise _missing("inputs")
        try:
            request, rendering, sizes = _request_of(
                document, body, json_end, model_name, model_version, max_input_size, locate
            )
        except UnicodeEncodeError:
            # Such bytes in an id, a name or a parameter, which Triton takes as they are
            # and no protobuf string can carry: each becomes U+FFFD, and the request goes on.
            request, rendering, sizes = _request_of(
                _as_utf8(document), body, json_end, model_name, model_version, max_input_size, locate
            )
    except (UnicodeEncodeError, RecursionError):
        at = _not_utf8(header)
        raise internal(f"failed to parse the request JSON buffer: Invalid encoding in string. at {at}") from None
    finally:
        # A number too big for a double (read by Python as infinity, or as an integer too
        # large to convert) fails rapidjson's parse before Triton reads any field: that
        # error first, in place of any other, and on a request Python's reading let through.
        refuse_too_big_number(header)
    if key is not None and sizes is not None:
        template = ModelInferRequest()
        template.CopyFrom(request)
        del template.raw_input_contents[:]
        _known.remember(key, _Known(template, rendering.copy(), sizes, sum(sizes)))
    return request, rendering


def _as_utf8(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with the bytes that are not UTF-8 in its strings written as U+FFFD, but
    for the inputs' `data`: a BYTES element reaches the model as sent."""
    converted = {}
    for key, value in document.items():
        if key == "inputs" and isinstance(value, list):
            converted[key] = [
                {as_utf8(name): item if name == "data" else as_utf8(item) for name, item in tensor.items()}
                if isinstance(tensor, dict)
                else as_utf8(tensor)
                for tensor in value
            ]
        else:
            converted[as_utf8(key)] = as_utf8(value)
    return converted


def _not_utf8(data: bytes | memoryview) -> int:
    """The offset of the first byte of `data` that is not UTF-8."""
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return 0


def _request_of(
    document: dict[str, Any],
    body: bytes,
    json_end: int,
    model_name: str,
    model_version: str,
    max_input_size: int,
    locate: Locate | None,
) -> tuple[ModelInferRequest, OutputRendering, tuple[int, ...] | None]:
    """The request, how to render its answer, and each input's byte count in the binary
    part when no input's bytes came from anywhere else (None otherwise)."""
    request = ModelInferRequest(model_name=model_name, model_version=model_version)
    if "id" in document:
        request_id = document["id"]
        if not isinstance(request_id, str):
            raise internal("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = request_id
    rendering = OutputRendering()
    if "parameters" in document:
        _parse_request_parameters(document["parameters"], request, rendering)

    inputs = _member_array(document, "inputs")
    offset = json_end
    end = len(body)
    sizes = []
    for entry in inputs:
        start = offset
        offset = _parse_input(entry, request, body, offset, model_name, max_input_size, locate)
        sizes.append(offset - start)
    if offset != end:
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")

    if "outputs" in document:
        for entry in _member_array(document, "outputs"):
            _parse_output(entry, request, rendering, locate)
    # Each input's raw entry is its cut of the binary part, or empty whatever the body
    # (a binary size of 0, or a shape of no elements): the same header cuts the next body alike.
    raw = request.raw_input_contents
    tensors = request.inputs[:]
    binary = (
        len(raw) == len(tensors)
        and not rendering.shared_memory
        and not any(tensor.parameters for tensor in tensors)
        and all(size == len(contents) for size, contents in zip(sizes, raw, strict=True))
    )
    return request, rendering, tuple(sizes) if binary else None


def _log_request(request: ModelInferRequest) -> str:
    """The "[request id: ...] " prefix of Triton core's request errors."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _int64(dim: int) -> int:
    """A JSON unsigned dim as Triton stores it, in an int64: past INT64_MAX it wraps."""
    return dim - 2**64 if dim > _INT64_MAX else dim


def _element_count(shape: Sequence[int]) -> int:
    """Triton's HTTP element count: -1 for a wildcard, -2 for an invalid dim, -3 when the
    count overflows int64; 0 as soon as a dim is 0, and for an empty shape, whose `data`
    Triton then never reads (src/common.cc GetElementCount)."""
    if not shape:
        return 0
    count = 1
    for dim in shape:
        if dim == -1:
            return -1
        if dim < 0:
            return -2
        if dim == 0:
            return 0
        if count > _INT64_MAX // dim:
            return -3
        count *= dim
    return count


def _parse_request_parameters(value: Any, request: ModelInferRequest, rendering: OutputRendering) -> None:
    if not isinstance(value, dict):
        raise internal("failed to get request params.: attempt to get members for non-object")
    params = request.parameters
    for key, item in value.items():
        if key == "sequence_id":
            if type(item) is int and 0 <= item <= _UINT64_MAX:
                params[key].int64_param = as_int64(item)  # read back as the uint64 it was
            elif isinstance(item, str):
                params[key].string_param = item
            else:
                raise internal("Unable to parse 'sequence_id': attempt to access JSON non-string as string")
        elif key in ("sequence_start", "sequence_end"):
            params[key].bool_param = _as_bool(item, key)
        elif key == "priority":
            params[key].uint64_param = _as_uint(item, key)
        elif key == "timeout":
            params[key].int64_param = as_int64(_as_uint(item, key))  # read back as the uint64 it was
        elif key == "binary_data_output":
            rendering.default_binary = _as_bool(item, key)
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        else:
            _set_parameter(params[key], key, item)


def _set_parameter(param: InferParameter, key: str, item: Any) -> None:
    if isinstance(item, str):
        param.string_param = item
    elif isinstance(item, bool):
        param.bool_param = item
    elif isinstance(item, int) and -(2**63) <= item <= _INT64_MAX:
        param.int64_param = item
    elif isinstance(item, int | float):
        param.double_param = float(item)
    else:
        raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _content_kind(entry: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    has_data = "data" in entry
    params = entry.get("parameters")
    has_binary = isinstance(params, dict) and "binary_data_size" in params
    has_shm = isinstance(params, dict) and "shared_memory_region" in params
    count = has_data + has_binary + has_shm
    if count != 1:
        text = (
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But"
        )
        if count == 0:
            text += " no field is set"
        else:
            text += " set"
            text += " 'data'" if has_data else ""
            text += " 'binary_data_size'" if has_binary else ""
            text += " 'shared_memory_region'" if has_shm else ""
        raise invalid_arg(text)
    return has_data, has_binary, has_shm


def _parse_input(
    entry: Any,
    request: ModelInferRequest,
    body: bytes,
    offset: int,
    model_name: str,
    max_input_size: int,
    locate: Locate | None,
) -> int:
    """Add one input to `request`; returns the offset of the next binary input."""
    entry = _as_object(entry, "inputs")
    _, has_binary, has_shm = _content_kind(entry)
    name = _member_string(entry, "name")
    datatype = _member_string(entry, "datatype")
    shape = [_int64(_as_uint(dim, "shape")) for dim in _member_array(entry, "shape")]
    if any(tensor.name == name for tensor in request.inputs[:]):  # sliced: see uses_shared_memory
        raise invalid_arg(f"{_log_request(request)}input '{name}' already exists in request")

    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if has_binary:
        size = _as_uint(entry["parameters"]["binary_data_size"], "binary_data_size")
        if size == 0:
            request.raw_input_contents.append(b"")
            return offset
        # Without Inference-Header-Content-Length the body is all JSON, so no bytes follow
        # it: Triton then counts the input short (its "must specify valid
        # 'Infer-Header-Content-Length'" needs a header length of 0, the raw binary form).
        available = len(body) - offset
        if available < size:
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {size - available} additional bytes "
                f"for model '{model_name}'"
            )
        # protobuf bytes fields take bytes only, so this slice is the one copy of the tensor.
        request.raw_input_contents.append(body[offset : offset + size])
        return offset + size

    if has_shm:
        _copy_shm_parameters(entry["parameters"], tensor.parameters, locate)
        return offset

    count = _element_count(shape)
    if count == 0:
        # An empty tensor carries no data; give it an (empty) raw entry so it has data.
        request.raw_input_contents.append(b"")
        return offset
    if count == -2:
        raise invalid_arg(
            f"invalid shape for input '{name}': shape {codec.shape_text(shape)} contains one or more invalid dimensions"
        )
    if count == -3:
        raise invalid_arg(
            f"invalid shape for input '{name}': shape {codec.shape_text(shape)} causes total element count to exceed "
            f"maximum size of {_INT64_MAX}"
        )
    data = _member_array(entry, "data")
    request.raw_input_contents.append(_json_to_raw(data, name, datatype, count, max_input_size))
    return offset


_SHM_OFFSET_AND_SIZE = ("shared_memory_offset", "shared_memory_byte_size")  # Triton reads them in this order


def _copy_shm_parameters(source: Mapping[str, Any], target: Any, locate: Locate | None) -> None:
    """A tensor's shared-memory parameters, read as Triton's HTTP front reads them (an
    absent offset or byte size is 0), its region then looked up (`locate`)."""
    region = source["shared_memory_region"]
    if not isinstance(region, str):
        raise internal("Unable to parse 'shared_memory_region': attempt to access JSON non-string as string")
    offset, size = (_as_uint(source[key], key) if key in source else 0 for key in _SHM_OFFSET_AND_SIZE)
    target["shared_memory_region"].string_param = region
    target["shared_memory_byte_size"].int64_param = min(size, _INT64_MAX)
    target["shared_memory_offset"].int64_param = min(offset, _INT64_MAX)
    if locate is not None:
        locate(region, offset, size)


_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_SHAPE_SHORT = "Failed to parse 'data' field: shape does not match true shape"  # 2.51 said _SHAPE_MISMATCH
_NESTING = f"JSON nesting depth exceeds maximum allowed limit ({MAX_DATA_NESTING})"

_NOT_A = "attempt to access JSON non-{0} as {0}"
# Per datatype kind: what a JSON scalar must be, and Triton's text when it is not.
_SCALARS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "BOOL": (lambda v: type(v) is bool, "Unable to parse 'data': " + _NOT_A.format("boolean")),
    # rapidjson's Uint64 and Int64: a JSON integer past them is not one.
    "UINT": (
        lambda v: type(v) is int and 0 <= v <= _UINT64_MAX,
        "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer",
    ),
    "INT": (
        lambda v: type(v) is int and -_INT64_MAX - 1 <= v <= _INT64_MAX,
        "Unable to parse 'data': " + _NOT_A.format("signed-integer"),
    ),
    "FP": (
        lambda v: type(v) is float or type(v) is int,
        "Unable to parse 'data': attempt to access JSON non-number as double",
    ),
    "BYTES": (lambda v: type(v) is str, "Unable to parse JSON bytes array: " + _NOT_A.format("string")),
}
_SURROGATE = "failed to parse the request JSON buffer: The surrogate pair in string is invalid."


def _scalar_rule(kind: str) -> tuple[Callable[[Any], bool], str]:
    for prefix in ("BOOL", "UINT", "INT", "BYTES"):
        if kind.startswith(prefix):
            return _SCALARS[prefix]
    return _SCALARS["FP"]


def _flatten(data: list[Any], kind: str, count: int | None) -> list[Any]:
    """The scalars of JSON `data` in row-major order, checked in Triton's order as it walks
    them: every value for depth, then each scalar against `count` (the elements the shape
    holds; None for BYTES, counted later) and against the datatype."""
    valid, invalid = _scalar_rule(kind)
    if not any(type(v) is list for v in data):  # one level deep: the common case, checked in bulk
        checked = data if count is None else data[:count]
        if not all(map(valid, checked)):
            raise internal(invalid)
        if count is not None and len(data) > count:
            raise internal(_SHAPE_MISMATCH)
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if len(stack) >= MAX_DATA_NESTING:  # this value sits len(stack) arrays below `data`
                raise invalid_arg(_NESTING)
            if type(item) is list:
                stack.append(iter(item))
                break
            if count is not None and len(flat) >= count:
                raise internal(_SHAPE_MISMATCH)
            if not valid(item):
                raise internal(invalid)
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_to_raw(data: list[Any], name: str, datatype: str, count: int, max_input_size: int) -> bytes:
    """JSON `data` as raw tensor bytes. Every HTTP input travels raw, because the v2
    service refuses a request that mixes typed contents with raw contents. `count` is
    the shape's element count, or -1 for a wrapped (past INT64_MAX) wildcard dim."""
    dtype = datatypes.from_name(datatype)
    if dtype is not None and dtype.name == "BYTES":
        elements = json_strings(data)
        _check_json_size(name, sum(len(e) + 4 for e in elements), max_input_size)
        return codec.serialize_bytes(elements)
    if dtype is not None and dtype.size:
        if dtype.size > 1 and count > _INT64_MAX // dtype.size:
            raise invalid_arg(
                f"byte size overflow for input '{name}': element count ({count}) * data type size ({dtype.size}) "
                f"exceeds maximum allowed size ({_INT64_MAX})"
            )
        _check_json_size(name, (count * dtype.size) % 2**64, max_input_size)  # size_t, as Triton computes it
    return json_values(data, name, datatype, count)


def json_strings(data: list[Any]) -> list[bytes]:
    """The elements of a BYTES tensor's JSON `data`, each string as the bytes it carries."""
    strings = _flatten(data, "BYTES", None)
    try:
        # Raw bytes in a string (which Triton's parser keeps) arrive surrogate-escaped.
        return [s.encode("utf-8", "surrogateescape") for s in strings]
    except UnicodeEncodeError:
        raise internal(_SURROGATE) from None


def json_values(data: list[Any], name: str, datatype: str, count: int) -> bytes:
    """The `count` elements of a fixed-size tensor's JSON `data` as raw bytes, read as
    Triton's ReadDataFromJson reads them (its texts, in its order)."""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    dtype = datatypes.from_name(datatype)
    if dtype is None or dtype.numpy is None:
        raise invalid_arg(f"invalid datatype for input {name}")
    flat = _flatten(data, dtype.name, count)
    if len(flat) != count:  # fewer than the shape holds (more stop in the walk)
        raise internal(_SHAPE_SHORT)
    wide = _WIDE.get(dtype.name)
    if wide is not None:
        # Triton reads every integer as 64 bits and casts it to the datatype: past its
        # range a value wraps, as in C.
        return np.asarray(flat, dtype=wide).astype(dtype.numpy).tobytes()
    with np.errstate(over="ignore"):  # a double past FP32's range is inf, as C's cast makes it
        return np.asarray(flat, dtype=dtype.numpy).tobytes()


_WIDE = {
    **dict.fromkeys(("INT8", "INT16", "INT32"), np.int64),
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), np.uint64),
}


def _check_json_size(name: str, byte_size: int, max_input_size: int) -> None:
    if byte_size > max_input_size:
        raise invalid_arg(
            f"JSON input '{name}' has a byte_size ({byte_size} bytes) that exceeds the maximum allowed value of "
            f"{max_input_size} bytes. Use --http-max-input-size to increase the limit."
        )


def _parse_output(entry: Any, request: ModelInferRequest, rendering: OutputRendering, locate: Locate | None) -> None:
    entry = _as_object(entry, "outputs")
    params = entry.get("parameters")
    if params is not None and not isinstance(params, dict):
        params = None
    if params and "shared_memory_region" in params:
        if "classification" in params:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
        if "binary_data" in params and _as_bool(params["binary_data"], "binary_data", "Unable to set"):
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
    name = _member_string(entry, "name")
    if any(output.name == name for output in request.outputs[:]):
        raise invalid_arg(f"{_log_request(request)}output '{name}' already exists in request")
    output = request.outputs.add(name=name)
    # A listed output is JSON unless its own binary_data says otherwise: the request's
    # binary_data_output is for outputs it does not list (Triton's default output kind).
    rendering.binary[name] = False
    if not params:
        return
    if "classification" in params:
        classes = _as_uint(params["classification"], "classification", "Unable to set")
        if classes:  # 0 asks for the tensor itself over HTTP; past int64, every class
            output.parameters["classification"].int64_param = min(classes, _INT64_MAX)
    if "shared_memory_region" in params:
        _copy_shm_parameters(params, output.parameters, locate)
        rendering.shared_memory.add(name)
    elif "binary_data" in params:
        rendering.binary[name] = _as_bool(params["binary_data"], "binary_data")


def raw_binary_request(body: bytes, model_name: str, model_version: str) -> tuple[ModelInferRequest, OutputRendering]:
    """The request for a raw binary body (Inference-Header-Content-Length: 0): the whole
    body is the data of the model's only input, and every output comes back binary.

    The body names no input and carries no shape. Triton takes both from the model's
    config (`max_batch_size` and dims, which metadata cannot tell apart), so the input is
    marked raw and `gateway.core` completes it with `codec.deduce_raw_input`.
    """
    request = ModelInferRequest(model_name=model_name, model_version=model_version)
    tensor = request.inputs.add()
    tensor.parameters[codec.RAW_BINARY_PARAMETER].bool_param = True
    request.raw_input_contents.append(body)
    return request, OutputRendering(default_binary=True)
