"""Every datatype round-trips through an identity model, and classification outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype

from tests.sidecars.sidecar_harness import DATATYPES, LABELS, Sidecar


@pytest.fixture
def client(main_sidecar: Sidecar) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(main_sidecar.url)


def sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"a", b"", b"\xc3\xa9t\xc3\xa9", b"longer string"]], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([[True, False, True, True]])
    dtype = triton_to_np_dtype(datatype)
    values = np.array([[0, 1, 2, 127]]).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        values = values / 3
        values = values.astype(dtype)
    return values


@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_round_trip(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    output = result.get_output("OUTPUT0")
    assert output.datatype == datatype
    assert list(output.shape) == [1, 4]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_classification_with_labels(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[0.1, 0.7, 0.2, 0.05], [0.9, 0.01, 0.02, 0.03]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("classifier", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    output = result.get_output("OUTPUT0")
    assert output.datatype == "BYTES"
    assert list(output.shape) == [2, 2]
    got = result.as_numpy("OUTPUT0")
    assert [s.decode() for s in got[0]] == [f"0.700000:1:{LABELS[1]}", f"0.200000:2:{LABELS[2]}"]
    assert [s.decode() for s in got[1]] == [f"0.900000:0:{LABELS[0]}", f"0.030000:3:{LABELS[3]}"]


def test_classification_without_labels(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[3, 9, 1]], dtype=np.int32)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
    tensor.set_data_from_numpy(data)
    result = client.infer(
        "identity_int32", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=5)]
    )
    assert [s.decode() for s in result.as_numpy("OUTPUT0")[0]] == ["9:1", "3:0", "1:2"]
