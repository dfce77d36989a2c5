"""encode_response writes what build_response's message serializes to, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.validation import ENCODED_OUTPUTS_PER_SIGNATURE, RequestedOutput, Signature, ValidRequest
from sidecars.responses import build_response, encode_response

CONFIG = """
name: "m" max_batch_size: 8
input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
output [
  { name: "OUT_INT" data_type: TYPE_INT32 dims: [16] },
  { name: "OUT_TEXT" data_type: TYPE_STRING dims: [-1] },
  { name: "OUT_BIG" data_type: TYPE_FP32 dims: [-1] },
  { name: "OUT_FLAT" data_type: TYPE_FP64 dims: [2, 3] reshape: { shape: [6] } }
]
"""


def _signature(config: str = CONFIG) -> Signature:
    return Signature(text_format.Parse(config, mc.ModelConfig()))


def _request(names: list[str], rows: int = 1, request_id: str = "") -> ValidRequest:
    wanted = [RequestedOutput(name, 0) for name in names]
    return ValidRequest(id=request_id, inputs={}, batch_size=rows, key=(), outputs=wanted, priority=0, timeout_us=None)


def _outputs(rows: int, big: int) -> dict[str, np.ndarray]:
    return {
        "OUT_INT": np.arange(16 * rows, dtype=np.int32).reshape(rows, 16),
        "OUT_TEXT": np.array([[b"", b"\x00\xff not utf-8", "é".encode()]] * rows, dtype=np.object_),
        "OUT_BIG": np.ones((rows, big), dtype=np.float32),
        "OUT_FLAT": np.arange(6 * rows, dtype=np.float64).reshape(rows, 6),
    }


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("big", [0, 1, 31, 32, 4096, 70_000])  # raw lengths on each side of a varint byte
@pytest.mark.parametrize("request_id", ["", "7", "é" * 100])
def test_the_bytes_are_the_messages(rows: int, big: int, request_id: str) -> None:
    signature = _signature()
    request = _request(["OUT_FLAT", "OUT_TEXT", "OUT_INT", "OUT_BIG"], rows, request_id)
    outputs = _outputs(rows, big)
    for _ in range(2):  # the second time from the remembered metadata
        expected = build_response("m", "3", signature, request, outputs, {}).SerializeToString()
        assert encode_response("m", "3", signature, request, outputs) == expected


def test_strings_of_one_shape_but_another_length_are_written_with_their_own_length() -> None:
    signature = _signature()
    request = _request(["OUT_TEXT", "OUT_INT"])
    for text in (b"a", b"a much longer string" * 10, b""):
        outputs = {**_outputs(1, 0), "OUT_TEXT": np.array([[text] * 3], dtype=np.object_)}
        expected = build_response("m", "3", signature, request, outputs, {}).SerializeToString()
        assert encode_response("m", "3", signature, request, outputs) == expected


def test_an_output_the_model_left_out_is_left_out_and_no_version_is_written_as_none() -> None:
    signature = _signature()
    request = _request(["OUT_INT", "OUT_BIG"])
    outputs = {"OUT_BIG": np.zeros((1, 5), dtype=np.float32)}
    expected = build_response("m", "", signature, request, outputs, {}).SerializeToString()
    assert encode_response("m", "", signature, request, outputs) == expected


def test_classification_is_left_to_build_response() -> None:
    request = _request(["OUT_INT"])
    request.outputs[0] = RequestedOutput("OUT_INT", 3)
    assert encode_response("m", "1", _signature(), request, _outputs(1, 1)) is None


def test_output_shapes_that_keep_changing_are_remembered_up_to_the_bound() -> None:
    signature = _signature()
    for size in range(ENCODED_OUTPUTS_PER_SIGNATURE + 10):
        request = _request(["OUT_BIG"])
        outputs = {"OUT_BIG": np.zeros((1, size), dtype=np.float32)}
        expected = build_response("m", "1", signature, request, outputs, {}).SerializeToString()
        assert encode_response("m", "1", signature, request, outputs) == expected
        assert len(signature.encoded_outputs) <= ENCODED_OUTPUTS_PER_SIGNATURE
