"""Python-backend models under `turnout up`: `model.py` files as Triton runs them, served
by the python sidecar beside an ONNX one, through tritonclient over HTTP and gRPC; their
failures in Triton's words, a dead model process survived, custom metrics in the fleet
view, and BLS calls to an ONNX model through the gateway."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.python_models import write_python_models
from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import Server, eventually, live_children, pid_alive, turnout_up, write_repository


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_python"), ("simple",))
    with turnout_up(write_python_models(repo)) as running:
        yield running


def _add_sub_inputs(module: object, a: np.ndarray, b: np.ndarray) -> list[object]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)  # type: ignore[attr-defined]
    inputs[1].set_data_from_numpy(b)  # type: ignore[attr-defined]
    return inputs


def _misbehave(server: Server, mode: str) -> httpclient.InferResult:
    data = np.array([[7]], dtype=np.int32).reshape(1)
    inputs = [httpclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(data)
    with httpclient.InferenceServerClient(server.http, network_timeout=30) as client:
        return client.infer("misbehaving", inputs, parameters={"mode": mode})


def test_add_sub_over_http_and_grpc(up: Server) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)
    with httpclient.InferenceServerClient(up.http) as client:
        result = client.infer(
            "add_sub", _add_sub_inputs(httpclient, a, b), request_id="r-7", parameters={"echo": "hello"}
        )
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
        parameters = result.get_response()["parameters"]
        assert parameters["request_id"] == "r-7"
        assert parameters["echo"] == "hello"
        assert parameters["instance"] == "add_sub_0_0"
        assert parameters["kind"] == "CPU"
        assert parameters["requested"] == "OUTPUT0,OUTPUT1"
        assert client.get_model_metadata("add_sub")["platform"] == "python"
    with grpcclient.InferenceServerClient(up.grpc) as client:
        result = client.infer(
            "add_sub",
            _add_sub_inputs(grpcclient, a, b),
            outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
        )
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
        assert result.as_numpy("OUTPUT0") is None
        assert result.get_response().parameters["requested"].string_param == "OUTPUT1"


async def test_dynamic_batching_hands_execute_several_requests(up: Server) -> None:
    async def one(client: httpaio.InferenceServerClient, seed: int) -> int:
        rng = np.random.default_rng(seed)
        a, b = rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)
        result = await client.infer("add_sub", _add_sub_inputs(httpaio, a, b))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        batch: int = result.get_response()["parameters"]["batch"]
        return batch

    async with httpaio.InferenceServerClient(up.http) as client:
        batches = await asyncio.gather(*(one(client, seed) for seed in range(16)))
    assert max(batches) > 1, batches  # 100 ms of queue delay gathers concurrent requests


def test_auto_complete_config_builds_the_config(up: Server) -> None:
    with httpclient.InferenceServerClient(up.http) as client:
        config = client.get_model_config("auto")
        assert config["backend"] == "python"
        assert config["max_batch_size"] == 4
        assert "dynamic_batching" in config
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_INT64", [2])]
        x = np.array([[1, 2], [3, 4]], dtype=np.int64)
        inputs = [httpclient.InferInput("X", [2, 2], "INT64")]
        inputs[0].set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("auto", inputs).as_numpy("Y"), x * 2)


def test_an_exception_in_execute_fails_the_requests_in_tritons_words(up: Server) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _misbehave(up, "raise")
    message = caught.value.message()
    assert message.startswith(
        "Failed to process the request(s) for model 'misbehaving_0_0', message: ValueError: the model failed on purpose"
    ), message
    assert "model.py" in message  # the model's frames, as Triton's stub lists them
    assert "stub.py" not in message
    assert caught.value.status() == "500"
    _misbehave(up, "")  # and it keeps serving


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (
            "count",
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0",
        ),
        ("type", "Expected a list in the execute return, found type '<class 'tuple'>'."),
    ],
)
def test_wrong_responses_get_tritons_text(up: Server, mode: str, text: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _misbehave(up, mode)
    assert text in caught.value.message()
    _misbehave(up, "")


def test_an_error_response_keeps_its_code(up: Server) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _misbehave(up, "error")
    assert caught.value.message() == "bad input on purpose"
    assert caught.value.status() == "400"  # INVALID_ARG


def test_a_hung_model_leaves_the_others_served(up: Server) -> None:
    data = np.array([7], dtype=np.int32)
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(up.grpc) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("misbehaving", inputs, parameters={"mode": "hang"}, client_timeout=1.0)
        assert "Deadline" in caught.value.message() or caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        rng = np.random.default_rng(5)
        a, b = rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)
        result = client.infer("add_sub", _add_sub_inputs(grpcclient, a, b))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    _misbehave(up, "")  # once its execute returns, the model serves again


def test_a_dead_model_process_fails_its_batch_and_is_restarted(up: Server) -> None:
    first = int(_misbehave(up, "").as_numpy("OUT")[0])
    with pytest.raises(InferenceServerException) as caught:
        _misbehave(up, "die")
    assert caught.value.message() == (
        "Failed to process the request(s) for model instance 'misbehaving_0_0', "
        "message: Stub process 'misbehaving_0_0' is not healthy."
    )
    second = int(_misbehave(up, "").as_numpy("OUT")[0])
    assert second != first  # a new process, initialized again


def test_a_killed_model_process_is_survived(up: Server) -> None:
    pid = int(_misbehave(up, "").as_numpy("OUT")[0])
    assert pid in _descendants(up.process.pid)
    os.kill(pid, signal.SIGKILL)
    assert eventually(lambda: _served_by_another(up, pid), timeout=30)


def _served_by_another(server: Server, pid: int) -> bool:
    try:
        return int(_misbehave(server, "").as_numpy("OUT")[0]) != pid
    except InferenceServerException:
        return False  # the batch the kill caught


def _descendants(pid: int) -> list[int]:
    found = []
    for child in live_children(pid):
        found += [child, *_descendants(child)]
    return found


def test_custom_metrics_reach_the_fleet_metrics_port(up: Server) -> None:
    _misbehave(up, "")
    text = httpx.get(f"http://{up.metrics}/metrics").text
    assert "# TYPE misbehaving_executions counter" in text
    assert "# HELP misbehaving_executions Executions of the misbehaving model" in text
    samples = [line for line in text.splitlines() if line.startswith('misbehaving_executions{model="misbehaving"}')]
    assert samples and float(samples[0].split()[-1]) >= 1
    assert 'nv_inference_request_success{model="add_sub",version="1"}' in text


def test_a_metric_whose_family_object_is_gone_refuses_and_leaves_the_metrics_port(up: Server) -> None:
    # As Triton's python backend (checked on 2.51): a family lives as long as its object.
    with pytest.raises(InferenceServerException) as caught:
        _misbehave(up, "orphan")
    assert (
        "TritonModelException: Failed to increment metric value: Invalid metric operation as the corresponding "
        "'MetricFamily' has been deleted. The 'MetricFamily' object should be deleted AFTER its corresponding "
        "'Metric' objects have been deleted." in caught.value.message()
    )
    _misbehave(up, "")
    assert "misbehaving_dropped" not in httpx.get(f"http://{up.metrics}/metrics").text


def test_statistics_count_python_requests_and_failures(up: Server) -> None:
    _misbehave(up, "")
    with pytest.raises(InferenceServerException):
        _misbehave(up, "raise")
    with httpclient.InferenceServerClient(up.http) as client:
        stats = client.get_inference_statistics("misbehaving")["model_stats"][0]
    assert stats["inference_count"] >= 1
    assert stats["execution_count"] >= 1
    assert stats["inference_stats"]["fail"]["count"] >= 1


@pytest.mark.parametrize("asynchronous", [False, True])
def test_bls_runs_an_onnx_model_through_the_gateway(up: Server, asynchronous: bool) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(up.http) as client:
        result = client.infer("bls", http_inputs(a, b), parameters={"target": "simple", "async": asynchronous})
        check_simple(result, a, b)
        statistics = client.get_inference_statistics("simple")["model_stats"][0]
        assert statistics["inference_count"] >= 1
    with grpcclient.InferenceServerClient(up.grpc) as client:
        check_simple(client.infer("bls", grpc_inputs(a, b), parameters={"async": asynchronous}), a, b)


def test_bls_errors_come_back_in_the_response(up: Server) -> None:
    # In the python backend's words (checked against Triton 2.51): a call refused before it
    # ran names the model first; the model's own error response comes back as it is.
    a, b = simple_arrays()
    refused = "Model {0} - Error when running inference: "
    with httpclient.InferenceServerClient(up.http) as client:
        for target, text in (
            ("no_such_model", "Failed for execute the inference request. Model 'no_such_model' is not ready."),
            ("misbehaving", "unexpected inference output 'OUTPUT0' for model 'misbehaving'"),
            (
                "add_sub",
                "[request id: <id_unknown>] inference input 'INPUT1' data-type is 'INT32', but model "
                "'add_sub' expects 'FP32'",
            ),
            (
                "repeat",
                "Model repeat is using the decoupled. The current BLS request call doesn't support models "
                "using the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
                "'async_exec' calls for decoupled models.'",
            ),
        ):
            with pytest.raises(InferenceServerException) as caught:
                client.infer("bls", http_inputs(a, b), parameters={"target": target, "code": True})
            # A refusal is an INTERNAL error, whatever status the server gave it.
            assert caught.value.message() == refused.format(target) + text + " (INTERNAL)"


def test_a_bls_stream_goes_on_past_an_error_response(up: Server) -> None:
    # `repeat` answers 5, an error in place of 6, then 7, then its final flag alone: a
    # decoupled BLS call sees all four, the last an empty response (as in Triton 2.51).
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(up.grpc) as client:
        result = client.infer("bls", grpc_inputs(a, b), parameters={"stream": "5,6,7"})
    seen = result.get_response().parameters["seen"].string_param
    assert seen == "5 | error: no answer for 6 | 7 | empty"


@pytest.mark.parametrize(
    ("target", "text"),
    [
        ("no_such_model", "Failed for execute the inference request. Model 'no_such_model' is not ready."),
        (
            "misbehaving",
            "[request id: <id_unknown>] unexpected shape for input 'IN' for model 'misbehaving'. "
            "Expected [1], got [3]. ",
        ),
        ("simple", "unexpected inference output 'OUT' for model 'simple'"),
    ],
)
def test_a_bls_stream_refused_before_it_ran_names_the_model(up: Server, target: str, text: str) -> None:
    # As the python backend words a refusal, on its decoupled path too (checked against 2.51).
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(up.grpc) as client:
        result = client.infer("bls", grpc_inputs(a, b), parameters={"stream": "5,6,7", "stream_target": target})
    seen = result.get_response().parameters["seen"].string_param
    assert seen == f"error: Model {target} - Error when running inference: {text}"


def test_repository_lists_python_models_ready(up: Server) -> None:
    with httpclient.InferenceServerClient(up.http) as client:
        index = {entry["name"]: entry.get("state") for entry in client.get_model_repository_index()}
    assert {
        index[name]
        for name in ("add_sub", "auto", "misbehaving", "bls", "repeat", "mixed", "named", "accumulate", "simple")
    } == {"READY"}


def test_finalize_runs_at_shutdown(tmp_path: Path) -> None:
    repo = write_python_models(write_repository(tmp_path / "repo", ("simple",)))
    with turnout_up(repo) as running:
        pass
    assert "add_sub finalized" in running.output()


def test_an_ensemble_runs_a_python_step_then_an_onnx_one(up: Server) -> None:
    a, b = simple_arrays(seed=11)
    inputs = [grpcclient.InferInput("A", [1, 16], "INT32"), grpcclient.InferInput("B", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with grpcclient.InferenceServerClient(up.grpc) as client:
        result = client.infer("mixed", inputs)
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("TWICE_B"), 2 * b)


def test_a_sequence_reaches_the_model_with_its_state_id_and_flags(up: Server) -> None:
    seen = []
    totals = []
    with httpclient.InferenceServerClient(up.http) as client:
        for index, x in enumerate([1, 2, 3]):
            inputs = [httpclient.InferInput("X", [1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([x], dtype=np.int32))
            result = client.infer(
                "accumulate", inputs, sequence_id=42, sequence_start=index == 0, sequence_end=index == 2
            )
            totals.append(int(result.as_numpy("TOTAL")[0]))
            seen.append(result.as_numpy("SEEN")[0].decode())
    assert totals == [1, 3, 6]
    assert seen == ["42:1:1", "42:0:0", "42:2:0"]


def test_a_running_request_sees_its_client_give_up(up: Server) -> None:
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([7], dtype=np.int32))
    with grpcclient.InferenceServerClient(up.grpc) as client, pytest.raises(InferenceServerException):
        client.infer("misbehaving", inputs, parameters={"mode": "until_cancelled"}, client_timeout=1.0)

    def saw_cancel() -> bool:
        text = httpx.get(f"http://{up.metrics}/metrics").text
        return "misbehaving_saw_cancel 1" in text

    assert eventually(saw_cancel, timeout=15)
    _misbehave(up, "")


def test_default_model_filename_names_the_file_and_its_folder_imports(up: Server) -> None:
    inputs = [httpclient.InferInput("X", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([5], dtype=np.int32))
    with httpclient.InferenceServerClient(up.http) as client:
        assert client.infer("named", inputs).as_numpy("Y").tolist() == [15]


def _executions(server: Server) -> float:
    for line in httpx.get(f"http://{server.metrics}/metrics").text.splitlines():
        if line.startswith('misbehaving_executions{model="misbehaving"}'):
            return float(line.split()[-1])
    return 0.0


def _python_sidecar(server: Server) -> int:
    for pid in live_children(server.process.pid):
        if "--framework=python" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"):
            return pid
    raise AssertionError("no python sidecar under turnout up")


def test_model_processes_end_with_a_killed_sidecar_which_comes_back(up: Server) -> None:
    # Last in this module: the sidecar every test shares is killed (and restarted).
    sidecar = _python_sidecar(up)
    stubs = live_children(sidecar)
    assert stubs  # one process per model instance
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([7], dtype=np.int32))
    with grpcclient.InferenceServerClient(up.grpc) as client:
        before = _executions(up)
        # A stub busy in execute when its sidecar dies.
        client.async_infer(
            "misbehaving",
            inputs,
            lambda result, error: answers.put((result, error)),
            parameters={"mode": "hang"},
            client_timeout=60,
        )
        assert eventually(lambda: _executions(up) > before)
        os.kill(sidecar, signal.SIGKILL)
        result, error = answers.get(timeout=60)
    assert result is None and isinstance(error, InferenceServerException), (result, error)
    assert eventually(lambda: not any(pid_alive(pid) for pid in stubs), timeout=30)
    assert eventually(lambda: _served_by_another(up, -1), timeout=60)


def test_python_models_load_and_unload_on_request(tmp_path: Path) -> None:
    repo = write_python_models(write_repository(tmp_path / "repo", ("simple",)))
    with turnout_up(repo, "--model-control-mode=explicit") as explicit:
        with httpclient.InferenceServerClient(explicit.http) as client:
            assert not client.is_model_ready("add_sub")
            client.load_model("add_sub")
            assert client.is_model_ready("add_sub")
            rng = np.random.default_rng(9)
            a, b = rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)
            np.testing.assert_allclose(
                client.infer("add_sub", _add_sub_inputs(httpclient, a, b)).as_numpy("OUTPUT0"), a + b
            )
            client.unload_model("add_sub")
            assert eventually(lambda: not client.is_model_ready("add_sub"))
        assert eventually(lambda: "add_sub finalized" in explicit.output())
