"""Hostile input against a real `turnout up`: hypothesis drives HTTP JSON, binary
framing, shapes, BYTES length prefixes, shared-memory keys and offsets, and malformed
protobuf over gRPC. The server must answer each with a clear error (never the
catch-all "internal error"), never crash, and not grow without bound.

`make test` runs FUZZ_EXAMPLES cases per property (seeded, so runs repeat); more with
`TURNOUT_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/e2e/test_e2e_fuzz.py`.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.simple_requests import check_simple, grpc_inputs, simple_arrays
from tests.harness import Server, turnout_up, write_repository

FUZZ_EXAMPLES = int(os.environ.get("TURNOUT_FUZZ_EXAMPLES", "30"))
MAX_INPUT = 1 << 20
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=FUZZ_EXAMPLES <= 100,  # the bounded run repeats exactly; long runs explore
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
# Triton's HTTP statuses for client errors, and 503 for overload; 500 only with a message
# of its own (the catch-all "internal error:" means an exception escaped a check).
ANSWERS = {200, 400, 403, 404, 405, 409, 413, 500, 501, 503}
DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16", "NOPE", ""]
SHAPE_DIM = st.one_of(st.integers(-3, 20), st.sampled_from([2**31, 2**32 + 16, 2**62, 2**63 - 1, -(2**63), 2**64 + 1]))
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20)
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_fuzz"), ("simple", "simple_string", "simple_identity"))
    with turnout_up(
        repo,
        "--allow-client-shm=true",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-max-input-size={MAX_INPUT}",
    ) as running:
        yield running


@pytest.fixture(scope="module")
def http(target: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{target.http}", timeout=30) as client:
        yield client


def _clear(response: httpx.Response) -> None:
    assert response.status_code in ANSWERS, (response.status_code, response.text)
    if response.status_code < 400 or not response.content:
        return
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        # A request the HTTP server itself refuses (uvicorn/h11: a control byte in a header).
        assert response.status_code == 400 and response.headers["content-type"].startswith("text/plain"), response
        return
    assert isinstance(error, str) and error
    assert not error.startswith("internal error:"), error


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _tensor() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "name": st.sampled_from(["INPUT0", "INPUT1", "x", ""]),
            "shape": st.lists(SHAPE_DIM, max_size=4),
            "datatype": st.sampled_from(DATATYPES),
        },
        optional={
            "data": st.one_of(st.lists(JSON_LEAF, max_size=40), JSON_VALUE),
            "parameters": st.dictionaries(
                st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_offset", "x"]),
                JSON_LEAF,
                max_size=3,
            ),
        },
    )


@FUZZ
@given(
    model=st.sampled_from(["simple", "simple_string", "simple_identity"]),
    document=st.one_of(
        JSON_VALUE,
        st.fixed_dictionaries(
            {"inputs": st.lists(_tensor(), max_size=3)},
            optional={
                "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=8)}), max_size=2),
                "parameters": st.dictionaries(
                    st.sampled_from(["timeout", "priority", "binary_data_output"]), JSON_LEAF
                ),
                "id": JSON_LEAF,
            },
        ),
    ),
)
def test_fuzz_http_json(http: httpx.Client, model: str, document: Any) -> None:
    _clear(http.post(f"/v2/models/{model}/infer", content=json.dumps(document)))


@FUZZ
@given(
    header=st.one_of(st.integers(-(2**40), 2**63), st.text(max_size=12)),
    body=st.binary(max_size=512),
    json_head=st.booleans(),
)
def test_fuzz_binary_framing(http: httpx.Client, header: int | str, body: bytes, json_head: bool) -> None:
    if json_head:
        # A well-formed JSON head claiming binary tensors, then arbitrary bytes.
        head = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
                ]
            }
        ).encode()
        header, body = len(head), head + body
    try:
        headers = {"Inference-Header-Content-Length": str(header)}
        response = http.post("/v2/models/simple/infer", content=body, headers=headers)
    except (httpx.LocalProtocolError, UnicodeEncodeError):
        return  # a header value httpx itself refuses to send
    _clear(response)


@FUZZ
@given(
    prefixes=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20),
    tail=st.binary(max_size=64),
    count=st.integers(-1, 20),
)
def test_fuzz_bytes_length_prefixes(http: httpx.Client, prefixes: list[int], tail: bytes, count: int) -> None:
    raw = b"".join(struct.pack("<I", p) + b"x" * min(p, 4) for p in prefixes) + tail
    head = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [count], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    response = http.post(
        "/v2/models/simple_identity/infer",
        content=head + raw,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    _clear(response)


@FUZZ
@given(
    key=st.one_of(
        st.text(max_size=30),
        st.sampled_from(["/../../etc/passwd", "../etc/hostname", "/", "", "/.", "/..", "a/b", "/proc/self/mem"]),
    ),
    offset=st.one_of(st.integers(-5, 2**20), st.sampled_from([2**63, 2**64 - 1, 2**64])),
    byte_size=st.one_of(st.integers(-5, 2**20), st.sampled_from([2**63, 2**64 - 1, 2**64])),
)
def test_fuzz_shared_memory_register(http: httpx.Client, key: str, offset: int, byte_size: int) -> None:
    document = {"key": key, "offset": offset, "byte_size": byte_size}
    response = http.post("/v2/systemsharedmemory/region/fuzz/register", content=json.dumps(document))
    _clear(response)
    # A key outside /dev/shm never registers.
    assert response.status_code != 200 or ("/" not in key.lstrip("/") and key.lstrip("/") not in ("", ".", ".."))
    _clear(http.post("/v2/systemsharedmemory/region/fuzz/unregister"))


@FUZZ
@given(payload=st.binary(max_size=256), method=st.sampled_from(["ModelInfer", "ModelMetadata", "RepositoryModelLoad"]))
def test_fuzz_grpc_malformed_protobuf(target: Server, payload: bytes, method: str) -> None:
    with grpc.insecure_channel(target.grpc) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        try:
            call(payload, timeout=30)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
            assert code != grpc.StatusCode.UNKNOWN, (code, details)
            if method == "ModelInfer" and code == grpc.StatusCode.INTERNAL:
                # Only bytes that are no ModelInferRequest, answered in grpc's C++ words (Triton's).
                assert details == "Unable to parse request", details


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compression_bomb_is_limited_after_decompression(http: httpx.Client, encoding: str) -> None:
    inflated = b"[" + b" " * (4 * MAX_INPUT) + b"]"
    body = gzip.compress(inflated) if encoding == "gzip" else zlib.compress(inflated)
    assert len(body) < MAX_INPUT // 10
    response = http.post("/v2/models/simple/infer", content=body, headers={"Content-Encoding": encoding})
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"Decompressed data size exceeds the maximum allowed value of {MAX_INPUT} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def test_load_requests_cannot_escape_the_repository(http: httpx.Client) -> None:
    config = json.dumps({"backend": "onnxruntime", "max_batch_size": 0})
    escape = base64.b64encode(b"owned").decode()
    for name in ("..", "../simple", "a%2F..%2F.."):
        response = http.post(f"/v2/repository/models/{name}/load", content=json.dumps({}))
        _clear(response)
        assert response.status_code != 200
    for path in ("file:1/../../escaped", "file:../escaped", "file:1/../../../../tmp/escaped"):
        document = {"parameters": {"config": config, path: escape}}
        response = http.post("/v2/repository/models/uploaded/load", content=json.dumps(document))
        _clear(response)
        assert "must stay within model directory" in response.json()["error"], response.text
    # A path from the root is joined under the model's folder, as Triton joins it.
    document = {"parameters": {"config": config, "file:/tmp/escaped": escape}}
    _clear(http.post("/v2/repository/models/uploaded/load", content=json.dumps(document)))
    assert not Path("/tmp/escaped").exists()


def test_server_survives_and_stays_bounded(target: Server, http: httpx.Client) -> None:
    # Runs last in this module: after every case above, the server still serves correctly.
    before = _rss_kib(target.process.pid)
    for _ in range(50):
        _clear(http.post("/v2/models/simple/infer", content=b"{" * 10_000))
    assert target.alive()
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(target.grpc) as client:
        check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)
    assert _rss_kib(target.process.pid) - before < 100 * 1024
