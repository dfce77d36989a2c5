"""A request whose head (model, version, inputs' names, datatypes and shapes, outputs)
the sidecar has seen before is read from its raw buffers where they lie, without a
protobuf parse. Each check here sends a request once before any like it was served and
again after: the answers, refusals included, must be the same both times."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.harness import Server, turnout_up, write_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_known"), ("simple", "simple_string"))
    flags = ("--model-control-mode=explicit", "--load-model=simple", "--load-model=simple_string")
    with turnout_up(repo, *flags) as running:
        yield running


@pytest.fixture
def stub(server: Server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request(raw: list[bytes], request_id: str = "") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="simple", id=request_id)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    request.raw_input_contents.extend(raw)
    return request


def _answer(stub: service_pb2_grpc.GRPCInferenceServiceStub, request: service_pb2.ModelInferRequest) -> object:
    """The response's outputs as arrays, or the refusal's code and text."""
    try:
        response = stub.ModelInfer(request)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return [np.frombuffer(raw, np.int32).tolist() for raw in response.raw_output_contents], response.id


def _good(seed: int) -> list[bytes]:
    return [np.full(16, seed, np.int32).tobytes(), np.arange(16, dtype=np.int32).tobytes()]


ZEROS = np.zeros(16, np.int32).tobytes()
ODD = {  # each with the head of a good request; what Triton answers, served or refused
    "a buffer short by four bytes": ([ZEROS[:-4], ZEROS], grpc.StatusCode.INVALID_ARGUMENT),
    "a buffer long by one byte": ([ZEROS + b"\0", ZEROS], grpc.StatusCode.INVALID_ARGUMENT),
    "one buffer for two inputs": ([ZEROS], grpc.StatusCode.INVALID_ARGUMENT),
    "three buffers for two inputs": ([ZEROS] * 3, None),  # the third is never read
}


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
def test_an_odd_request_is_answered_the_same_before_and_after_a_request_like_it_was_served(
    server: Server, stub: service_pb2_grpc.GRPCInferenceServiceStub, odd: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    client.unload_model("simple")
    client.load_model("simple")  # a new version: nothing of the last one's is remembered
    raw, refusal = ODD[odd]
    before = _answer(stub, _request(raw))
    if refusal is None:
        assert before == ([[0] * 16] * 2, "")
    else:
        assert isinstance(before, tuple) and before[0] == refusal, before
    for seed in range(3):
        assert _answer(stub, _request(_good(seed))) == (
            [[seed + i for i in range(16)], [seed - i for i in range(16)]],
            "",
        )
    assert _answer(stub, _request(raw)) == before
    assert _answer(stub, _request(_good(7)))[0][0][0] == 7  # type: ignore[index]  # still serving


def test_a_request_with_an_id_is_answered_with_its_id(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    for seed, request_id in enumerate(["first", "second", ""]):
        outputs, answered_id = _answer(stub, _request(_good(seed), request_id))  # type: ignore[misc]
        assert answered_id == request_id
        assert outputs[0][:2] == [seed, seed + 1]


def test_a_model_unloaded_after_its_requests_were_served_is_refused_as_before(
    server: Server, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    client.unload_model("simple")
    try:
        never_served = _answer(stub, _request(_good(1)))
    finally:
        client.load_model("simple")
    for seed in range(3):
        _answer(stub, _request(_good(seed)))
    client.unload_model("simple")
    try:
        assert isinstance(never_served, tuple), never_served
        assert _answer(stub, _request(_good(1))) == never_served
    finally:
        client.load_model("simple")
    assert _answer(stub, _request(_good(2)))[0][0][0] == 2  # type: ignore[index]


def test_string_requests_of_one_head_are_each_read_in_full(server: Server) -> None:
    # A BYTES input's elements, not its size, decide what is valid: every request of that
    # head is parsed and checked, whatever its neighbours held.
    client = grpcclient.InferenceServerClient(server.grpc)
    for width in (1, 3, 1, 8):  # int32 inside the model
        first = np.array([[str(10**width + i).encode() for i in range(16)]], dtype=np.object_)
        second = np.array([[b"1"] * 16], dtype=np.object_)
        inputs = []
        for name, array in (("INPUT0", first), ("INPUT1", second)):
            tensor = grpcclient.InferInput(name, [1, 16], "BYTES")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        sums = client.infer("simple_string", inputs).as_numpy("OUTPUT0")
        assert [int(x) for x in sums[0]] == [10**width + i + 1 for i in range(16)]
    bad = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
    bad.set_data_from_numpy(np.array([[b"x"] * 16], dtype=np.object_))
    good = grpcclient.InferInput("INPUT1", [1, 16], "BYTES")
    good.set_data_from_numpy(np.array([[b"1"] * 16], dtype=np.object_))
    with pytest.raises(InferenceServerException):
        client.infer("simple_string", [bad, good])
    assert client.is_server_live()
