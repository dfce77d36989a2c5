"""Ensembles under `turnout up`: the gateway runs the steps on the sidecars that own
their models (ONNX and TorchScript here), independent steps at once; an ensemble is
a model like any other to metadata, config, index, statistics, metrics, A/B routing
and shared memory; a failing step and an invalid config say what Triton says."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.test_e2e_frameworks import sidecar_pid
from tests.harness import Server, make_models, turnout_up

pytest.importorskip("torch", reason="the PyTorch sidecar needs torch (pip install -c constraints.txt -e '.[pytorch]')")

INT16 = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
SUM_DIFF = [("SUM", "INT32", [16]), ("DIFF", "INT32", [16])]


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> tuple[Any, ...]:
    """A write_ensemble step; the maps go from the step model's tensor names to the ensemble's."""
    return (model, version, inputs, outputs)


def write_ensembles(repo: Path) -> Path:
    models = make_models()
    models.write_simple(repo)
    models.write_simple_string(repo)
    models.write_torch_simple(repo, name="simple_torch", naming="forward")
    pair = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    # ONNX -> TorchScript -> ONNX: sum and difference, three times over.
    chain = [
        step("simple", pair, {"OUTPUT0": "s1", "OUTPUT1": "d1"}),
        step("simple_torch", {"INPUT0": "s1", "INPUT1": "d1"}, {"OUTPUT0": "s2", "OUTPUT1": "d2"}),
        step("simple", {"INPUT0": "s2", "INPUT1": "d2"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
    ]
    models.write_ensemble(repo, "chain", INT16, SUM_DIFF, chain)
    # Two steps that need nothing from each other.
    fork_outputs = [(n, "INT32", [16]) for n in ("ONNX_SUM", "ONNX_DIFF", "TORCH_SUM", "TORCH_DIFF")]
    fork = [
        step("simple", pair, {"OUTPUT0": "ONNX_SUM", "OUTPUT1": "ONNX_DIFF"}),
        step("simple_torch", pair, {"OUTPUT0": "TORCH_SUM", "OUTPUT1": "TORCH_DIFF"}),
    ]
    models.write_ensemble(repo, "fork", INT16, fork_outputs, fork)
    # Any length at the boundary, so a wrong one reaches the step, which refuses it.
    loose = [("INPUT0", "INT32", [-1]), ("INPUT1", "INT32", [-1])]
    step_out = {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}
    models.write_ensemble(
        repo, "loose", loose, [("SUM", "INT32", [-1]), ("DIFF", "INT32", [-1])], [step("simple", pair, step_out)]
    )
    strings = [(n, "BYTES", [16]) for n in ("INPUT0", "INPUT1")]
    models.write_ensemble(
        repo, "strings", strings, [(n, "BYTES", [16]) for n in ("SUM", "DIFF")], [step("simple_string", pair, step_out)]
    )
    # Two versions of one ensemble (one config, as in Triton) for weighted routing; its step pins a version.
    models.write_ensemble(
        repo,
        "ab",
        INT16,
        SUM_DIFF,
        [step("simple", pair, step_out, version=1)],
        versions=(1, 2),
        extra_config="version_policy: { all { } }",
    )
    # A step on `linear` (version 1: x1, version 2: x2): the routing policy's version, or a pinned one.
    models.write_linear(repo)
    vector = [("INPUT0", "FP32", [4])]
    scaled = [("OUTPUT0", "FP32", [4])]
    to_linear = {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}
    models.write_ensemble(repo, "scaled", vector, scaled, [step("linear", *to_linear)])
    models.write_ensemble(repo, "scaled_pinned", vector, scaled, [step("linear", *to_linear, version=2)])
    # Holds requests 3 s in its queue; a request's own timeout may cut that short.
    models.write_simple(
        repo,
        name="simple_slow",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 3000000 default_queue_policy { "
        "default_timeout_microseconds: 10000000 allow_timeout_override: true timeout_action: REJECT } }",
    )
    models.write_ensemble(repo, "slow", INT16, SUM_DIFF, [step("simple_slow", pair, step_out)])
    write_invalid(repo)
    return repo


def write_invalid(repo: Path) -> None:
    models = make_models()
    pair = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    out = [("SUM", "INT32", [16])]
    models.write_ensemble(repo, "no_steps", INT16, out, [])
    cycle = [
        step("simple", {"INPUT0": "INPUT0", "INPUT1": "b"}, {"OUTPUT0": "a", "OUTPUT1": "SUM"}),
        step("simple", {"INPUT0": "a", "INPUT1": "INPUT1"}, {"OUTPUT0": "b"}),
    ]
    models.write_ensemble(repo, "cycle", INT16, out, cycle)
    models.write_ensemble(repo, "unwritten", INT16, out, [step("simple", pair, {"OUTPUT0": "OTHER"})])
    models.write_ensemble(
        repo, "bad_map", INT16, out, [step("simple", {"NOPE": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "SUM"})]
    )
    models.write_ensemble(repo, "ghost", INT16, out, [step("no_such_model", pair, {"OUTPUT0": "SUM"})])
    bad_type = [("INPUT0", "FP32", [16]), ("INPUT1", "INT32", [16])]
    models.write_ensemble(repo, "bad_type", bad_type, out, [step("simple", pair, {"OUTPUT0": "SUM"})])


INVALID_AT_LOAD = {
    "no_steps": "must specify 'step' for ensemble 'no_steps'",
    "cycle": (
        "output 'SUM' for ensemble 'cycle' is not written: at least one of its depending tensors, 'a', is not connected"
    ),
    "unwritten": "ensemble output 'SUM' for ensemble unwritten' is not used",
    # Checked against the step models: Triton's dependency checks and ValidateEnsembleConfig.
    "bad_map": "in ensemble bad_map, ensemble tensor INPUT0 is mapping to non-existing input NOPE in model simple",
    "ghost": "ensemble ghost contains models that are not available or ambiguous: no_such_model",
    "bad_type": (
        "in ensemble bad_type, ensemble tensor INPUT0: inconsistent data type: TYPE_FP32 is inferred from model "
        "bad_type while TYPE_INT32 is inferred from model simple"
    ),
}


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_ensembles(tmp_path_factory.mktemp("repo_ensembles"))
    routing = repo.parent / "routing.yaml"
    routing.write_text('models:\n  ab:\n    weights: {"1": 50, "2": 50}\n  linear:\n    weights: {"1": 100, "2": 0}\n')
    flags = (
        "--model-control-mode=explicit",
        "--load-model=*",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--allow-client-shm=true",
        f"--routing={routing}",
        "--routing-seed=3",
    )
    with turnout_up(repo, *flags) as server:
        yield server


def pair_inputs(module: Any, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[Any]:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(array.shape), "INT32")
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def client_for(server: Server, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc)


def operands() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return rng.integers(-100, 100, (2, 16), dtype=np.int32), rng.integers(-100, 100, (2, 16), dtype=np.int32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_chain_across_frameworks_answers_as_its_models_run_by_hand(ensembles: Server, protocol: str) -> None:
    module, client = client_for(ensembles, protocol)
    a, b = operands()
    first = client.infer("simple", pair_inputs(module, a, b))
    second = client.infer("simple_torch", pair_inputs(module, first.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT1")))
    third = client.infer("simple", pair_inputs(module, second.as_numpy("OUTPUT0"), second.as_numpy("OUTPUT1")))

    result = client.infer("chain", pair_inputs(module, a, b))

    np.testing.assert_array_equal(result.as_numpy("SUM"), third.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), third.as_numpy("OUTPUT1"))
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * (a + b))  # s2 = 2a, d2 = 2b
    response = result.get_response()
    name, version = (
        (response["model_name"], response["model_version"])
        if protocol == "http"
        else (
            response.model_name,
            response.model_version,
        )
    )
    assert (name, version) == ("chain", "1")


def test_an_ensemble_answers_on_a_grpc_stream(ensembles: Server) -> None:
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("chain", pair_inputs(grpcclient, a, b))
        result, error = answers.get(timeout=20)
    finally:
        client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * (a + b))


def test_requested_outputs_come_back_as_asked_json_or_binary(ensembles: Server) -> None:
    client = httpclient.InferenceServerClient(ensembles.http)
    a, b = operands()
    # JSON inputs and JSON outputs, a requested output alone.
    outputs = [httpclient.InferRequestedOutput("DIFF", binary_data=False)]
    result = client.infer("chain", pair_inputs(httpclient, a, b, binary=False), outputs=outputs)
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["DIFF"]
    assert "data" in result.get_response()["outputs"][0]
    np.testing.assert_array_equal(result.as_numpy("DIFF"), 2 * (a - b))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("chain", pair_inputs(httpclient, a, b), outputs=[httpclient.InferRequestedOutput("s1")])
    assert caught.value.message() == "unexpected inference output 's1' for model 'chain'"


def test_typed_contents_reach_the_steps_as_raw_tensors(ensembles: Server) -> None:
    # gRPC typed `contents` (INT32 and BYTES): validated once, then sent on as raw bytes.
    a, b = operands()
    request = service_pb2.ModelInferRequest(model_name="chain")
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        request.inputs.add(name=name, datatype="INT32", shape=list(array.shape)).contents.int_contents.extend(
            array.flatten().tolist()
        )
    strings = service_pb2.ModelInferRequest(model_name="strings")
    for name in ("INPUT0", "INPUT1"):
        strings.inputs.add(name=name, datatype="BYTES", shape=[1, 16]).contents.bytes_contents.extend(
            [str(i).encode() for i in range(16)]
        )
    with grpc.insecure_channel(ensembles.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(request)
        named = {output.name: index for index, output in enumerate(answer.outputs)}
        total = np.frombuffer(answer.raw_output_contents[named["SUM"]], dtype=np.int32).reshape(a.shape)
        np.testing.assert_array_equal(total, 2 * (a + b))
        assert stub.ModelInfer(strings).model_name == "strings"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_of_an_ensemble_output(ensembles: Server, protocol: str) -> None:
    """The step that computes the output classifies it, as the model would when asked directly."""
    module, client = client_for(ensembles, protocol)
    a, b = operands()
    asked = [module.InferRequestedOutput("SUM", class_count=3)]
    result = client.infer("chain", pair_inputs(module, a, b), outputs=asked)
    direct = client.infer(
        "simple", pair_inputs(module, 2 * a, 2 * b), outputs=[module.InferRequestedOutput("OUTPUT0", class_count=3)]
    )
    np.testing.assert_array_equal(result.as_numpy("SUM"), direct.as_numpy("OUTPUT0"))
    assert result.as_numpy("SUM").shape == (2, 3)


def test_bytes_tensors_cross_an_ensemble(ensembles: Server) -> None:
    a, b = operands()
    strings = [np.array([[str(v).encode() for v in row] for row in x], dtype=np.object_) for x in (a, b)]
    for module, url in ((httpclient, ensembles.http), (grpcclient, ensembles.grpc)):
        client = module.InferenceServerClient(url)
        inputs = []
        for name, array in zip(("INPUT0", "INPUT1"), strings, strict=True):
            tensor = module.InferInput(name, list(array.shape), "BYTES")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer("strings", inputs)
        assert [int(v) for v in result.as_numpy("SUM").reshape(-1)] == list((a + b).reshape(-1))
        assert [int(v) for v in result.as_numpy("DIFF").reshape(-1)] == list((a - b).reshape(-1))


def test_an_answer_lists_the_outputs_in_tritons_order(ensembles: Server) -> None:
    # Triton's ensemble keeps its outputs in a std::unordered_map and answers in its order,
    # whatever order the config or the request gives (checked against Triton 2.51).
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    order = ["TORCH_DIFF", "TORCH_SUM", "ONNX_DIFF", "ONNX_SUM"]
    answer = client.infer("fork", pair_inputs(grpcclient, a, b)).get_response()
    assert [output.name for output in answer.outputs] == order
    asked = [grpcclient.InferRequestedOutput(name) for name in ("ONNX_SUM", "TORCH_DIFF")]
    answer = client.infer("fork", pair_inputs(grpcclient, a, b), outputs=asked).get_response()
    assert [output.name for output in answer.outputs] == ["TORCH_DIFF", "ONNX_SUM"]


def test_independent_steps_run_at_the_same_time(ensembles: Server) -> None:
    """With the ONNX sidecar frozen, the TorchScript step of `fork` still runs: it
    never waited for its sibling. Once the sidecar thaws, the ensemble answers."""
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    client.infer("fork", pair_inputs(grpcclient, a, b))  # its plan (the steps' configs) is built on first use
    before = torch_successes(client)
    onnx = sidecar_pid(ensembles.process.pid, "onnxruntime")

    async def run() -> Any:
        async with grpcaio.InferenceServerClient(ensembles.grpc) as aio:
            pending = asyncio.ensure_future(aio.infer("fork", pair_inputs(grpcaio, a, b)))
            deadline = time.monotonic() + 20
            while torch_successes(client) == before:
                assert time.monotonic() < deadline, "the TorchScript step never ran"
                assert not pending.done()
                await asyncio.sleep(0.05)
            assert not pending.done()  # still waiting on the frozen ONNX step
            os.kill(onnx, signal.SIGCONT)
            return await asyncio.wait_for(pending, 20)

    os.kill(onnx, signal.SIGSTOP)
    try:
        result = asyncio.run(run())
    finally:
        os.kill(onnx, signal.SIGCONT)
    for prefix in ("ONNX", "TORCH"):
        np.testing.assert_array_equal(result.as_numpy(f"{prefix}_SUM"), a + b)
        np.testing.assert_array_equal(result.as_numpy(f"{prefix}_DIFF"), a - b)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_the_ensemble_cannot_take_is_refused_naming_the_ensemble(ensembles: Server, protocol: str) -> None:
    # As Triton's core checks any model's request before it runs: fork's own inputs are
    # [-1,16], so no step is reached.
    module, client = client_for(ensembles, protocol)
    short = np.ones((1, 8), dtype=np.int32)
    before = torch_successes(grpcclient.InferenceServerClient(ensembles.grpc))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("fork", pair_inputs(module, short, short), request_id="r1")
    assert caught.value.message().startswith(
        "[request id: r1] unexpected shape for input 'INPUT1' for model 'fork'. Expected [-1,16], got [1,8]."
    )
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("fork", pair_inputs(module, short, short)[:1])
    assert caught.value.message() == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'fork'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )
    assert torch_successes(grpcclient.InferenceServerClient(ensembles.grpc)) == before


def torch_successes(client: Any) -> int:
    stats = client.get_inference_statistics("simple_torch").model_stats
    return sum(s.inference_stats.success.count for s in stats)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_fed_a_bad_shape_fails_naming_the_ensemble_and_the_step(ensembles: Server, protocol: str) -> None:
    module, client = client_for(ensembles, protocol)
    short = np.ones((1, 8), dtype=np.int32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("loose", pair_inputs(module, short, short))
    message = caught.value.message()
    assert message.startswith("in ensemble 'loose', [request id: <id_unknown>] unexpected shape for input 'INPUT")
    assert "for model 'simple'. Expected [-1,16], got [1,8]." in message
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    a, b = operands()
    np.testing.assert_array_equal(client.infer("loose", pair_inputs(module, a, b)).as_numpy("SUM"), a + b)


def test_unloading_a_step_model_unloads_the_ensembles_using_it_until_it_is_back(ensembles: Server) -> None:
    # As Triton's dependency graph (checked on 2.51): the ensembles go with their step model,
    # and load again once it is back.
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    client.unload_model("simple_torch")
    try:
        assert not client.is_model_ready("chain") and not client.is_model_ready("fork")
        assert client.is_model_ready("loose")  # its only step is the ONNX model
        index = {entry.name: entry for entry in client.get_model_repository_index().models}
        assert (index["chain"].state, index["chain"].reason) == ("UNAVAILABLE", "unloaded")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("chain", pair_inputs(grpcclient, a, b))
        assert caught.value.status() == "StatusCode.NOT_FOUND"
        assert client.is_server_live()
    finally:
        client.load_model("simple_torch")
    assert client.is_model_ready("chain") and client.is_model_ready("fork")
    np.testing.assert_array_equal(client.infer("chain", pair_inputs(grpcclient, a, b)).as_numpy("SUM"), 2 * (a + b))


def test_unload_dependents_takes_the_step_models_only_the_ensemble_loaded(ensembles: Server) -> None:
    # As Triton (checked on 2.51): a step model loaded with its ensemble goes with it when
    # the unload asks for its dependents, and stays without; one a client loaded stays.
    client = httpclient.InferenceServerClient(ensembles.http)
    try:
        client.unload_model("strings")
        client.unload_model("simple_string")
        client.load_model("strings")  # loads simple_string with it
        assert client.is_model_ready("simple_string")
        client.unload_model("strings")
        assert client.is_model_ready("simple_string")
        client.load_model("strings")
        client.unload_model("strings", unload_dependents=True)
        assert not client.is_model_ready("strings") and not client.is_model_ready("simple_string")
        client.load_model("simple_string")  # a client's load: it stays from now on
        client.load_model("strings")
        client.unload_model("strings", unload_dependents=True)
        assert client.is_model_ready("simple_string")
    finally:
        for model in ("simple_string", "strings"):
            client.load_model(model)
    assert client.is_model_ready("strings")


def test_an_ensemble_has_metadata_config_readiness_and_an_index_entry(ensembles: Server) -> None:
    http = httpclient.InferenceServerClient(ensembles.http)
    grpc = grpcclient.InferenceServerClient(ensembles.grpc)
    assert http.get_model_metadata("chain") == {
        "name": "chain",
        "versions": ["1"],
        "platform": "ensemble",
        "inputs": [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")],
        "outputs": [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("SUM", "DIFF")],
    }
    config = http.get_model_config("chain")
    assert (config["platform"], config["backend"], config["instance_group"]) == ("ensemble", "", [])
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["model_version"]) for s in steps] == [
        ("simple", -1),
        ("simple_torch", -1),
        ("simple", -1),
    ]
    assert grpc.get_model_config("chain").config.ensemble_scheduling.step[1].output_map == {
        "OUTPUT0": "s2",
        "OUTPUT1": "d2",
    }
    assert http.is_model_ready("chain") and grpc.is_model_ready("chain", "1")
    index = {(m["name"], m.get("version", "")): m for m in http.get_model_repository_index()}
    assert index[("chain", "1")]["state"] == "READY"
    assert index[("ab", "1")]["state"] == index[("ab", "2")]["state"] == "READY"


def test_ensemble_requests_show_in_statistics_and_metrics(ensembles: Server) -> None:
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    before = client.get_inference_statistics("fork", "1").model_stats[0]
    for _ in range(3):
        client.infer("fork", pair_inputs(grpcclient, a, b))
    with pytest.raises(InferenceServerException):
        client.infer("fork", pair_inputs(grpcclient, a[:, :8], b[:, :8]))
    stats = client.get_inference_statistics("fork", "1").model_stats[0]
    assert stats.inference_stats.success.count - before.inference_stats.success.count == 3
    # The short request was refused before it ran: as in Triton, counted nowhere.
    assert stats.inference_stats.fail.count == before.inference_stats.fail.count
    assert stats.inference_count - before.inference_count == 3 * 2  # batch of two each
    assert stats.execution_count - before.execution_count == 3
    assert stats.inference_stats.compute_infer.ns > before.inference_stats.compute_infer.ns
    assert [b.batch_size for b in stats.batch_stats] == [2]
    everything = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"fork", "chain", "simple", "simple_torch"} <= everything

    metrics = scrape(ensembles)
    assert (
        metric(metrics, 'nv_inference_request_success{model="fork",version="1"}') == stats.inference_stats.success.count
    )
    assert metric(metrics, 'nv_inference_request_failure{model="fork",reason="OTHER",version="1"}') == (
        stats.inference_stats.fail.count
    )
    assert metric(metrics, 'nv_inference_count{model="fork",version="1"}') == stats.inference_count
    assert (
        metric(
            metrics, 'turnout_gateway_request_duration_seconds_count{model="fork",protocol="grpc",version="default"}'
        )
        >= 4
    )


def scrape(server: Server) -> str:
    return httpx.get(f"http://{server.metrics}/metrics").text


def metric(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {sample}")


def test_weights_split_requests_between_two_ensemble_versions(ensembles: Server) -> None:
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    before = {s.version: s.inference_stats.success.count for s in client.get_inference_statistics("ab").model_stats}
    versions = [client.infer("ab", pair_inputs(grpcclient, a, b)).get_response().model_version for _ in range(40)]
    assert set(versions) == {"1", "2"}
    after = {s.version: s.inference_stats.success.count for s in client.get_inference_statistics("ab").model_stats}
    assert {v: after[v] - before.get(v, 0) for v in ("1", "2")} == {v: versions.count(v) for v in ("1", "2")}
    # A version the client names wins over the weights.
    assert {client.infer("ab", pair_inputs(grpcclient, a, b), model_version="2").get_response().model_version} == {"2"}


def test_the_request_timeout_reaches_the_steps(ensembles: Server) -> None:
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    a, b = operands()
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as caught:
        client.infer("slow", pair_inputs(grpcclient, a, b), timeout=100_000)  # microseconds
    assert time.monotonic() - started < 2.5  # rejected before the step's 3 s queue delay ran out
    assert caught.value.message().startswith("in ensemble 'slow', ")
    assert caught.value.message().endswith("Request timeout expired")
    assert caught.value.status() == "StatusCode.UNAVAILABLE"


def test_a_step_of_any_version_takes_the_routing_policys_and_a_pinned_step_its_own(ensembles: Server) -> None:
    client = grpcclient.InferenceServerClient(ensembles.grpc)
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    # The weights send all of `linear` to version 1, though version 2 is the newest.
    np.testing.assert_array_equal(client.infer("scaled", [tensor]).as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(client.infer("scaled_pinned", [tensor]).as_numpy("OUTPUT0"), 2 * x)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_at_the_ensemble_boundary(ensembles: Server, protocol: str) -> None:
    module, client = client_for(ensembles, protocol)
    size = 2 * 16 * 4
    key = f"/turnout_{os.getpid()}_ensemble_{protocol}"
    inputs_region = shm.create_shared_memory_region(f"ens_in_{protocol}", key + "_in", 2 * size)
    outputs_region = shm.create_shared_memory_region(f"ens_out_{protocol}", key + "_out", 2 * size)
    a, b = operands()
    try:
        shm.set_shared_memory_region(inputs_region, [a, b])
        client.register_system_shared_memory(f"ens_in_{protocol}", key + "_in", 2 * size)
        client.register_system_shared_memory(f"ens_out_{protocol}", key + "_out", 2 * size)
        inputs = [module.InferInput(n, [2, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory(f"ens_in_{protocol}", size)
        inputs[1].set_shared_memory(f"ens_in_{protocol}", size, offset=size)
        outputs = [module.InferRequestedOutput(n) for n in ("SUM", "DIFF")]
        outputs[0].set_shared_memory(f"ens_out_{protocol}", size)
        outputs[1].set_shared_memory(f"ens_out_{protocol}", size, offset=size)
        client.infer("chain", inputs, outputs=outputs)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs_region, np.int32, [2, 16]), 2 * (a + b))
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(outputs_region, np.int32, [2, 16], offset=size), 2 * (a - b)
        )
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs_region)
        shm.destroy_shared_memory_region(outputs_region)


@pytest.mark.parametrize("model", sorted(INVALID_AT_LOAD))
def test_an_invalid_ensemble_config_does_not_load_and_says_why(ensembles: Server, model: str) -> None:
    http = httpclient.InferenceServerClient(ensembles.http)
    entries = [m for m in http.get_model_repository_index() if m["name"] == model]
    assert [m["state"] for m in entries] == ["UNAVAILABLE"]
    assert INVALID_AT_LOAD[model] in entries[0]["reason"]
    with pytest.raises(InferenceServerException) as caught:
        http.load_model(model)
    assert INVALID_AT_LOAD[model] in caught.value.message()


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Explicit mode that names one ensemble and one plain model at start."""
    repo = write_ensembles(tmp_path_factory.mktemp("repo_explicit"))
    with turnout_up(repo, "--model-control-mode=explicit", "--load-model=chain", "--load-model=simple_slow") as server:
        yield server


def test_naming_an_ensemble_at_start_loads_its_steps_on_their_own_sidecars(explicit: Server) -> None:
    client = httpclient.InferenceServerClient(explicit.http)
    ready = {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}
    assert ready == {"chain", "simple", "simple_torch", "simple_slow"}
    a, b = operands()
    result = client.infer("chain", pair_inputs(httpclient, a, b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * (a + b))


def test_loading_an_ensemble_loads_the_steps_it_lacks(explicit: Server) -> None:
    client = grpcclient.InferenceServerClient(explicit.grpc)
    client.load_model("strings")
    assert client.is_model_ready("simple_string")
    text = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(text)
        inputs.append(tensor)
    result = client.infer("strings", inputs)
    assert result.as_numpy("SUM")[0][3] == b"6"


def test_an_ensemble_whose_step_cannot_load_is_not_loaded_either(explicit: Server) -> None:
    client = grpcclient.InferenceServerClient(explicit.grpc)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("ghost")
    assert caught.value.message() == (
        "load failed for model 'ghost': ensemble ghost contains models that are not available or ambiguous: "
        "no_such_model\n"
    )
    assert not client.is_model_ready("ghost")
    assert client.is_model_ready("chain")  # the server keeps serving


@pytest.mark.parametrize("model", ["bad_map", "bad_type"])
def test_loading_an_ensemble_whose_steps_contradict_their_models_fails(explicit: Server, model: str) -> None:
    client = httpclient.InferenceServerClient(explicit.http)
    with pytest.raises(InferenceServerException) as failure:
        client.load_model(model)
    assert INVALID_AT_LOAD[model] in str(failure.value)
    assert not client.is_model_ready(model)


def test_unloading_an_ensemble_named_at_start_with_its_dependents_takes_the_steps_loaded_for_it(
    explicit: Server,
) -> None:
    # As Triton (checked on 2.51): the steps --load-model=chain loaded are chain's
    # dependents; a model named at start itself (simple_slow) is not.
    client = httpclient.InferenceServerClient(explicit.http)
    try:
        client.unload_model("chain", unload_dependents=True)
        ready = {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}
        assert not ready & {"chain", "simple", "simple_torch"}
        assert "simple_slow" in ready
    finally:
        client.load_model("chain")
    assert client.is_model_ready("chain") and client.is_model_ready("simple")
