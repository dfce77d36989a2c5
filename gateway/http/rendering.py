"""ModelInferResponse -> Triton's HTTP response body: each output as JSON `data` or as
binary bytes after the JSON header, as the request's rendering asked."""

from __future__ import annotations

import json
from typing import Any

from gateway.http.parsing import OutputRendering
from protos import codec, datatypes
from protos.grpc_service_pb2 import InferParameter, ModelInferResponse
from protos.memo import Memo
from protos.status import internal, invalid_arg
from protos.wire import split_raw


def _parameter_value(param: InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def render_infer_response(response: ModelInferResponse, rendering: OutputRendering) -> tuple[bytes, int | None]:
    """The HTTP body of an infer response and its Inference-Header-Content-Length
    (None when no binary byte follows the JSON)."""
    body, header_length, _ = _render(response, rendering)
    return body, header_length


def render_encoded(encoded: bytes, rendering: OutputRendering) -> tuple[bytes, int | None]:
    """render_infer_response of a serialized ModelInferResponse. An answer whose every
    output renders binary has a JSON header that all but its outputs' bytes decide: the
    response before its raw contents (id, model, version, parameters, outputs' names,
    datatypes and shapes), the raw contents' sizes and the rendering. Such a header is
    remembered (up to 4 KiB of response before the raw contents, 64 of them) and the next
    answer with the same is its header and its raw contents, as they came, unparsed."""
    split = None if rendering.shared_memory else split_raw(encoded, _HEAD_TAGS, _RAW_TAG)
    key = None
    if split is not None:
        head_end, raws = split
        if head_end <= _REMEMBERED_HEAD_BYTES:
            choices = frozenset(rendering.binary.items()) if rendering.binary else None
            key = (rendering.default_binary, choices, encoded[:head_end], tuple(map(len, raws)))
            remembered = _remembered.get(key)
            if remembered is not None:
                header, header_length = remembered
                return b"".join([header, *raws]), header_length
    body, header_length, all_binary = _render(ModelInferResponse.FromString(encoded), rendering)
    if key is not None and all_binary:
        _remembered.remember(key, (body if header_length is None else body[:header_length], header_length))
    return body, header_length


_REMEMBERED_HEAD_BYTES = 4096
_REMEMBERED_ANSWERS = 64
_remembered: Memo[tuple[Any, ...], tuple[bytes, int | None]] = Memo(_REMEMBERED_ANSWERS)

# ModelInferResponse's fields as wire tags, each length-delimited: model_name (1),
# model_version (2), id (3), parameters (4), outputs (5), raw_output_contents (6).
_HEAD_TAGS = frozenset((0x0A, 0x12, 0x1A, 0x22, 0x2A))
_RAW_TAG = 0x32


def _render(response: ModelInferResponse, rendering: OutputRendering) -> tuple[bytes, int | None, bool]:
    """The body, its header length, and whether every output rendered binary from its raw
    contents (so the JSON header holds nothing of their values)."""
    outputs: list[dict[str, Any]] = []
    binary_parts: list[bytes] = []
    raw = response.raw_output_contents
    raw_count = len(raw)
    all_binary = True
    # Sliced, not iterated: protobuf's repeated fields end an iteration by raising IndexError.
    for index, output in enumerate(response.outputs[:]):
        shape = output.shape[:]
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": shape}
        outputs.append(entry)
        if output.name in rendering.shared_memory:
            all_binary = False
            continue
        if index >= raw_count:
            all_binary = False
        data = raw[index] if index < raw_count else _contents_bytes(output)
        if rendering.is_binary(output.name):
            entry["parameters"] = {"binary_data_size": len(data)}
            if data:
                binary_parts.append(data)
        else:
            all_binary = False
            entry["data"] = _json_data(data, output.datatype, shape, output.name)

    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    if response.parameters:
        document["parameters"] = {k: _parameter_value(v) for k, v in response.parameters.items()}
    document["outputs"] = outputs
    # Compact, as every answer; BYTES go into JSON strings as they are, as Triton writes
    # them, so bytes that are not UTF-8 (surrogate-escaped by to_json_data) stay raw.
    header = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogateescape")
    if not binary_parts:
        return header, None, all_binary
    return b"".join([header, *binary_parts]), len(header), all_binary


def _contents_bytes(output: Any) -> bytes:
    # Responses carry raw_output_contents; typed bytes_contents is tolerated as a fallback.
    if output.datatype == "BYTES" and output.contents.bytes_contents:
        return codec.serialize_bytes(output.contents.bytes_contents)
    return b""


def _json_data(data: bytes, datatype: str, shape: list[int], name: str) -> list[Any]:
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
        )
    dtype = datatypes.from_name(datatype)
    if dtype is None:
        raise invalid_arg("Invalid data type for output tensor")
    try:
        return codec.to_json_data(data, dtype, shape)
    except (codec.CodecError, ValueError) as exc:
        raise internal(f"output tensor shape does not match size of output for '{name}'") from exc
