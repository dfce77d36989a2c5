"""Mixed repositories under `turnout up`: one sidecar per framework, the same answers
from an ONNX and a TorchScript export of one model through the same client code, a
framework that cannot run here listed as UNAVAILABLE with its reason, --exit-on-error,
and a SIGKILLed sidecar that takes only its own models down."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import Server, ServerFailedToStart, make_models, turnout_up

pytest.importorskip("torch", reason="the PyTorch sidecar needs torch (pip install -c constraints.txt -e '.[pytorch]')")

SIZES = (32, 64, 8)
PAIRS = [("simple", "simple_torch"), ("mlp", "mlp_torch")]


def write_mixed(repo: Path, with_plan: bool = True) -> Path:
    models = make_models()
    models.write_simple(repo)
    models.write_torch_simple(repo, name="simple_torch", naming="forward")
    models.write_mlp(repo, sizes=SIZES, max_batch_size=8)
    models.write_torch_mlp(repo, sizes=SIZES, max_batch_size=8)
    if with_plan:
        write_plan(repo)
    return repo


def write_plan(repo: Path) -> None:
    """A TensorRT model; its engine never gets read on a machine that cannot run it."""
    (repo / "plan_model" / "1").mkdir(parents=True)
    (repo / "plan_model" / "1" / "model.plan").write_bytes(b"not an engine")
    (repo / "plan_model" / "config.pbtxt").write_text('platform: "tensorrt_plan"\nmax_batch_size: 8\n')


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_mixed(tmp_path_factory.mktemp("repo_mixed"))
    with turnout_up(repo, "--exit-on-error=false") as server:
        yield server


def inputs_for(module: object, model: str) -> list[object]:
    rng = np.random.default_rng(7)
    if model.startswith("simple"):
        arrays = {"INPUT0": rng.integers(-50, 50, (2, 16), dtype=np.int32), "INPUT1": np.ones((2, 16), np.int32)}
    else:
        arrays = {"INPUT0": rng.standard_normal((3, SIZES[0])).astype(np.float32)}
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def answers(client: object, module: object, model: str) -> dict[str, np.ndarray]:
    """What the same client code reads back from any export of the model."""
    result = client.infer(model, inputs_for(module, model))  # type: ignore[attr-defined]
    names = ["OUTPUT0", "OUTPUT1"] if model.startswith("simple") else ["OUTPUT0"]
    return {name: result.as_numpy(name) for name in names}


def test_each_framework_serves_and_a_framework_that_cannot_run_says_why(mixed: Server) -> None:
    client = grpcclient.InferenceServerClient(mixed.grpc)
    index = {m.name: m for m in client.get_model_repository_index().models}
    for onnx_model, torch_model in PAIRS:
        assert index[onnx_model].state == index[torch_model].state == "READY"
    assert index["plan_model"].state == "UNAVAILABLE"
    assert "the tensorrt sidecar cannot start" in index["plan_model"].reason
    assert not client.is_model_ready("plan_model")
    assert not client.is_server_ready()  # strict readiness, as Triton with a model that failed


@pytest.mark.parametrize(("onnx_model", "torch_model"), PAIRS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_and_torchscript_exports_answer_alike(
    mixed: Server, protocol: str, onnx_model: str, torch_model: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(mixed.http if protocol == "http" else mixed.grpc)
    expected = answers(client, module, onnx_model)
    got = answers(client, module, torch_model)
    for name, array in expected.items():
        np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-5)


def test_exit_on_error_stops_turnout_up_when_a_framework_cannot_run(tmp_path: Path) -> None:
    write_plan(tmp_path)
    with pytest.raises(ServerFailedToStart) as caught, turnout_up(tmp_path, start_timeout=60):
        pass
    assert "the tensorrt sidecar cannot start: the 'tensorrt' package is not installed" in str(caught.value)


def sidecar_pid(parent: int, framework: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent_pid = int(stat.rsplit(")", 1)[1].split()[1])
        if parent_pid == parent and f"--framework={framework}".encode() in command:
            return int(entry.name)
    raise AssertionError(f"no {framework} sidecar under pid {parent}")


def test_a_killed_sidecar_takes_only_its_own_models_down(tmp_path: Path) -> None:
    with turnout_up(write_mixed(tmp_path, with_plan=False)) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc)
        http = httpclient.InferenceServerClient(server.http)
        assert grpc.is_model_ready("simple_torch") and http.is_model_ready("simple_torch")
        os.kill(sidecar_pid(server.process.pid, "pytorch"), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while grpc.is_model_ready("simple_torch") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not grpc.is_model_ready("simple_torch")
        assert not http.is_model_ready("mlp_torch")
        for client, module in ((grpc, grpcclient), (http, httpclient)):
            expected = answers(client, module, "simple")
            np.testing.assert_array_equal(expected["OUTPUT0"] - expected["OUTPUT1"], np.full((2, 16), 2))
            assert client.is_model_ready("mlp")
        with pytest.raises(InferenceServerException) as caught:
            answers(grpc, grpcclient, "simple_torch")
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert server.alive()
