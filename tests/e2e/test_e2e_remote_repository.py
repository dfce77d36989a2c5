"""`turnout up` on model repositories in S3 (a real moto server process), alone and beside
local ones: serving through tritonclient, poll mode, explicit loads, a missing bucket,
and the start-up scan that picks the sidecars from listings and configs alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.simple_requests import assert_grpc_serves, assert_http_serves, error_of
from tests.harness import ServerFailedToStart, make_models, turnout_up, write_repository
from tests.object_store import AWS_VARIABLES, ObjectStore, linear_answer, moto_server, wait_for_poll


@pytest.fixture(scope="module")
def store() -> Iterator[ObjectStore]:
    with moto_server() as running_store:
        running_store.create_bucket("models")
        yield running_store


def test_up_serves_and_polls_s3(store: ObjectStore, tmp_path: Path) -> None:
    local = write_repository(tmp_path / "polled", ("simple",))
    make_models().write_linear(local, versions={1: 1.0})
    store.upload(local, "models/polled")
    flags = ("--model-control-mode=poll", "--repository-poll-secs=0.5")
    with turnout_up("s3://models/polled", *flags, env=store.environment()) as server:
        assert_http_serves(server.http)
        assert_grpc_serves(server.grpc)
        client = grpcclient.InferenceServerClient(server.grpc)
        assert linear_answer(client) == 1.0

        make_models().write_linear(tmp_path / "v2", versions={2: 2.0})
        store.upload(tmp_path / "v2" / "linear" / "2", "models/polled/linear/2")
        wait_for_poll(lambda: client.is_model_ready("linear", "2"), server.output)
        assert linear_answer(client, "2") == 2.0
        with httpclient.InferenceServerClient(server.http) as http:
            assert http.is_model_ready("linear", "2")
            assert http.get_model_metadata("linear")["versions"] == ["1", "2"]

        store.remove("models/polled/linear/1")
        wait_for_poll(lambda: not client.is_model_ready("linear", "1"), server.output)
        assert linear_answer(client) == 2.0
        assert_http_serves(server.http)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_up_explicit_load_from_s3_beside_a_local_repository(store: ObjectStore, tmp_path: Path, protocol: str) -> None:
    remote = write_repository(tmp_path / "remote", ("simple",))
    store.upload(remote, f"models/explicit-{protocol}")
    local = tmp_path / "local"
    make_models().write_linear(local)
    flags = (f"--model-repository={local}", "--model-control-mode=explicit", "--load-model=linear")
    with turnout_up(f"s3://models/explicit-{protocol}", *flags, env=store.environment()) as server:
        module = httpclient if protocol == "http" else grpcclient
        url = server.http if protocol == "http" else server.grpc
        with module.InferenceServerClient(url) as client:
            assert client.is_model_ready("simple") is False
            client.load_model("simple")
            assert client.is_model_ready("simple") is True
        (assert_http_serves if protocol == "http" else assert_grpc_serves)(url)
        assert linear_answer(grpcclient.InferenceServerClient(server.grpc), "2") == 2.0


def test_up_missing_bucket(store: ObjectStore, tmp_path: Path) -> None:
    reason = "Could not get MetaData for bucket with name no-such-bucket due to exception: NoSuchBucket"
    with (
        pytest.raises(ServerFailedToStart) as caught,
        turnout_up("s3://no-such-bucket/models", env=store.environment()),
    ):
        pass
    assert "failed to poll model repository 's3://no-such-bucket/models': " + reason in str(caught.value)

    # Without --exit-on-error the readable repository serves, and a load says what failed.
    good = write_repository(tmp_path / "good", ("simple",))
    store.upload(good, "models/good")
    flags = (
        "--model-repository=s3://no-such-bucket/models",
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--exit-on-error=false",
    )
    with turnout_up("s3://models/good", *flags, env=store.environment()) as server:
        assert_http_serves(server.http)
        with httpclient.InferenceServerClient(server.http) as client:
            error = error_of(client.load_model, "elsewhere")
        assert error.status() == "500"
        assert error.message().startswith("failed to load 'elsewhere', failed to poll from model repository: ")
        assert reason in error.message()
        assert_grpc_serves(server.grpc)


def test_scan_picks_frameworks_from_listing_and_configs(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnout.supervisor import frameworks_in, models_in

    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    repo = tmp_path / "mixed"
    (repo / "torch_model" / "1").mkdir(parents=True)
    (repo / "torch_model" / "config.pbtxt").write_text('platform: "pytorch_libtorch"\nmax_batch_size: 0\n')
    # Not a model at all: only the file name counts, the scan never reads it.
    (repo / "torch_model" / "1" / "model.pt").write_bytes(b"not read")
    (repo / "onnx_model" / "1").mkdir(parents=True)
    (repo / "onnx_model" / "1" / "model.onnx").write_bytes(b"not read either")
    (repo / "README").write_text("files at the root are no models\n")
    store.upload(repo, "models/mixed")
    assert frameworks_in(models_in(["s3://models/mixed"])) == ["onnxruntime", "pytorch"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert frameworks_in(models_in([f"s3://{store.host_port}/models/mixed"])) == ["onnxruntime", "pytorch"]
    assert frameworks_in(models_in([f"s3://{store.host_port}/models/empty"])) == ["onnxruntime"]  # the default sidecar


def test_up_takes_a_custom_config_from_s3(store: ObjectStore, tmp_path: Path) -> None:
    from tests.e2e.test_e2e_config_name import custom_config_repository

    store.upload(custom_config_repository(tmp_path / "custom"), "models/custom")
    flags = ("--model-config-name=small",)
    with (
        turnout_up("s3://models/custom", *flags, env=store.environment()) as server,
        httpclient.InferenceServerClient(server.http) as client,
    ):
        assert client.get_model_config("simple")["max_batch_size"] == 2
        assert client.get_model_config("simple_string")["max_batch_size"] == 8
        assert client.is_model_ready("custom_only")
