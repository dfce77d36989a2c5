"""Raw binary requests (`Inference-Header-Content-Length: 0`: the whole body is the one
input's data) as Triton answers them: the shape deduced from the model's config, `[1, N]`
for a batching model; a BYTES body as the one element of an input of shape [1]; and
Triton's refusals, texts and statuses (checked against Triton 2.51 with python-backend
models of the same configs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.simple_requests import assert_http_serves
from tests.harness import Server, make_models, turnout_up, write_repository

UNKNOWN_ID = "[request id: <id_unknown>] "


@pytest.fixture(scope="module")
def raw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_raw"), ("simple", "simple_identity"))
    models = make_models()
    models.write_identity(repo, "identity_fp32", "FP32")
    models.write_identity(repo, "identity_fp32_nb", "FP32", max_batch_size=0)
    models.write_identity(repo, "identity_int32_16", "INT32", dims=(16,))
    models.write_identity(repo, "identity_int32_2xn", "INT32", max_batch_size=0, dims=(2, -1))
    models.write_identity(repo, "identity_two_variable", "FP32", dims=(-1, -1))
    models.write_identity(repo, "identity_bytes_one", "BYTES", dims=(1,))
    models.write_identity(repo, "identity_bytes_one_nb", "BYTES", max_batch_size=0, dims=(1,))
    with turnout_up(repo) as running:
        yield running


def post_raw(server: Server, model: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"http://{server.http}/v2/models/{model}/infer",
        content=body,
        headers={"Inference-Header-Content-Length": "0"},
        timeout=30,
    )


def binary_answer(response: httpx.Response) -> tuple[list[dict[str, Any]], bytes]:
    assert response.status_code == 200, response.text
    length = int(response.headers.get("inference-header-content-length", len(response.content)))
    return json.loads(response.content[:length])["outputs"], response.content[length:]


@pytest.mark.parametrize(
    ("model", "data", "shape"),
    [
        ("identity_fp32", np.arange(3, dtype=np.float32), [1, 3]),  # [1, N], not [N, 1]
        ("identity_fp32", np.zeros(0, dtype=np.float32), [1, 0]),
        ("identity_fp32_nb", np.arange(3, dtype=np.float32), [3]),
        ("identity_int32_16", np.arange(16, dtype=np.int32), [1, 16]),
        ("identity_int32_2xn", np.arange(6, dtype=np.int32), [2, 3]),
    ],
)
def test_raw_binary_shape_is_deduced_as_triton_does(raw_server: Server, model: str, data: Any, shape: list) -> None:
    outputs, tail = binary_answer(post_raw(raw_server, model, data.tobytes()))
    datatype = "FP32" if data.dtype == np.float32 else "INT32"
    # Every output of a raw request comes back binary.
    assert outputs == [
        {"name": "OUTPUT0", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": data.nbytes}}
    ]
    assert tail == data.tobytes()


@pytest.mark.parametrize(("model", "shape"), [("identity_bytes_one", [1, 1]), ("identity_bytes_one_nb", [1])])
@pytest.mark.parametrize("body", [b"he\x00llo \xc3\xa9\xf0\x9f\x98\x80", b""], ids=["text", "empty"])
def test_raw_bytes_body_is_one_element(raw_server: Server, model: str, shape: list, body: bytes) -> None:
    """No length prefix: Triton takes the body as the element and prepends its length."""
    outputs, tail = binary_answer(post_raw(raw_server, model, body))
    element = len(body).to_bytes(4, "little") + body
    assert outputs == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": len(element)}}
    ]
    assert tail == element


@pytest.mark.parametrize(
    ("model", "body", "text"),
    [
        (
            "simple_identity",
            b"hello",
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        (
            "identity_two_variable",
            bytes(12),
            "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
            "variable-sized dimension",
        ),
        (
            "identity_fp32",
            bytes(10),
            "input byte size mismatch for input 'raw_input' for model 'identity_fp32'. Expected 8, got 10",
        ),
        (
            "identity_int32_16",
            bytes(60),
            "input byte size mismatch for input 'raw_input' for model 'identity_int32_16'. Expected 64, got 60",
        ),
        (
            "identity_int32_2xn",
            bytes(20),
            "input byte size mismatch for input 'raw_input' for model 'identity_int32_2xn'. Expected 16, got 20",
        ),
    ],
)
def test_raw_binary_refusals(raw_server: Server, model: str, body: bytes, text: str) -> None:
    response = post_raw(raw_server, model, body)
    assert (response.status_code, response.json()) == (400, {"error": UNKNOWN_ID + text})
    assert_http_serves(raw_server.http)


def test_raw_binary_to_a_model_of_two_inputs(raw_server: Server) -> None:
    response = post_raw(raw_server, "simple", bytes(64))
    text = "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model configuration"
    assert (response.status_code, response.json()) == (400, {"error": UNKNOWN_ID + text})


def test_an_empty_body_is_the_raw_form(raw_server: Server) -> None:
    """With no Inference-Header-Content-Length, Triton takes the body's length for the
    header's: an empty body is a raw request of no bytes, not an empty JSON document."""
    response = httpx.post(f"http://{raw_server.http}/v2/models/simple/infer", content=b"", timeout=10)
    text = "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model configuration"
    assert (response.status_code, response.json()) == (400, {"error": UNKNOWN_ID + text})


def test_raw_binary_to_an_unknown_model(raw_server: Server) -> None:
    response = post_raw(raw_server, "nope", b"x")
    assert (response.status_code, response.json()) == (404, {"error": "Request for unknown model: 'nope' is not found"})
