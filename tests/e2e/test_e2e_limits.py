"""Bounded input: --http-max-input-size (Triton's default, 64 MiB) on every HTTP endpoint,
enforced while the body is read and again while it inflates, with Triton's status and
texts; multi-GB bodies and a gzip bomb leave the gateway's memory flat while another
client is served; the gRPC front takes what Triton takes (INT32_MAX bytes).

The gateway runs in the `turnout up` process itself (its sidecars are its children), so
`server.process.pid` is the process whose memory is watched.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http.aio as httpaio

from gateway import http2
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pbg
from tests.e2e.simple_requests import assert_grpc_serves, assert_http_serves, check_simple, http_inputs, simple_arrays
from tests.harness import Server, flood, turnout_up, write_repository

MIB = 1 << 20
LIMIT = 64 * MIB  # Triton's default --http-max-input-size, which turnout's default matches
HINT = "Use --http-max-input-size to increase the limit."
# Memory a refused body may cost the gateway: at most one limit's worth of it is ever
# held (a chunked body, or an inflating one, is counted as it comes), plus as much again.
RSS_BOUND = 2 * LIMIT
HUGE = 3 * 1024 * MIB  # the multi-GB bodies, streamed from a generator 1 MiB at a time
SIMPLE_DOCUMENT = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_limits"), ("simple", "identity_fp32"))
    # Client shared memory allowed: a refusal of its endpoints comes before their bodies are read.
    flags = ("--model-control-mode=explicit", "--load-model=simple", "--load-model=identity_fp32")
    with turnout_up(repo, *flags, "--allow-client-shm=true") as up:
        yield up


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[Server]:
    """A server no earlier request has grown: its idle memory is its own, not a heap kept
    from a body at the limit that a refused body could then reuse unseen."""
    with turnout_up(write_repository(tmp_path / "repo", ("simple",))) as up:
        yield up


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.http}", timeout=60) as client:
        yield client


def json_too_large(size: int) -> str:
    return f"request JSON size of {size} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {HINT}"


DECOMPRESSED_TOO_LARGE = f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {HINT}"


def padded(document: object, size: int) -> bytes:
    """`document` as JSON of exactly `size` bytes (spaces before the closing brace)."""
    text = json.dumps(document).encode()
    return text[:-1] + b" " * (size - len(text)) + text[-1:]


def zeros(total: int) -> Iterator[bytes]:
    """`total` zero bytes, 1 MiB at a time: the test never holds more than one chunk."""
    chunk = bytes(MIB)
    for _ in range(total // MIB):
        yield chunk
    yield bytes(total % MIB)


def gzip_bomb(inflated: int) -> bytes:
    """A valid gzip body of a few MiB that inflates to `inflated` zero bytes (a multiple
    of 1 MiB): one fully flushed deflate block of 1 MiB of zeros, repeated."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = deflate.compress(bytes(MIB)) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated // MIB):
        crc = zlib.crc32(bytes(MIB), crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + block * (inflated // MIB) + deflate.flush() + struct.pack("<II", crc, inflated & 0xFFFFFFFF)


def error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]


# --- every endpoint group, a body one byte over the limit ---

ENDPOINTS = {
    "infer": "/v2/models/simple/infer",
    "repository index": "/v2/repository/index",
    "load": "/v2/repository/models/simple/load",
    "unload": "/v2/repository/models/simple/unload",
    "system shared memory": "/v2/systemsharedmemory/region/r/register",
    "cuda shared memory": "/v2/cudasharedmemory/region/r/register",
    "trace": "/v2/trace/setting",
    "model trace": "/v2/models/simple/trace/setting",
    "logging": "/v2/logging",
}


@pytest.mark.parametrize("path", ENDPOINTS.values(), ids=ENDPOINTS.keys())
def test_a_body_over_the_limit_gets_tritons_answer_on_every_endpoint(
    server: Server, http: httpx.Client, path: str
) -> None:
    response = http.post(path, content=zeros(LIMIT + 1), headers={"Content-Length": str(LIMIT + 1)})
    assert error(response) == (400, json_too_large(LIMIT + 1))
    assert_http_serves(server.http)


def test_the_file_contents_of_a_load_count_toward_the_limit(http: httpx.Client) -> None:
    head = b'{"parameters":{"config":"{}","file:1/model.onnx":"'
    tail = b'"}}'
    size = LIMIT + MIB

    def body() -> Iterator[bytes]:
        yield head
        chunk = b"A" * MIB
        for _ in range((size - len(head) - len(tail)) // MIB):
            yield chunk
        yield b"A" * ((size - len(head) - len(tail)) % MIB)
        yield tail

    # Chunked: counted as it streams, refused where it crossed the limit.
    response = http.post("/v2/repository/models/simple/load", content=body())
    status, text = error(response)
    assert status == 400
    crossed = int(text.removeprefix("request JSON size of ").split()[0])
    assert LIMIT < crossed <= LIMIT + MIB  # a chunk past the limit, no further
    assert text == json_too_large(crossed)


def test_a_content_length_over_the_limit_is_answered_before_any_body_is_sent(server: Server) -> None:
    host, port = server.http.rsplit(":", 1)
    declared = 10 * 1024 * MIB
    for expect in (b"", b"Expect: 100-continue\r\n"):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /v2/repository/models/simple/load HTTP/1.1\r\nHost: x\r\n"
                + expect
                + f"Content-Length: {declared}\r\n\r\n".encode()
            )
            answer = _read_response(sock)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ")
        assert json.loads(body) == {"error": json_too_large(declared)}
        # A client waiting for 100 Continue will not send the body: that connection closes.
        assert (b"connection: close" in head.lower()) == bool(expect)


def _read_response(sock: socket.socket) -> bytes:
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head = answer.split(b"\r\n\r\n", 1)[0].decode().lower()
    length = int(head.split("content-length: ", 1)[1].split("\r\n", 1)[0])
    while len(answer.split(b"\r\n\r\n", 1)[1]) < length:
        answer += sock.recv(65536)
    return answer


# --- infer: the text names what the body holds ---


def test_infer_texts_by_body_kind(http: httpx.Client) -> None:
    path = "/v2/models/simple/infer"
    size = LIMIT + 1
    declared = {"Content-Length": str(size)}
    # Raw binary (Inference-Header-Content-Length: 0): the body is the input.
    response = http.post(path, content=zeros(size), headers={**declared, "Inference-Header-Content-Length": "0"})
    assert error(response) == (
        400,
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {LIMIT} bytes. {HINT}",
    )
    # A JSON header over the limit by itself: its own length is the size.
    header = {**declared, "Inference-Header-Content-Length": str(LIMIT + 1)}
    assert error(http.post(path, content=zeros(size), headers=header)) == (400, json_too_large(LIMIT + 1))
    # A small JSON header with binary tensors after it. Triton takes any size of those (it
    # buffers the body whole); turnout holds the whole body to the limit.
    header = {**declared, "Inference-Header-Content-Length": "100"}
    assert error(http.post(path, content=zeros(size), headers=header)) == (
        400,
        f"request size of {size} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {HINT}",
    )
    # A header outside the body is Triton's range error, checked first as Triton does.
    header = {**declared, "Inference-Header-Content-Length": str(size + 1)}
    assert error(http.post(path, content=zeros(size), headers=header)) == (
        400,
        f"inference header size should be in range (0, {size}), got: {size + 1}",
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_limited_after_decompression(http: httpx.Client, encoding: str) -> None:
    inflated = padded(SIMPLE_DOCUMENT, LIMIT + 1)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    compressor = zlib.compressobj(1, zlib.DEFLATED, wbits)
    body = compressor.compress(inflated) + compressor.flush()
    assert len(body) < LIMIT // 100
    response = http.post("/v2/models/simple/infer", content=body, headers={"Content-Encoding": encoding})
    assert error(response) == (400, DECOMPRESSED_TOO_LARGE)


def test_a_compressed_body_is_limited_before_decompression(http: httpx.Client) -> None:
    # Whatever it would inflate to, a compressed body over the limit is not read on.
    headers = {"Content-Encoding": "gzip", "Content-Length": str(LIMIT + 1)}
    response = http.post("/v2/models/simple/infer", content=zeros(LIMIT + 1), headers=headers)
    assert error(response) == (400, DECOMPRESSED_TOO_LARGE)


# --- at the limit, everything still works ---


def test_bodies_at_the_limit_are_served(http: httpx.Client) -> None:
    # OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, INPUT1 all ones.
    at_limit = padded(SIMPLE_DOCUMENT, LIMIT)
    response = http.post("/v2/models/simple/infer", content=at_limit)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]
    # Compressed, inflating to exactly the limit.
    response = http.post(
        "/v2/models/simple/infer", content=zlib.compress(at_limit, 1), headers={"Content-Encoding": "deflate"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][1]["data"] == [i - 1 for i in range(16)]
    # A load body at the limit (a reload of `simple`), chunked.
    body = padded({"parameters": {}}, LIMIT)
    response = http.post("/v2/repository/models/simple/load", content=iter([body[: LIMIT // 2], body[LIMIT // 2 :]]))
    assert response.status_code == 200, response.text


# --- memory: multi-GB bodies, while another client is served ---


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


class _OtherClient:
    """Keeps sending good `simple` inferences over its own connection, checking each. The
    thread runs tritonclient's asyncio client: the gevent one keeps a hub per thread that
    outlives the thread."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.served = 0
        self.failures: list[BaseException] = []
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        a, b = simple_arrays(seed=5)
        async with httpaio.InferenceServerClient(self._url) as client:
            while not self._stop.is_set():
                try:
                    check_simple(await client.infer("simple", http_inputs(a, b, module=httpaio)), a, b)
                except Exception as exc:  # reported by the test
                    self.failures.append(exc)
                    return
                self.served += 1

    def __enter__(self) -> _OtherClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _peak_above_idle(server: Server, send: Callable[[], None]) -> tuple[int, int, float, _OtherClient]:
    """Run `send()` while another client is served; return (idle KiB, peak KiB above idle,
    seconds, the other client). The peak is the kernel's high-water mark, reset first."""
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    idle = _status_kib(pid, "VmRSS")
    started = time.monotonic()
    with _OtherClient(server.http) as other:
        send()
    elapsed = time.monotonic() - started
    return idle, _status_kib(pid, "VmHWM") - idle, elapsed, other


def _report(what: str, idle: int, peak: int, elapsed: float, other: _OtherClient) -> None:
    # Shown with `pytest -s`: the figures the README's reliability section quotes.
    print(
        f"\n{what}: gateway idle {idle >> 10} MiB, peak +{peak >> 10} MiB, {elapsed:.1f} s, "
        f"other client served {other.served}"
    )


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_multi_gb_body_leaves_the_gateway_memory_flat(fresh_server: Server, framing: str) -> None:
    server = fresh_server
    answers: list[httpx.Response] = []
    headers = {"Content-Length": str(HUGE)} if framing == "content-length" else {}

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            answers.append(
                client.post(f"http://{server.http}/v2/models/simple/infer", content=zeros(HUGE), headers=headers)
            )

    idle, peak, elapsed, other = _peak_above_idle(server, send)
    status, text = error(answers[0])
    assert status == 400
    if framing == "content-length":
        assert text == json_too_large(HUGE)
    else:
        assert text.startswith("request JSON size of ") and text.endswith(
            f"maximum allowed input size of {LIMIT} bytes. {HINT}"
        )
    _report(f"{framing} {HUGE >> 20} MiB body", idle, peak, elapsed, other)
    assert peak * 1024 < RSS_BOUND
    assert not other.failures, other.failures
    assert other.served >= 5


def test_a_gzip_bomb_inflating_to_gigabytes_leaves_the_gateway_memory_flat(fresh_server: Server) -> None:
    server = fresh_server
    body = gzip_bomb(4 * 1024 * MIB)
    assert len(body) < 8 * MIB
    answers: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(5):  # several, so a leak would add up
                answers.append(
                    client.post(
                        f"http://{server.http}/v2/models/simple/infer",
                        content=body,
                        headers={"Content-Encoding": "gzip"},
                    )
                )

    idle, peak, elapsed, other = _peak_above_idle(server, send)
    assert [error(answer) for answer in answers] == [(400, DECOMPRESSED_TOO_LARGE)] * 5
    _report(f"gzip bomb {len(body) >> 20} MiB -> 4096 MiB, x5", idle, peak, elapsed, other)
    assert peak * 1024 < RSS_BOUND
    assert not other.failures, other.failures


# --- clients that send and never read ---

FLOOD_LIMIT = 128 * MIB
PIPELINED = b"GET /v2/health/ready HTTP/1.1\r\nHost: turnout\r\n\r\n" * 1024
SETTINGS = http2.frame(http2.SETTINGS, 0, 0) * 1024


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_that_never_reads_its_answers_is_held_back(fresh_server: Server, protocol: str) -> None:
    # Pipelined requests over HTTP, SETTINGS over gRPC: each asks for an answer, and a client
    # that reads none is read no further once its answers fill the sockets. Unbounded, the
    # gateway would parse requests and hold their answers as fast as the client sends.
    server = fresh_server
    if protocol == "http":
        address, opening, unit = server.http, b"", PIPELINED
    else:
        address, opening, unit = server.grpc, http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0), SETTINGS
    outcome: list[tuple[int, bool]] = []

    def send() -> None:
        outcome.append(flood(address, opening, unit, FLOOD_LIMIT, 2.0))

    idle, peak, elapsed, other = _peak_above_idle(server, send)
    ((sent, stalled),) = outcome
    _report(f"{protocol}: a client that never reads, {sent >> 10} KiB sent", idle, peak, elapsed, other)
    assert stalled, f"{sent} bytes taken from a client that reads nothing"
    assert sent < 32 * MIB
    assert peak * 1024 < LIMIT
    assert not other.failures, other.failures
    assert other.served >= 5
    assert_grpc_serves(server.grpc)


# --- heads, and gRPC ---


def test_a_request_head_over_1_mib_is_refused(server: Server, http: httpx.Client) -> None:
    assert http.get("/v2/health/live", headers={"X-Big": "a" * (512 * 1024)}).status_code == 200
    with httpx.Client(base_url=f"http://{server.http}") as client:
        response = client.get("/v2/health/live", headers={"X-Big": "a" * (2 * MIB)})
    assert response.status_code == 431
    assert response.json() == {"error": "Request Header Fields Too Large"}
    assert_http_serves(server.http)


def test_grpc_takes_messages_past_grpcs_default_4_mib(server: Server) -> None:
    # Triton sets INT32_MAX both ways (grpc_server.cc: SetMaxMessageSize(MAX_GRPC_MESSAGE_SIZE));
    # grpcio's default would refuse this 16 MiB request with RESOURCE_EXHAUSTED.
    data = np.arange(4 * MIB, dtype=np.float32).reshape(1, -1)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("identity_fp32", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


STREAM_WINDOW = 8


@pytest.fixture(scope="module")
def windowed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_window"), ("identity_fp32",))
    with turnout_up(repo, f"--grpc-stream-max-inflight={STREAM_WINDOW}") as up:
        yield up


def _inference_count(server: Server) -> int:
    stats = httpx.get(f"http://{server.http}/v2/models/identity_fp32/stats", timeout=30).json()
    count: int = stats["model_stats"][0]["inference_count"]
    return count


def test_a_stream_whose_answers_go_unread_is_held_back(windowed_server: Server) -> None:
    # A client that sends on a stream and never reads: the gateway reads no more than its
    # window of requests ahead of the answers that left, so gRPC's flow control holds the
    # client back, instead of the gateway queueing answers without end. Once the client
    # reads, every request is answered.
    total, rows = 400, 1 << 16  # 256 KiB answers: the connection's windows hold only a few
    sent = 0
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, rows])
    request.raw_input_contents.append(np.ones(rows, np.float32).tobytes())

    def requests() -> Iterator[pb.ModelInferRequest]:
        nonlocal sent
        for n in range(total):
            request.id = str(n)
            sent += 1
            yield request

    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    before = _inference_count(windowed_server)
    with grpc.insecure_channel(windowed_server.grpc, options=options) as channel:
        answers = pbg.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        time.sleep(3)  # unbounded, all 400 would be answered (and held) well within this
        held = _inference_count(windowed_server) - before
        assert held < total // 4, (held, sent)
        time.sleep(1)
        assert _inference_count(windowed_server) - before == held  # held back, not slow
        ids = [answer.infer_response.id for answer in itertools.islice(answers, total)]
    assert sorted(ids, key=int) == [str(n) for n in range(total)]
    assert _inference_count(windowed_server) - before == total
