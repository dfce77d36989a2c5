"""protos.wire.serialize_infer writes exactly what protobuf writes, large tensors by hand."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf.message import Message

from protos import grpc_service_pb2 as pb
from protos.wire import serialize_infer, serialize_stream_infer

SIZES = [0, 1, 300, 32 * 1024 - 1, 32 * 1024, 200_000, 3 * 1024 * 1024 + 7]


def _response(sizes: list[int]) -> pb.ModelInferResponse:
    rng = np.random.default_rng(len(sizes))
    response = pb.ModelInferResponse(model_name="m", model_version="2", id="id-1")
    response.parameters["sequence_id"].int64_param = 7
    response.parameters["note"].string_param = "é"
    for index, size in enumerate(sizes):
        response.outputs.add(name=f"OUTPUT{index}", datatype="UINT8", shape=[1, size])
        response.raw_output_contents.append(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return response


def _request(sizes: list[int]) -> pb.ModelInferRequest:
    rng = np.random.default_rng(len(sizes))
    request = pb.ModelInferRequest(model_name="m", id="id-2")
    request.parameters["priority"].uint64_param = 2
    request.outputs.add(name="OUTPUT0")
    for index, size in enumerate(sizes):
        request.inputs.add(name=f"INPUT{index}", datatype="UINT8", shape=[1, size])
        request.raw_input_contents.append(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return request


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("build", [_response, _request])
def test_same_bytes_as_protobuf(build: Callable[[list[int]], Message], size: int) -> None:
    for sizes in ([size], [size, 5], [7, size, size]):
        message = build(sizes)
        assert serialize_infer(message) == message.SerializeToString()


def test_message_is_left_as_it_was() -> None:
    message = _response([1024 * 1024, 3])
    before = message.SerializeToString()
    contents = list(message.raw_output_contents)
    serialize_infer(message)
    assert list(message.raw_output_contents) == contents
    assert message.SerializeToString() == before


def test_without_tensor_bytes() -> None:
    message = pb.ModelInferResponse(model_name="m")
    message.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.5)
    assert serialize_infer(message) == message.SerializeToString()
    assert serialize_infer(pb.ModelInferRequest()) == b""


def test_round_trip_of_a_large_request() -> None:
    message = _request([4 * 1024 * 1024, 100])
    parsed = pb.ModelInferRequest.FromString(serialize_infer(message))
    assert parsed == message


@pytest.mark.parametrize("error", ["", "model failed: é"])
@pytest.mark.parametrize("sizes", [[], [10], [2 * 1024 * 1024, 10]])
def test_stream_response_same_bytes_as_protobuf(error: str, sizes: list[int]) -> None:
    message = pb.ModelStreamInferResponse(error_message=error)
    message.infer_response.CopyFrom(_response(sizes))
    message.infer_response.parameters["triton_final_response"].bool_param = True
    assert serialize_stream_infer(message) == message.SerializeToString()
    alone = pb.ModelStreamInferResponse(error_message=error)
    assert serialize_stream_infer(alone) == alone.SerializeToString()
