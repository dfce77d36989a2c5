"""Request validation: every rejection carries Triton's status and exact text."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.sidecars.sidecar_harness import Sidecar, simple_inputs

NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to"
    " each input shape. If you want to specify the full shape including the batch dim in your input dims config,"
    " try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


@pytest.fixture
def client(main_sidecar: Sidecar) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(main_sidecar.url)


@pytest.fixture
def stub(main_sidecar: Sidecar) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(main_sidecar.url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def rejected(client: grpcclient.InferenceServerClient, model: str, inputs: list, **kwargs: object) -> str:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, inputs, **kwargs)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", caught.value
    return str(caught.value.message())


def int_input(name: str, data: np.ndarray, datatype: str = "INT32") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def test_wrong_input_name(client: grpcclient.InferenceServerClient) -> None:
    row = np.zeros((1, 16), dtype=np.int32)
    message = rejected(client, "simple", [int_input("INPUT0", row), int_input("INPUTX", row)])
    assert message == "unexpected inference input 'INPUTX' for model 'simple'"


def test_wrong_requested_output(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    message = rejected(client, "simple", inputs, outputs=[grpcclient.InferRequestedOutput("NOPE")])
    assert message == "unexpected inference output 'NOPE' for model 'simple'"


def test_missing_input(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    message = rejected(client, "simple", inputs[:1])
    assert message == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_extra_input(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    extra = int_input("INPUT2", np.zeros((1, 16), dtype=np.int32))
    message = rejected(client, "simple", [*inputs, extra], request_id="abc")
    assert message.startswith("[request id: abc] expected 2 inputs but got 3 inputs for model 'simple'.")


def test_wrong_shape_with_note(client: grpcclient.InferenceServerClient) -> None:
    row = np.zeros((1, 15), dtype=np.int32)
    message = rejected(client, "simple", [int_input("INPUT0", row), int_input("INPUT1", row)])
    assert message == (
        # Both are wrong: core names the one its map of inputs walks first (protos.input_order).
        "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'simple'. "
        f"Expected [-1,16], got [1,15].{NOTE}"
    )


def test_wrong_shape_without_note(client: grpcclient.InferenceServerClient) -> None:
    row = np.zeros(15, dtype=np.int32)
    message = rejected(client, "simple_nobatch", [int_input("INPUT0", row), int_input("INPUT1", row)])
    assert message == (
        "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'simple_nobatch'. "
        "Expected [16], got [15]. "  # Triton's trailing space, where no note follows
    )


def test_negative_dim(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[-1, 16])
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.extend([b"\0" * 64, b"\0" * 64])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A batch dim of -1 is a batch size like any other to core: INPUT1's 1 disagrees with it.
    assert caught.value.details() == (
        "[request id: <id_unknown>] input 'INPUT0' batch size does not match other inputs for 'simple'"
    )


def test_wrong_datatype(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient, dtype=np.float32)
    message = rejected(client, "simple", inputs)
    assert message == (
        "[request id: <id_unknown>] inference input 'INPUT1' data-type is 'FP32', but model 'simple' expects 'INT32'"
    )


def test_batch_too_large(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient, batch=9)
    message = rejected(client, "simple", inputs)
    assert message == "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'simple'"


def test_batch_dims_disagree(client: grpcclient.InferenceServerClient) -> None:
    message = rejected(
        client,
        "simple",
        [int_input("INPUT0", np.zeros((2, 16), dtype=np.int32)), int_input("INPUT1", np.zeros((1, 16), np.int32))],
    )
    # Core walks INPUT1 first: its batch size stands, INPUT0's disagrees.
    assert message == "[request id: <id_unknown>] input 'INPUT0' batch size does not match other inputs for 'simple'"


def test_byte_size_mismatch(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    inputs[1] = int_input("INPUT1", np.zeros((1, 15), dtype=np.int32))
    inputs[1].set_shape([1, 16])
    message = rejected(client, "simple", inputs)
    assert message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 60"
    )


def test_bytes_element_count_mismatch(client: grpcclient.InferenceServerClient) -> None:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 15], "BYTES")  # shape changed after the data
        tensor.set_data_from_numpy(np.array([[b"1"] * 15], dtype=np.object_))
        tensor.set_shape([1, 16])
        tensors.append(tensor)
    message = rejected(client, "simple_string", tensors)
    assert message == (
        "[request id: <id_unknown>] expected 16 string elements for inference input 'INPUT1' "
        "for model 'simple_string', got 15"
    )


def test_input_without_data(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(b"\0" * 64)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "unable to find data for input tensor 'INPUT1' for model 'simple' in request."


def test_contents_and_raw_together(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    first = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    first.contents.int_contents.extend(range(16))
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(b"\0" * 64)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    )


def test_typed_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple", id="typed")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2
    assert not response.outputs[0].HasField("contents")
    total = np.frombuffer(response.raw_output_contents[0], dtype="<i4")
    np.testing.assert_array_equal(total, np.arange(16) * 2)


def test_typed_string_contents(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple_string")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(str(i).encode() for i in range(16))
    response = stub.ModelInfer(request)
    assert response.outputs[0].datatype == "BYTES"
    assert list(response.outputs[0].shape) == [1, 16]


def test_rank_zero_io_is_dims_one_without_a_reshape(client: grpcclient.InferenceServerClient) -> None:
    # Triton's auto-complete writes no reshape for a model that does not batch (an empty
    # one would be a scalar config tensor); its backend feeds the model a scalar.
    config = client.get_model_config("auto_scalar").config
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1]
    assert not config.input[0].HasField("reshape")
    tensor = grpcclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([2.5], dtype=np.float32))
    result = client.infer("auto_scalar", [tensor])
    np.testing.assert_array_equal(result.as_numpy("Y"), np.array([2.5], dtype=np.float32))


def test_repeated_input_name(client: grpcclient.InferenceServerClient) -> None:
    inputs, _ = simple_inputs(grpcclient)
    message = rejected(client, "simple", [inputs[0], inputs[0]], request_id="twice")
    assert message == "[request id: twice] input 'INPUT0' already exists in request"


def test_repeated_output_name_before_unknown_names(client: grpcclient.InferenceServerClient) -> None:
    # Triton adds every requested output before it checks any against the model.
    inputs, _ = simple_inputs(grpcclient)
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("NOPE", "OUTPUT0", "NOPE")]
    message = rejected(client, "simple", inputs, outputs=outputs)
    assert message == "[request id: <id_unknown>] output 'NOPE' already exists in request"


@pytest.mark.parametrize(
    ("model", "datatype", "shape", "message"),
    [
        ("identity_fp32", "FP32", [1, 2**62], f"byte size for tensor 'INPUT0' exceeds maximum size of {2**63 - 1}"),
        ("identity_int16", "INT16", [1, 2**62], f"byte size for tensor 'INPUT0' exceeds maximum size of {2**63 - 1}"),
    ],
)
def test_shape_past_the_byte_size(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str, datatype: str, shape: list[int], message: str
) -> None:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def _fill(field: str, values: list, datatype: str = "INT32"):
    def fill(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> None:
        tensor.datatype = datatype
        tensor.contents.SetInParent()
        if field:
            getattr(tensor.contents, field).extend(values)

    return fill


TYPED = "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple'"


@pytest.mark.parametrize(
    ("fills", "text"),
    [
        ([_fill("fp32_contents", [1.0] * 16)], f"{TYPED} of type 'FP32', expected datatype 'INT32'"),
        (
            [_fill("int_contents", [1] * 16), _fill("fp32_contents", [1.0] * 16)],
            f"{TYPED}, binary data was already supplied.",
        ),
        ([_fill("int_contents", [1] * 16, "FP32")], f"{TYPED} of type 'INT32', expected datatype 'FP32'"),
        ([_fill("int_contents", [1] * 16, "FP16")], f"{TYPED} of type 'INT32', expected datatype 'FP16'"),
        (
            [_fill("", [])],
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'simple'. "
            "Expected 64, got 0",
        ),
        (
            [_fill("", [], "FP16")],
            "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP16', "
            "but model 'simple' expects 'INT32'",
        ),
    ],
)
def test_typed_contents_are_read_as_triton_reads_them(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, fills: list, text: str
) -> None:
    """Triton 2.51's answers, side by side: one list at most, of the declared datatype,
    checked as the request is built; an empty one is no data."""
    request = service_pb2.ModelInferRequest(model_name="simple")
    first = request.inputs.add(name="INPUT0", shape=[1, 16])
    for fill in fills:
        fill(first)
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16]).contents.int_contents.extend([1] * 16)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, text)
