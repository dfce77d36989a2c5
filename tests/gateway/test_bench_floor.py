"""The bench floor (`python -m bench.floor_server`): tritonclient gets `simple`'s true
answers from it over gRPC and over HTTP, binary and JSON, so its row measures real work."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.floor_server import READY
from protos.ready import parse_ready
from tests.harness import ROOT, terminate


@pytest.fixture(scope="module")
def floor() -> Iterator[dict[str, str]]:
    command = [sys.executable, "-m", "bench.floor_server"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    try:
        fields = parse_ready(process.stdout.readline(), READY)  # the first line, once it serves
        assert fields is not None and {"grpc", "http"} <= fields.keys()
        yield fields
    finally:
        terminate(process, timeout=10)
        process.stdout.close()


INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.full((1, 16), 3, dtype=np.int32)


@pytest.mark.parametrize("binary", [True, False])
def test_http_answers_simple(floor: dict[str, str], binary: bool) -> None:
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor, array in zip(inputs, (INPUT0, INPUT1), strict=True):
        tensor.set_data_from_numpy(array, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    with httpclient.InferenceServerClient(floor["http"]) as client:
        result = client.infer("simple", inputs, outputs=outputs, request_id="r-1")
    assert result.get_response()["id"] == "r-1"
    assert result.as_numpy("OUTPUT0").tolist() == (INPUT0 + INPUT1).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (INPUT0 - INPUT1).tolist()


def test_grpc_answers_simple(floor: dict[str, str]) -> None:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor, array in zip(inputs, (INPUT0, INPUT1), strict=True):
        tensor.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(floor["grpc"]) as client:
        result = client.infer("simple", inputs, request_id="r-2")
    assert result.get_response().id == "r-2"
    assert result.as_numpy("OUTPUT0").tolist() == (INPUT0 + INPUT1).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (INPUT0 - INPUT1).tolist()
