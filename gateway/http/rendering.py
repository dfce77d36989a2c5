"""ModelInferResponse -> Triton's HTTP response body: each output as JSON `data` or as
binary bytes after the JSON header, as the request's rendering asked."""

from __future__ import annotations

import json
from typing import Any

from gateway.http.parsing import OutputRendering
from protos import codec, datatypes
from protos.grpc_service_pb2 import InferParameter, ModelInferResponse
from protos.status import internal, invalid_arg


def _parameter_value(param: InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def render_infer_response(response: ModelInferResponse, rendering: OutputRendering) -> tuple[bytes, int | None]:
    """The HTTP body of an infer response and its Inference-Header-Content-Length
    (None when no binary byte follows the JSON)."""
    outputs: list[dict[str, Any]] = []
    binary_parts: list[bytes] = []
    raw = response.raw_output_contents
    raw_count = len(raw)
    # Sliced, not iterated: protobuf's repeated fields end an iteration by raising IndexError.
    for index, output in enumerate(response.outputs[:]):
        shape = output.shape[:]
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": shape}
        outputs.append(entry)
        if output.name in rendering.shared_memory:
            continue
        data = raw[index] if index < raw_count else _contents_bytes(output)
        if rendering.is_binary(output.name):
            entry["parameters"] = {"binary_data_size": len(data)}
            if data:
                binary_parts.append(data)
        else:
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
        return header, None
    return b"".join([header, *binary_parts]), len(header)


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
