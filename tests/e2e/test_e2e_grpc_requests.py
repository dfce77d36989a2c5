"""gRPC requests Triton refuses, refused in its words: request and tensor parameters of
the wrong kind, classification counts, shared-memory parameters, version strings and a
repository name. Each row's answer was read from a running Triton (2.51) side by side,
and from current Triton's sources where the two differ."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.harness import Server

STOL = "version should be an integral value > 0"


@pytest.fixture
def stub(server: Server) -> Iterator[pbg.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def _simple(change: Callable[[pb.ModelInferRequest], object]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    change(request)
    return request


def _parameter(where: object, key: str, **value: object) -> None:
    where.parameters[key].CopyFrom(pb.InferParameter(**value))  # type: ignore[attr-defined]


def _output(request: pb.ModelInferRequest, **value: object) -> None:
    _parameter(request.outputs.add(name="OUTPUT0"), "classification", **value)


INFER_ROWS = [
    (
        lambda r: _parameter(r, "triton_x", bool_param=True),
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
        "with 'triton_' are allowed: triton_enable_empty_final_response",
    ),
    (
        lambda r: _parameter(r, "priority", string_param="x"),
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    ),
    (lambda r: _parameter(r, "priority", int64_param=-1), "invalid value for 'priority', expected value >= 0."),
    (
        lambda r: _parameter(r, "timeout", string_param="x"),
        "invalid value type for 'timeout' parameter, expected int64_param.",
    ),
    (
        lambda r: _parameter(r, "sequence_start", int64_param=1),
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
    ),
    (
        lambda r: _parameter(r, "mine", uint64_param=1),
        "invalid value type for 'mine' parameter, expected int64_param, bool_param, or string_param.",
    ),
    (
        lambda r: _output(r, string_param="2"),
        "invalid value type for 'classification' parameter, expected int64_param",
    ),
    (lambda r: _output(r, int64_param=-2), "invalid value for 'classification' parameter, expected >= 0"),
    (
        lambda r: _parameter(r.inputs[0], "shared_memory_region", int64_param=1),
        "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param.",
    ),
    (
        lambda r: _parameter(r.inputs[0], "shared_memory_region", string_param="r"),
        "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'INPUT0'",
    ),
    (
        lambda r: _parameter(r.inputs[0], "shared_memory_offset", int64_param=0),
        "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'",
    ),
    (
        lambda r: setattr(r.inputs[1], "datatype", "int32"),  # datatypes are case-sensitive
        "[request id: <id_unknown>] inference input 'INPUT1' data-type is '<invalid>', but model 'simple' expects "
        "'INT32'",
    ),
    (
        lambda r: r.inputs[1].ClearField("shape"),
        "[request id: <id_unknown>] input 'INPUT1' has no shape but model requires batch dimension for 'simple'",
    ),
    (lambda r: setattr(r, "model_version", "-1"), f"invalid model version specified '-1' , {STOL}"),
    (
        lambda r: setattr(r, "model_version", "x"),
        f"failed to get model version from specified version string 'x' (details: stol), {STOL}",
    ),
]


@pytest.mark.parametrize(("change", "text"), INFER_ROWS)
def test_infer_requests_refused_in_tritons_words(
    stub: pbg.GRPCInferenceServiceStub, change: Callable[[pb.ModelInferRequest], object], text: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(_simple(change))
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, text)


def test_a_version_is_read_as_std_stol_reads_it(stub: pbg.GRPCInferenceServiceStub) -> None:
    answer = stub.ModelInfer(_simple(lambda r: setattr(r, "model_version", " 1st")))
    assert answer.model_version == "1"
    assert stub.ModelReady(pb.ModelReadyRequest(name="simple", version="+1z")).ready


@pytest.mark.parametrize(
    ("method", "message", "code", "text"),
    [
        (
            "ModelMetadata",
            pb.ModelMetadataRequest(name="simple", version="-1"),
            "INVALID_ARGUMENT",
            f"invalid model version specified '-1' , {STOL}",
        ),
        (
            "ModelMetadata",
            pb.ModelMetadataRequest(name="nope", version="abc"),
            "INVALID_ARGUMENT",
            f"failed to get model version from specified version string 'abc' (details: stol), {STOL}",
        ),
        (
            "ModelReady",
            pb.ModelReadyRequest(name="nope", version="x"),
            "INVALID_ARGUMENT",
            f"failed to get model version from specified version string 'x' (details: stol), {STOL}",
        ),
        (
            "ModelStatistics",
            pb.ModelStatisticsRequest(name="simple", version="9"),
            "INVALID_ARGUMENT",
            "requested model version is not available for model 'simple'",
        ),
        (
            "ModelStatistics",
            pb.ModelStatisticsRequest(name="nope", version="1"),
            "INVALID_ARGUMENT",
            "requested model 'nope' is not available",
        ),
        (
            "RepositoryIndex",
            pb.RepositoryIndexRequest(repository_name="x"),
            "UNIMPLEMENTED",
            "'repository_name' specification is not supported",
        ),
    ],
)
def test_model_apis_refuse_in_tritons_words(
    stub: pbg.GRPCInferenceServiceStub, method: str, message: object, code: str, text: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, method)(message)
    assert (caught.value.code().name, caught.value.details()) == (code, text)


# A request that is no message of its type: bytes that do not decode, and a string field
# that is not UTF-8 (an id, a model's name), which protobuf refuses to read.
_NOT_UTF8_NAME = b"\x0a\x07simple\xfe"
_UNPARSABLE = [
    *(
        (method, body)
        for method in ("ServerLive", "ModelReady", "ModelMetadata", "ModelInfer")
        for body in (b"\x0a", b"\x0a\xff\xff")
    ),
    ("ModelReady", _NOT_UTF8_NAME),
    ("ModelMetadata", _NOT_UTF8_NAME),
    ("ModelInfer", _simple(lambda r: None).SerializeToString() + b"\x1a\x03a\xfeb"),  # the id (field 3)
    ("ModelInfer", _NOT_UTF8_NAME + _simple(lambda r: None).SerializeToString()[8:]),
]


@pytest.mark.parametrize(("method", "body"), _UNPARSABLE)
def test_a_request_that_does_not_parse_is_refused_as_grpcs_cpp_server_refuses_it(
    server: Server, method: str, body: bytes
) -> None:
    # Triton 2.51: INTERNAL 'Unable to parse request' for each (INVALID_ARGUMENT with
    # protobuf's own text here before).
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}", lambda b: b, lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            call(body, timeout=30)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")
        stub = pbg.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple")).ready


def test_a_stream_message_that_does_not_parse_ends_the_streams_reading(server: Server) -> None:
    # As in Triton 2.51: grpc's C++ server fails the read, which Triton takes for the end of
    # the client's requests; those before it are answered, those after it never read, and
    # the stream ends with OK.
    requests = [_simple(lambda r, i=i: setattr(r, "id", f"r{i}")).SerializeToString() for i in range(3)]
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer", lambda b: b, pb.ModelStreamInferResponse.FromString
        )
        answers = list(call(iter([requests[0], requests[1], b"\x0a\xff\xff", requests[2]]), timeout=30))
    assert sorted(answer.infer_response.id for answer in answers) == ["r0", "r1"]
    assert all(answer.error_message == "" for answer in answers)
