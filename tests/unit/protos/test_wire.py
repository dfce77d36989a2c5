"""protos.wire.split_raw against what protobuf itself writes and reads."""

from __future__ import annotations

import pytest

from protos import grpc_service_pb2 as pb
from protos.wire import length_delimited, split_raw

HEAD_TAGS = frozenset((0x0A, 0x12, 0x2A, 0x32))  # model_name, model_version, inputs, outputs
RAW_TAG = 0x3A  # raw_input_contents


def _request(raw: list[bytes], request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", model_version="2", id=request_id)
    request.inputs.add(name="A", datatype="FP32", shape=[1, 2])
    request.outputs.add(name="B")
    request.raw_input_contents.extend(raw)
    return request


@pytest.mark.parametrize(
    "raw", [[b"\1" * 8], [b"", b"xy"], [b"\2" * 300, b"\3" * 20_000]], ids=["one", "empty", "long"]
)
def test_the_raw_contents_are_split_from_the_head_protobuf_wrote(raw: list[bytes]) -> None:
    request = _request(raw)
    data = request.SerializeToString()
    split = split_raw(data, HEAD_TAGS, RAW_TAG)
    assert split is not None
    head_end, views = split
    assert [bytes(view) for view in views] == raw
    head = pb.ModelInferRequest.FromString(data[:head_end])
    request.ClearField("raw_input_contents")
    assert head == request


def test_what_is_not_a_head_then_raw_contents_is_not_split() -> None:
    assert split_raw(_request([]).SerializeToString(), HEAD_TAGS, RAW_TAG) is None  # no raw contents
    assert split_raw(_request([b"ab"], "id").SerializeToString(), HEAD_TAGS, RAW_TAG) is None  # a tag not in the head
    data = _request([b"ab"]).SerializeToString()
    assert split_raw(data + length_delimited(6, b""), HEAD_TAGS, RAW_TAG) is None  # a field after them
    assert split_raw(data[:-1], HEAD_TAGS, RAW_TAG) is None  # cut short
    assert split_raw(data + b"\x3a", HEAD_TAGS, RAW_TAG) is None  # a tag with no length
    assert split_raw(data + b"\x3a\xff", HEAD_TAGS, RAW_TAG) is None  # a length cut short
