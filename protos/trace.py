"""Tracing across the gateway-sidecar hop: the request parameter by which the gateway
marks a sampled inference, and the response parameter in which the sidecar answers with
the timestamps only it knows (its own span and its batcher's queue and compute).

A sampled request carries TRACE_PARAMETER (its string value: the W3C traceparent of the
gateway's span, "" when there is none), appended to the serialized request as one more
map entry. The sidecar removes it before the model sees the request and sets the same
parameter on its response to the SIDECAR_TIMESTAMPS, on its time.monotonic_ns() clock,
comma-separated. The gateway cuts that entry out of the response bytes (`take_report`)
before the client sees them. An untraced request carries nothing: the sidecar pays one
map lookup to learn so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from protos.wire import LENGTH_DELIMITED, fields, length_delimited

TRACE_PARAMETER = "turnout_trace"
TRACEPARENT = "traceparent"  # the W3C header, and the gRPC metadata key to the sidecar

# What the sidecar reports, in this order. SIDECAR_START/END bound its own handling of the
# request (decoded, validated, queued, run, answered); the rest are Triton's names.
SIDECAR_TIMESTAMPS = (
    "SIDECAR_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "SIDECAR_END",
)

# ModelInferRequest/Response.parameters, a map entry's key and value, InferParameter.string_param.
_PARAMETERS, _KEY, _VALUE, _STRING_PARAM = 4, 1, 2, 3
_MODEL_VERSION = 2  # ModelInferResponse.model_version
_KEY_BYTES = TRACE_PARAMETER.encode()


def trace_parameter(traceparent: str = "") -> bytes:
    """The serialized `parameters` entry {TRACE_PARAMETER: string_param=traceparent}:
    appended to a serialized ModelInferRequest, protobuf merges it in."""
    value = length_delimited(_STRING_PARAM, traceparent.encode())
    return length_delimited(_PARAMETERS, length_delimited(_KEY, _KEY_BYTES) + length_delimited(_VALUE, value))


def timestamps_text(values: Sequence[int]) -> str:
    """The sidecar's answer: one value per SIDECAR_TIMESTAMPS name."""
    if len(values) != len(SIDECAR_TIMESTAMPS):
        raise ValueError(f"expected {len(SIDECAR_TIMESTAMPS)} timestamps, got {len(values)}")
    return ",".join(str(value) for value in values)


@dataclass(frozen=True)
class SidecarReport:
    """What a traced response told the gateway: the version that answered, and the
    sidecar's timestamps by name (none when the sidecar sent none)."""

    model_version: str = ""
    timestamps: dict[str, int] = field(default_factory=dict)


def take_report(response: bytes) -> tuple[bytes, SidecarReport]:
    """`response` (a serialized ModelInferResponse) without the sidecar's trace entry,
    and what the entry and the response said. Walks the top-level fields only; the
    tensors are copied once, when the entry is cut out."""
    version = ""
    found: tuple[int, int, str] | None = None
    try:
        for top in fields(response):
            if top.number == _MODEL_VERSION and top.wire_type == LENGTH_DELIMITED:
                version = response[top.value_start : top.end].decode(errors="replace")
            elif top.number == _PARAMETERS and top.wire_type == LENGTH_DELIMITED and found is None:
                text = _trace_entry(memoryview(response)[top.value_start : top.end])
                if text is not None:
                    found = (top.start, top.end, text)
    except ValueError:
        return response, SidecarReport(version)  # not ours to judge: the front end parses it
    if found is None:
        return response, SidecarReport(version)
    start, end, text = found
    return response[:start] + response[end:], SidecarReport(version, _timestamps(text))


def _trace_entry(entry: memoryview) -> str | None:
    """The string value of a parameters map entry if its key is TRACE_PARAMETER."""
    key = b""
    value: memoryview | None = None
    for part in fields(entry):
        if part.number == _KEY and part.wire_type == LENGTH_DELIMITED:
            key = bytes(entry[part.value_start : part.end])
        elif part.number == _VALUE and part.wire_type == LENGTH_DELIMITED:
            value = entry[part.value_start : part.end]
    if key != _KEY_BYTES:
        return None
    text = ""
    for part in fields(value if value is not None else memoryview(b"")):
        if part.number == _STRING_PARAM and part.wire_type == LENGTH_DELIMITED and value is not None:
            text = bytes(value[part.value_start : part.end]).decode(errors="replace")
    return text


def _timestamps(text: str) -> dict[str, int]:
    values = text.split(",")
    if len(values) != len(SIDECAR_TIMESTAMPS):
        return {}
    try:
        return dict(zip(SIDECAR_TIMESTAMPS, (int(v) for v in values), strict=True))
    except ValueError:
        return {}
