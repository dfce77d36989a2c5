"""BYTES through the ONNX Runtime sidecar: arbitrary bytes (every byte value, NUL, sequences
that are not UTF-8) reach the model as sent and come back byte-exact, over HTTP JSON,
HTTP binary and gRPC (the sidecar runs models with string tensors through ONNX Runtime's
C API, as Triton's backend does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.harness import Server, make_models, turnout_up, write_repository

EVERY_BYTE = bytes(range(256))
NOT_UTF8 = [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x80b"]
# What the bytes_equal model expects, element by element.
EXPECTED = [EVERY_BYTE, b"\x00", b"\xff\x00\xfe", *NOT_UTF8, "h\u00e9 \u4e2d \U0001f600".encode()]
# Every byte value as text: each code point 0..255 (NUL first), as UTF-8.
EVERY_CODE_POINT = "".join(chr(i) for i in range(256)).encode()
TEXT = [EVERY_CODE_POINT, b"\x00", b"a\x00b\x00", b"", "h\u00e9 \u4e2d \U0001f600".encode()]


@pytest.fixture(scope="module")
def bytes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_bytes"), ("simple", "simple_identity"))
    make_models().write_bytes_equal(repo, "bytes_equal", EXPECTED)
    with turnout_up(repo) as running:
        yield running


def row(values: list[bytes]) -> np.ndarray:
    array = np.empty((1, len(values)), dtype=np.object_)
    array[0, :] = values
    return array


def vector(values: list[bytes]) -> np.ndarray:
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    return array


def infer_bytes(server: Server, protocol: str, model: str, values: np.ndarray) -> Any:
    """Send `values` as INPUT0 and return OUTPUT0 as numpy (BYTES come back as bytes)."""
    if protocol == "grpc":
        with grpcclient.InferenceServerClient(server.grpc) as client:
            tensor = grpcclient.InferInput("INPUT0", list(values.shape), "BYTES")
            tensor.set_data_from_numpy(values)
            return client.infer(model, [tensor]).as_numpy("OUTPUT0")
    binary = protocol == "http-binary"
    with httpclient.InferenceServerClient(server.http) as client:
        tensor = httpclient.InferInput("INPUT0", list(values.shape), "BYTES")
        tensor.set_data_from_numpy(values, binary_data=binary)
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        answer = client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT0")
    if binary or answer.dtype == np.bool_:
        return answer
    return np.vectorize(lambda s: s.encode(), otypes=[np.object_])(answer)  # JSON strings come back as str


def json_string(value: bytes) -> bytes:
    """A JSON string holding `value` as Triton's parser takes it: escapes below 0x20 and for
    the quote and backslash, every other byte raw (rapidjson does not validate UTF-8)."""
    escaped = b"".join(b"\\u%04x" % byte if byte < 0x20 or byte in b'"\\' else bytes([byte]) for byte in value)
    return b'"' + escaped + b'"'


@pytest.mark.parametrize("protocol", ["http-binary", "grpc"])
def test_bytes_reach_the_model_as_sent(bytes_server: Server, protocol: str) -> None:
    """Every byte value and sequences that are not UTF-8 arrive byte-exact (the model
    compares each element with the bytes it expects)."""
    assert infer_bytes(bytes_server, protocol, "bytes_equal", vector(EXPECTED)).tolist() == [True] * len(EXPECTED)
    changed = [b"\xff\xfd", *EXPECTED[1:]]
    assert infer_bytes(bytes_server, protocol, "bytes_equal", vector(changed)).tolist()[0] is False


def test_bytes_that_are_not_utf8_in_json_strings_reach_the_model(bytes_server: Server) -> None:
    # Triton's JSON parser keeps them as they are; so does the infer body's parse.
    data = b"[" + b",".join(json_string(value) for value in EXPECTED) + b"]"
    body = b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[%d],"data":%s}]}' % (len(EXPECTED), data)
    response = httpx.post(f"http://{bytes_server.http}/v2/models/bytes_equal/infer", content=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [True] * len(EXPECTED)


@pytest.mark.parametrize("protocol", ["http-json", "http-binary", "grpc"])
def test_text_comes_back_byte_exact(bytes_server: Server, protocol: str) -> None:
    """Every code point 0..255 (NUL included), NULs inside elements, empty and 4-byte UTF-8."""
    echoed = infer_bytes(bytes_server, protocol, "simple_identity", row(TEXT))
    assert echoed.tolist() == [TEXT]


@pytest.mark.parametrize("protocol", ["http-binary", "grpc"])
def test_any_bytes_come_back_byte_exact(bytes_server: Server, protocol: str) -> None:
    values = [EVERY_BYTE, b"\x00", b"\xff\x00\xfe", *NOT_UTF8]
    assert infer_bytes(bytes_server, protocol, "simple_identity", row(values)).tolist() == [values]


def test_any_bytes_come_back_byte_exact_in_json(bytes_server: Server) -> None:
    """Sent as JSON strings, answered as JSON: Triton writes BYTES into the answer's strings
    as they are (control characters, the quote and the backslash escaped), so a client
    reading the body's bytes as they came gets every element back."""
    values = [EVERY_BYTE, b"\x00", b"\xff\x00\xfe", *NOT_UTF8]
    data = b"[" + b",".join(json_string(value) for value in values) + b"]"
    body = b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1,%d],"data":%s}]}' % (len(values), data)
    response = httpx.post(f"http://{bytes_server.http}/v2/models/simple_identity/infer", content=body, timeout=30)
    assert response.status_code == 200, response.text
    answer = json.loads(response.content.decode("utf-8", "surrogateescape"))
    assert [text.encode("utf-8", "surrogateescape") for text in answer["outputs"][0]["data"]] == values


def test_json_output_carries_text_as_it_is(bytes_server: Server) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "data": ["\x00\x01\u00ff", "\u4e2d"]}]}
    )
    response = httpx.post(f"http://{bytes_server.http}/v2/models/simple_identity/infer", content=body, timeout=30)
    assert response.status_code == 200, response.text
    assert b'"data":["\\u0000\\u0001\xc3\xbf","\xe4\xb8\xad"]' in response.content
