"""Triton's gRPC transport flags reach the server: a connection past
--grpc-max-connection-age (and its grace) is closed, its stream ended with UNAVAILABLE;
--grpc-infer-response-compression-level compresses infer answers (gzip), which arrive
intact."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.simple_requests import check_simple, grpc_inputs, simple_arrays
from tests.harness import Server, loopback_bytes, turnout_up, write_repository


@pytest.fixture(scope="module")
def aging_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_transport"), ("simple",))
    flags = (
        "--grpc-max-connection-age=1000",
        "--grpc-max-connection-age-grace=500",
        "--grpc-keepalive-time=60000",
        "--grpc-keepalive-permit-without-calls=true",
    )
    with turnout_up(repo, *flags) as up:
        yield up


@pytest.fixture(scope="module")
def compressing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_compression"), ("identity_fp32",))
    with turnout_up(repo, "--grpc-infer-response-compression-level=high") as up:
        yield up


def test_a_connection_past_its_age_is_closed(aging_server: Server) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    a, b = simple_arrays(seed=3)
    with grpcclient.InferenceServerClient(aging_server.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("simple", grpc_inputs(a, b))
            result, error = answers.get(timeout=30)
            assert error is None
            check_simple(result, a, b)
            time.sleep(3)  # past the age and its grace: the server has closed the connection
            _, error = answers.get(timeout=30)
            assert "max connection age" in error.message()
        finally:
            client.stop_stream()
        # A new call reconnects and is served.
        check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)


def test_compressed_infer_answers_arrive_intact(compressing_server: Server) -> None:
    data = np.random.default_rng(5).standard_normal((1, 1 << 18)).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(compressing_server.grpc) as client:
        np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("identity_fp32", [tensor])
            result, error = answers.get(timeout=30)
        finally:
            client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


@pytest.mark.skipif(not Path("/proc/net/dev").exists(), reason="counts loopback bytes through /proc")
def test_infer_answers_are_compressed(compressing_server: Server) -> None:
    # 4 MiB of zeros each way: uncompressed, about 8.4 MB cross the loopback interface (the
    # lane to the sidecar is a Unix socket); compressed, the answer takes a few KiB.
    zeros = np.zeros((1, 1 << 20), np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(zeros.shape), "FP32")
    tensor.set_data_from_numpy(zeros)
    with grpcclient.InferenceServerClient(compressing_server.grpc) as client:
        client.infer("identity_fp32", [tensor])  # connected and warm
        before = loopback_bytes()
        result = client.infer("identity_fp32", [tensor])
        crossed = loopback_bytes() - before
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), zeros)
    assert crossed < zeros.nbytes * 1.5, crossed
