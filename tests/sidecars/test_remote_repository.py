"""Sidecars reading model repositories in S3 (a real moto server process) and GCS (a real
GCS emulator process): serving, poll mode, explicit loads, the local copies they load from,
and the errors of a missing bucket, missing credentials and a missing extra."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.harness import make_models
from tests.object_store import (
    AWS_VARIABLES,
    GCS_VARIABLES,
    ObjectStore,
    gcs_emulator,
    linear_answer,
    moto_server,
    wait_for_poll,
)
from tests.sidecars.sidecar_harness import SidecarFailedToStart, launch, running, simple_inputs


@pytest.fixture(scope="module")
def store() -> Iterator[ObjectStore]:
    with moto_server() as running_store:
        running_store.create_bucket("models")
        yield running_store


@pytest.fixture
def aws(store: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The sidecars' environment: the store's credentials and endpoint, and a temporary
    folder of their own (returned) where their local copies can be watched."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    copies = tmp_path / "tmp"
    copies.mkdir()
    monkeypatch.setenv("TMPDIR", str(copies))
    return copies


def _upload_models(store: ObjectStore, tmp_path: Path, prefix: str, linear_versions: dict[int, float]) -> Path:
    local = tmp_path / prefix
    models = make_models()
    models.write_simple(local)
    models.write_linear(local, versions=linear_versions)
    store.upload(local, f"models/{prefix}")
    return local


def test_serves_and_polls_an_s3_repository(store: ObjectStore, aws: Path, tmp_path: Path) -> None:
    local = _upload_models(store, tmp_path, "polled", {1: 1.0})
    flags = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
    with running("s3://models/polled", *flags) as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        inputs, data = simple_inputs(grpcclient)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), data + 1)
        assert linear_answer(client, "1") == 1.0
        # The runtimes read local copies, in the sidecar's temporary folder.
        assert sorted(p.name for p in aws.glob("turnout-remote-*/*")) == ["linear", "simple"]

        # A new version appears...
        make_models().write_linear(tmp_path / "v2", versions={2: 2.0})
        store.upload(tmp_path / "v2" / "linear" / "2", "models/polled/linear/2")
        wait_for_poll(lambda: client.is_model_ready("linear", "2"), sidecar.output)
        assert linear_answer(client, "2") == 2.0
        assert client.is_model_ready("linear", "1")

        # ...a removed one goes...
        store.remove("models/polled/linear/1")
        wait_for_poll(lambda: not client.is_model_ready("linear", "1"), sidecar.output)
        assert linear_answer(client, "") == 2.0

        # ...and a changed config is read again.
        config = (local / "simple" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 4")
        store.filesystem().pipe_file("models/polled/simple/config.pbtxt", config.encode())
        wait_for_poll(lambda: client.get_model_config("simple").config.max_batch_size == 4, sidecar.output)

        # A model folder removed from the bucket is unloaded.
        store.remove("models/polled/simple")
        wait_for_poll(lambda: not client.is_model_ready("simple"), sidecar.output)
        # Its copy goes once its requests drained: only the copy of what is loaded stays on disk.
        wait_for_poll(lambda: sorted(p.name for p in aws.glob("turnout-remote-*/*")) == ["linear"], sidecar.output)
    assert list(aws.glob("turnout-remote-*")) == []  # the sidecar cleaned up as it stopped


def test_explicit_load_with_the_endpoint_in_the_url(
    store: ObjectStore, aws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upload_models(store, tmp_path, "explicit", {1: 1.0, 2: 2.0})
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    url = f"s3://{store.host_port}/models/explicit"  # Triton's form: s3://host:port/bucket/path
    with running(url, "--model-control-mode=explicit") as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index == {"linear": "", "simple": ""}
        assert list(aws.glob("turnout-remote-*")) == []  # nothing is copied before a load
        client.load_model("linear")
        assert (linear_answer(client, "1"), linear_answer(client, "2")) == (1.0, 2.0)
        # Loaded again unchanged, both versions keep serving from the first copy (with
        # their statistics); the second copy is not kept.
        client.load_model("linear")
        assert len(list(aws.glob("turnout-remote-*"))) == 1
        assert (linear_answer(client, "1"), linear_answer(client, "2")) == (1.0, 2.0)
        stats = client.get_inference_statistics("linear", as_json=True)["model_stats"]
        assert {s["version"]: s["inference_count"] for s in stats} == {"1": "2", "2": "2"}
        client.unload_model("linear")
        assert not client.is_model_ready("linear")
        assert list(aws.glob("turnout-remote-*")) == []
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("missing")
        assert caught.value.message() == "failed to load 'missing', failed to poll from model repository"


def test_missing_bucket(store: ObjectStore, aws: Path, tmp_path: Path) -> None:
    expected = "failed to poll model repository 's3://no-such-bucket/models': Could not get MetaData for bucket"
    with pytest.raises(SidecarFailedToStart) as caught:
        launch("s3://no-such-bucket/models")
    assert caught.value.returncode == 1
    assert expected in caught.value.output
    assert "NoSuchBucket" in caught.value.output

    # Without --exit-on-error, the other repository's models serve; a load names the reason.
    _upload_models(store, tmp_path, "beside", {1: 1.0})
    sidecar = launch(
        "s3://models/beside",
        "--model-repository=s3://no-such-bucket/models",
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--exit-on-error=false",
    )
    try:
        client = grpcclient.InferenceServerClient(sidecar.url)
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("absent")
        message = failed.value.message()
        assert message.startswith("failed to load 'absent', failed to poll from model repository: ")
        assert "'s3://no-such-bucket/models' for model 'absent': Could not get MetaData for bucket" in message
        client.load_model("linear")  # found in the repository that can be read
        assert linear_answer(client, "1") == 1.0
    finally:
        assert sidecar.stop() == 0, sidecar.output()


def test_missing_credentials(store: ObjectStore, aws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(SidecarFailedToStart) as caught:
        launch("s3://models/anything")
    assert caught.value.returncode == 1
    assert (
        "Unable to create S3 filesystem client. Check account credentials. "
        "Exception: 'NoCredentialsError' Message: 'Unable to locate credentials'"
    ) in caught.value.output


def test_missing_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An install without the extra: s3fs cannot be imported.
    shadow = tmp_path / "without_s3fs" / "s3fs"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named s3fs')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    with pytest.raises(SidecarFailedToStart) as caught:
        launch("s3://models/anything")
    assert caught.value.returncode == 2  # a usage error, before anything starts
    assert "s3:// file-system not supported. To enable, install turnout[s3]" in caught.value.output


def test_serves_and_polls_a_gcs_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gcs_emulator("models") as store:
        for name in GCS_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in store.environment().items():
            monkeypatch.setenv(name, value)
        local = tmp_path / "repo"
        make_models().write_linear(local, versions={1: 1.0})
        store.upload(local, "models/repo")
        flags = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
        with running("gs://models/repo", *flags) as sidecar:
            client = grpcclient.InferenceServerClient(sidecar.url)
            assert linear_answer(client, "1") == 1.0
            make_models().write_linear(tmp_path / "v2", versions={2: 2.0})
            store.upload(tmp_path / "v2" / "linear" / "2", "models/repo/linear/2")
            wait_for_poll(lambda: client.is_model_ready("linear", "2"), sidecar.output)
            assert linear_answer(client, "2") == 2.0

        with pytest.raises(SidecarFailedToStart) as caught:
            launch("gs://no-such-bucket/repo")
        assert caught.value.returncode == 1
        assert "Could not get MetaData for bucket with name no-such-bucket : bucket not found" in caught.value.output
