"""Deadlines travel gateway -> sidecar: a request whose gRPC deadline passed, or whose
client (gRPC or HTTP) went away, leaves its sidecar queue and never runs (the lane's CANCEL frame);
the `timeout` parameter keeps Triton's queue-policy semantics."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import Server, turnout_up, write_repository

HELD_SECS = 1.5  # simple_held's max_queue_delay


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_deadlines"), ("simple_held", "simple_timeout"))
    with turnout_up(repo) as running:
        yield running


def _counts(server: Server) -> tuple[int, int]:
    """simple_held's (executions, successful inferences) so far."""
    with httpclient.InferenceServerClient(server.http) as client:
        stats = client.get_inference_statistics("simple_held")["model_stats"][0]
    return stats["execution_count"], stats["inference_stats"]["success"]["count"]


def test_expired_grpc_deadline_is_never_executed(held: Server) -> None:
    a, b = simple_arrays()
    before = _counts(held)
    with grpcclient.InferenceServerClient(held.grpc) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple_held", grpc_inputs(a, b), client_timeout=0.3)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # Past the queue delay the request would have run, had it stayed queued.
        time.sleep(HELD_SECS + 0.7)
        assert _counts(held) == before
        # The model itself still answers a request that waits long enough.
        check_simple(client.infer("simple_held", grpc_inputs(a, b), client_timeout=30), a, b)
    executions, successes = _counts(held)
    assert (executions, successes) == (before[0] + 1, before[1] + 1)


def test_cancelled_call_is_dropped_from_the_queue(held: Server) -> None:
    a, b = simple_arrays()
    before = _counts(held)

    async def cancel_one() -> None:
        async with grpcaio.InferenceServerClient(held.grpc) as client:
            call = asyncio.ensure_future(client.infer("simple_held", grpc_inputs(a, b, module=grpcaio)))
            await asyncio.sleep(0.3)
            call.cancel()  # the client goes away while its request is queued
            with pytest.raises(asyncio.CancelledError):
                await call

    asyncio.run(cancel_one())
    time.sleep(HELD_SECS + 0.7)
    assert _counts(held) == before


def _canceled(server: Server) -> float:
    """simple_held's nv_inference_request_failure{reason="CANCELED"} on the gateway's /metrics."""
    text = httpx.get(f"http://{server.metrics}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "nv_inference_request_failure" and sample.labels == {
                "model": "simple_held",
                "version": "1",
                "reason": "CANCELED",
            }:
                return sample.value
    return 0.0


def test_http_client_that_leaves_is_never_executed(held: Server) -> None:
    a, b = simple_arrays()
    before, canceled = _counts(held), _canceled(held)
    inputs = [
        {"name": name, "shape": list(x.shape), "datatype": "INT32", "data": x.flatten().tolist()}
        for name, x in (("INPUT0", a), ("INPUT1", b))
    ]
    body = json.dumps({"inputs": inputs}).encode()
    head = (
        "POST /v2/models/simple_held/infer HTTP/1.1\r\nHost: turnout\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    host, _, port = held.http.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(head.encode() + body)
        time.sleep(0.3)  # the request waits in simple_held's queue; its client hangs up
    time.sleep(HELD_SECS + 0.7)
    assert _counts(held) == before
    assert _canceled(held) == canceled + 1
    # The server keeps serving, and the model answers a client that waits.
    with httpclient.InferenceServerClient(held.http, network_timeout=30) as waiting:
        check_simple(waiting.infer("simple_held", http_inputs(a, b)), a, b)
    assert _counts(held) == (before[0] + 1, before[1] + 1)


def test_timeout_parameter_follows_the_queue_policy(held: Server) -> None:
    # simple_timeout: REJECT after 0.1 s in the queue, which holds requests 3 s.
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(held.http) as client:
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple_timeout", http_inputs(a, b), timeout=10_000_000)
        assert caught.value.status() == "503"
        assert caught.value.message() == "Request timeout expired"
        # allow_timeout_override is off: the request's longer timeout does not win.
        assert time.monotonic() - started < 2.0
