"""An HTTP infer request whose path and headers were seen before, on a request that passed
every check made before its body is read, has only its body read and parsed (the front's
remembered plans, gateway.http.front). Each check here sends a request whose path and
headers match one already served, and its answer must be what the full path gives: for
that it is compared with the same request sent with one more header (a new head, read
in full)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.harness import Server, turnout_up, write_repository

PATH = "/v2/models/simple/infer"
FRESH = {"X-Fresh": "1"}  # one more header: a head never seen before, so read in full


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_http_known"), ("simple",))
    with turnout_up(repo, "--model-control-mode=explicit", "--load-model=simple") as running:
        yield running


def _body(first: np.ndarray, second: np.ndarray, binary_output0: bool = True) -> tuple[bytes, int]:
    """An infer body of binary inputs and its JSON header's length."""
    header = {
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
            for name in ("INPUT0", "INPUT1")
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": binary_output0}},
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
        ],
    }
    text = json.dumps(header).encode()
    if not binary_output0:  # `false` is a byte longer than `true`: the headers' lengths stay equal
        text = text.replace(b", ", b",", 1)
    return text + first.astype(np.int32).tobytes() + second.astype(np.int32).tobytes(), len(text)


def _infer(
    server: Server, body: bytes, json_length: int, method: str = "POST", extra: dict[str, str] | None = None
) -> tuple[int, str, bytes]:
    headers = {"Inference-Header-Content-Length": str(json_length), "Content-Type": "application/octet-stream"}
    connection = http.client.HTTPConnection(server.http, timeout=10)
    try:
        connection.request(method, PATH, body=body, headers={**headers, **(extra or {})})
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type", ""), answer.read()
    finally:
        connection.close()


def _outputs(answer: bytes, header_length: int) -> dict[str, list[int]]:
    """Each output of an answer, binary or JSON, as a list."""
    document = json.loads(answer[:header_length])
    outputs, at = {}, header_length
    for output in document["outputs"]:
        if "data" in output:
            outputs[output["name"]] = output["data"]
            continue
        size = output["parameters"]["binary_data_size"]
        outputs[output["name"]] = np.frombuffer(answer[at : at + size], np.int32).tolist()
        at += size
    return outputs


def _infer_outputs(server: Server, body: bytes, json_length: int) -> dict[str, list[int]]:
    """The outputs of an answered infer, asked for uncompressed."""
    headers = {"Inference-Header-Content-Length": str(json_length), "Accept-Encoding": "identity"}
    connection = http.client.HTTPConnection(server.http, timeout=10)
    try:
        connection.request("POST", PATH, body=body, headers=headers)
        answer = connection.getresponse()
        assert answer.status == 200
        length = answer.getheader("Inference-Header-Content-Length")
        content = answer.read()
        return _outputs(content, int(length) if length else len(content))
    finally:
        connection.close()


def test_requests_with_one_path_and_head_are_each_answered_from_their_own_body(server: Server) -> None:
    for seed in range(4):
        first, second = np.full(16, seed), np.arange(16)
        body, json_length = _body(first, second)
        outputs = _infer_outputs(server, body, json_length)
        assert outputs == {"OUTPUT0": (first + second).tolist(), "OUTPUT1": (first - second).tolist()}


def test_a_json_header_of_the_same_length_that_asks_otherwise_is_answered_as_it_asks(server: Server) -> None:
    first, second = np.full(16, 7), np.arange(16)
    binary, json_length = _body(first, second)
    as_json, json_length_too = _body(first, second, binary_output0=False)
    assert (len(binary), json_length) == (len(as_json), json_length_too)  # one head for both
    for _ in range(2):
        outputs = _infer_outputs(server, binary, json_length)
        assert outputs["OUTPUT0"] == (first + second).tolist()
    outputs = _infer_outputs(server, as_json, json_length)
    assert outputs == {"OUTPUT0": (first + second).tolist(), "OUTPUT1": (first - second).tolist()}
    answer = _infer(server, as_json, json_length, extra={"Accept-Encoding": "identity"})
    assert b'"data":[' in answer[2]


def test_another_method_on_a_path_and_head_served_before_is_refused_as_any_other(server: Server) -> None:
    body, json_length = _body(np.ones(16), np.ones(16))
    assert _infer(server, body, json_length)[0] == 200
    refused = _infer(server, body, json_length, method="PUT")
    assert refused[0] == 405
    assert refused == _infer(server, body, json_length, method="PUT", extra=FRESH)


def test_a_body_that_arrives_in_two_parts_is_read_whole(server: Server) -> None:
    first, second = np.full(16, 3), np.full(16, 2)
    body, json_length = _body(first, second)
    _infer_outputs(server, body, json_length)  # the plan
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: t\r\nInference-Header-Content-Length: {json_length}\r\n"
        f"Accept-Encoding: identity\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(2):  # the second with its head now known to the connection's side too
            sock.sendall(head + body[:100])
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.recv(1)  # nothing is answered before the whole body came
            sock.settimeout(10)
            sock.sendall(body[100:])
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + _length(answer):
                answer += sock.recv(65536)
            status, _, rest = answer.partition(b"\r\n")
            assert status == b"HTTP/1.1 200 OK"
            answer_head, _, content = rest.partition(b"\r\n\r\n")
            header_length = int(_header(answer_head, b"inference-header-content-length"))
            assert _outputs(content, header_length) == {
                "OUTPUT0": (first + second).tolist(),
                "OUTPUT1": (first - second).tolist(),
            }


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    raise AssertionError(f"no {name!r} in {head!r}")


def _length(answer: bytes) -> int:
    return int(_header(answer[: answer.index(b"\r\n\r\n")], b"content-length"))


def test_a_model_unloaded_after_its_requests_were_served_is_refused_as_any_other(server: Server) -> None:
    body, json_length = _body(np.ones(16), np.ones(16))
    for _ in range(2):
        assert _infer(server, body, json_length)[0] == 200
    client = grpcclient.InferenceServerClient(server.grpc)
    client.unload_model("simple")
    try:
        refused = _infer(server, body, json_length)
        assert refused[0] == 404
        assert refused == _infer(server, body, json_length, extra=FRESH)
    finally:
        client.load_model("simple")
    assert _infer(server, body, json_length)[0] == 200
