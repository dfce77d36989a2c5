"""--http-header-forward-pattern and --grpc-header-forward-pattern, as Triton: headers
(metadata) whose names match reach the model as request parameters, over HTTP, gRPC and
a gRPC stream; a matching name Triton keeps for itself refuses the request."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.python_models import write_python_models
from tests.e2e.simple_requests import error_of
from tests.harness import Server, turnout_up, write_repository

PATTERN = "^(echo|priority|triton_x)$"
RESERVED = "Header 'priority' is reserved for Triton usage and cannot be forwarded."


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_forward"), ("simple",))  # the ensembles use it
    write_python_models(repo)
    flags = (f"--http-header-forward-pattern={PATTERN}", f"--grpc-header-forward-pattern={PATTERN}")
    with turnout_up(repo, *flags) as running:
        yield running


def _inputs(module: Any) -> list[Any]:
    a = np.ones((1, 4), np.float32)
    inputs = [module.InferInput("INPUT0", [1, 4], "FP32"), module.InferInput("INPUT1", [1, 4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs


def _echo(result: Any, grpc: bool) -> str:
    # add_sub answers the request's `echo` parameter in its response parameters.
    parameters = result.get_response().parameters if grpc else result.get_response()["parameters"]
    return str(parameters["echo"].string_param if grpc else parameters["echo"])


def test_http_headers_reach_the_model(up: Server) -> None:
    with httpclient.InferenceServerClient(up.http) as client:
        result = client.infer("add_sub", _inputs(httpclient), headers={"echo": "from a header", "other": "x"})
        assert _echo(result, grpc=False) == "from a header"
        assert _echo(client.infer("add_sub", _inputs(httpclient), headers={"other": "x"}), grpc=False) == ""
        error = error_of(client.infer, "add_sub", _inputs(httpclient), headers={"echo": "x", "priority": "1"})
        assert (error.status(), error.message()) == ("400", RESERVED)


def test_grpc_metadata_reaches_the_model(up: Server) -> None:
    with grpcclient.InferenceServerClient(up.grpc) as client:
        result = client.infer("add_sub", _inputs(grpcclient), headers={"echo": "from metadata"})
        assert _echo(result, grpc=True) == "from metadata"
        error = error_of(client.infer, "add_sub", _inputs(grpcclient), headers={"priority": "1"})
        assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", RESERVED)


def test_stream_metadata_reaches_the_model(up: Server) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(up.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)), headers={"echo": "streamed"})
        try:
            client.async_stream_infer("add_sub", _inputs(grpcclient))
            result, error = answers.get(timeout=60)
        finally:
            client.stop_stream()
    assert error is None
    assert _echo(result, grpc=True) == "streamed"
