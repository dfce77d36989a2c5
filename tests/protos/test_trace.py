"""The trace marker a request carries to its sidecar and the report its answer brings
back, against real protobuf messages."""

from __future__ import annotations

import pytest

from protos import grpc_service_pb2 as pb
from protos.trace import SIDECAR_TIMESTAMPS, TRACE_PARAMETER, take_report, timestamps_text, trace_parameter
from protos.wire import fields


def test_the_marker_merges_into_a_serialized_request() -> None:
    request = pb.ModelInferRequest(model_name="simple", id="r1")
    request.parameters["priority"].int64_param = 2
    parsed = pb.ModelInferRequest.FromString(request.SerializeToString() + trace_parameter("00-ab-cd-01"))
    assert parsed.parameters[TRACE_PARAMETER].string_param == "00-ab-cd-01"
    assert parsed.parameters["priority"].int64_param == 2
    assert parsed.model_name == "simple"


def traced_response() -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="simple", model_version="3", id="r1")
    response.parameters["sequence_id"].int64_param = 9
    response.outputs.add(name="OUTPUT0", datatype="INT32", shape=[1, 2])
    response.raw_output_contents.append(b"\x01\x00\x00\x00\x02\x00\x00\x00")
    response.parameters[TRACE_PARAMETER].string_param = timestamps_text(range(100, 100 + len(SIDECAR_TIMESTAMPS)))
    return response


def test_the_report_leaves_the_response_and_nothing_else_does() -> None:
    response = traced_response()
    stripped, report = take_report(response.SerializeToString())
    assert report.model_version == "3"
    assert report.timestamps == {name: 100 + i for i, name in enumerate(SIDECAR_TIMESTAMPS)}
    expected = traced_response()
    del expected.parameters[TRACE_PARAMETER]
    assert pb.ModelInferResponse.FromString(stripped) == expected


def test_a_response_without_a_report_is_left_as_it_is() -> None:
    encoded = pb.ModelInferResponse(model_name="simple", model_version="1").SerializeToString()
    stripped, report = take_report(encoded)
    assert stripped == encoded
    assert report.model_version == "1"
    assert report.timestamps == {}


def test_bytes_that_are_no_message_are_left_to_the_front_end() -> None:
    stripped, report = take_report(b"\x0a\xff")
    assert stripped == b"\x0a\xff"
    assert report.timestamps == {}


def test_timestamps_text_needs_every_name() -> None:
    with pytest.raises(ValueError):
        timestamps_text([1, 2])


def test_fields_walks_every_wire_type() -> None:
    # fixed64 field 1, fixed32 field 2, varint field 3 (150), length-delimited field 4 ("ab")
    encoded = b"\x09" + bytes(8) + b"\x15" + bytes(4) + b"\x18\x96\x01" + b"\x22\x02ab"
    found = [(f.number, f.wire_type, encoded[f.value_start : f.end]) for f in fields(encoded)]
    assert found == [(1, 1, bytes(8)), (2, 5, bytes(4)), (3, 0, b"\x96\x01"), (4, 2, b"ab")]
    with pytest.raises(ValueError):
        list(fields(b"\x0a\x05ab"))  # a length past the end
