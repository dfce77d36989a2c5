"""Restricted APIs, as Triton's --http-restricted-api and --grpc-restricted-protocol:
a restricted group needs its header (HTTP, else 403) or metadata (gRPC, else
UNAVAILABLE), with Triton's texts; unrestricted groups stay open."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway.restrictions import GROUPS, RestrictionError, parse_restrictions
from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import ROOT, Server, turnout_up, write_repository

# Copied at each use: tritonclient adds its own headers to the dict it is given.
ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "infer-value"}
HTTP_REFUSED = "This API is restricted, expecting header '{}'"
GRPC_REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-{}'"


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_restricted"), ("simple",))
    with turnout_up(
        repo,
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--http-restricted-api=model-repository,shared-memory,statistics,trace,logging:admin-key=admin-value",
        "--http-restricted-api=inference:infer-key=infer-value",
        "--grpc-restricted-protocol=model-repository,shared-memory,statistics,trace,logging:admin-key=admin-value",
        "--grpc-restricted-protocol=inference:infer-key=infer-value",
    ) as running:
        yield running


def _http_refused(call: object, key: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    assert caught.value.status() == "403"
    assert caught.value.message() == HTTP_REFUSED.format(key)


def _grpc_refused(call: object, key: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert caught.value.message() == GRPC_REFUSED.format(key)


def test_http_restricted_groups_need_their_header(restricted: Server) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(restricted.http) as client:
        _http_refused(lambda: client.get_model_repository_index(), "admin-key")
        _http_refused(lambda: client.unload_model("simple"), "admin-key")
        _http_refused(lambda: client.get_inference_statistics(), "admin-key")
        _http_refused(lambda: client.get_inference_statistics("simple"), "admin-key")
        _http_refused(lambda: client.get_system_shared_memory_status(), "admin-key")
        _http_refused(lambda: client.get_trace_settings(), "admin-key")
        _http_refused(lambda: client.get_log_settings(), "admin-key")
        _http_refused(lambda: client.infer("simple", http_inputs(a, b)), "infer-key")
        # The wrong value is refused as a missing one is; one group's key opens no other.
        _http_refused(lambda: client.get_model_repository_index(headers={"admin-key": "nope"}), "admin-key")
        _http_refused(lambda: client.infer("simple", http_inputs(a, b), headers=dict(ADMIN)), "infer-key")

        # Unrestricted groups stay open.
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("simple")
        assert client.get_server_metadata()["name"] == "triton"
        assert client.get_model_metadata("simple")["name"] == "simple"
        assert client.get_model_config("simple")["name"] == "simple"

        # With the header, each answers.
        assert [m["name"] for m in client.get_model_repository_index(headers=dict(ADMIN))] == ["simple"]
        assert client.get_inference_statistics(headers=dict(ADMIN))["model_stats"]
        assert client.get_log_settings(headers=dict(ADMIN))["log_info"] is True
        check_simple(client.infer("simple", http_inputs(a, b), headers=dict(INFER)), a, b)


def test_http_restricted_is_checked_before_the_method(restricted: Server) -> None:
    # As Triton: the restriction answers first, whatever the method or body.
    response = httpx.delete(f"http://{restricted.http}/v2/repository/index")
    assert response.status_code == 403
    assert response.json() == {"error": HTTP_REFUSED.format("admin-key")}
    assert response.headers["content-type"] == "text/plain"  # refused before Triton's handler types it
    assert httpx.get(f"http://{restricted.http}/v2/logging", headers=dict(ADMIN)).status_code == 200


def test_grpc_restricted_groups_need_their_metadata(restricted: Server) -> None:
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(restricted.grpc) as client:
        _grpc_refused(lambda: client.get_model_repository_index(), "admin-key")
        _grpc_refused(lambda: client.load_model("simple"), "admin-key")
        _grpc_refused(lambda: client.get_inference_statistics(), "admin-key")
        _grpc_refused(lambda: client.get_cuda_shared_memory_status(), "admin-key")
        _grpc_refused(lambda: client.get_trace_settings(), "admin-key")
        _grpc_refused(lambda: client.get_log_settings(), "admin-key")
        _grpc_refused(lambda: client.infer("simple", grpc_inputs(a, b)), "infer-key")
        _grpc_refused(lambda: client.infer("simple", grpc_inputs(a, b), headers=dict(GRPC_ADMIN)), "infer-key")

        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("simple")
        assert client.get_server_metadata().name == "triton"
        assert client.get_model_config("simple").config.name == "simple"

        assert [m.name for m in client.get_model_repository_index(headers=dict(GRPC_ADMIN)).models] == ["simple"]
        check_simple(client.infer("simple", grpc_inputs(a, b), headers=dict(GRPC_INFER)), a, b)


def test_grpc_restricted_stream(restricted: Server) -> None:
    # ModelStreamInfer is inference too: refused at the start of the stream.
    channel = grpc.insecure_channel(restricted.grpc)
    try:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as caught:
            list(stream(iter([b""]), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == GRPC_REFUSED.format("infer-key")
    finally:
        channel.close()


@pytest.fixture(scope="module")
def health_restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_health_restricted"), ("simple",))
    with turnout_up(repo, "--grpc-restricted-protocol=health:health-key=health-value") as running:
        yield running


def test_grpc_standard_health_follows_the_health_group(health_restricted: Server) -> None:
    # As Triton: grpc.health.v1 Check is in the `health` group, refused like ServerLive.
    refused = GRPC_REFUSED.format("health-key")
    allowed = (("triton-grpc-protocol-health-key", "health-value"),)
    with grpc.insecure_channel(health_restricted.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for call in (
            lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10),
            lambda: next(health.Watch(health_pb2.HealthCheckRequest(), timeout=10)),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert caught.value.details() == refused
        answer = health.Check(health_pb2.HealthCheckRequest(), metadata=allowed, timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        watched = health.Watch(health_pb2.HealthCheckRequest(), metadata=allowed, timeout=10)
        assert next(watched).status == health_pb2.HealthCheckResponse.SERVING
        watched.cancel()
    with grpcclient.InferenceServerClient(health_restricted.grpc) as client:
        _grpc_refused(lambda: client.is_server_live(), "health-key")
        assert client.is_server_ready(headers={"triton-grpc-protocol-health-key": "health-value"})
        assert client.get_server_metadata().name == "triton"  # other groups stay open


def test_restriction_specs() -> None:
    parsed = parse_restrictions(["health,metadata:Key=v"])
    assert parsed["health"].key == "key" and parsed["metadata"].value == "v"
    assert parse_restrictions(["trace:k=v"], grpc=True)["trace"].key == "triton-grpc-protocol-k"
    assert set(parse_restrictions([",".join(GROUPS) + ":k=v"])) == set(GROUPS)
    for bad in (["inference"], ["inference:k"], ["bogus:k=v"], ["inference:k=v", "inference:j=w"], [":k=v"]):
        with pytest.raises(RestrictionError):
            parse_restrictions(bad)


def test_cli_refuses_a_bad_spec() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "turnout", "gateway", "--sidecar=onnxruntime=127.0.0.1:1", "--http-restricted-api=x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--http-restricted-api" in result.stderr
