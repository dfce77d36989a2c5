"""Streams from python models under `turnout up`: a decoupled model's responses over
gRPC ModelStreamInfer (tritonclient's stream) and over HTTP through the generate extension
(generate_stream read as server-sent events with a plain HTTP client)."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from protos.ready import kernel_port_floor
from tests.e2e.python_models import stream_repeat, write_python_models
from tests.harness import Server, turnout_up, write_repository


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_python_streams"), ("simple",))
    with turnout_up(write_python_models(repo)) as running:
        yield running


def test_with_grpc_port_0_the_port_python_models_call_back_on_is_none_the_kernel_hands_out(up: Server) -> None:
    # It is chosen before the sidecars start and bound after them: a port from the
    # kernel's own range could meanwhile be given to a sidecar binding port 0.
    assert int(up.grpc.rpartition(":")[2]) < kernel_port_floor()


def test_generate_refuses_what_it_cannot_take(up: Server) -> None:
    not_an_object = httpx.post(f"http://{up.http}/v2/models/add_sub/generate", json=[1, 2])
    assert not_an_object.status_code == 500  # Triton 2.51's status and words
    assert not_an_object.json()["error"] == "attempt to get members for non-object"
    unknown = httpx.post(f"http://{up.http}/v2/models/nope/generate", json={"IN": [1]})
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["error"]


def test_generate_stream_refused_before_it_runs_is_a_plain_error(up: Server) -> None:
    # As Triton: a request the server refuses is answered as any request is; only what the
    # model answers travels as events.
    body = {"INPUT0": list(range(16))}
    response = httpx.post(f"http://{up.http}/v2/models/simple/generate_stream", json=body)
    assert (response.status_code, response.headers["content-type"]) == (400, "application/json")
    assert response.json()["error"] == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )
    # Two rows' worth of elements is a batch of two, shaped by the model's input shape.
    body = {"INPUT0": list(range(32)), "INPUT1": [1] * 32}
    with httpx.stream("POST", f"http://{up.http}/v2/models/simple/generate_stream", json=body) as streamed:
        assert streamed.status_code == 200
        lines = [line for line in streamed.iter_lines() if line]
    assert lines == [
        "data: "
        + json.dumps(
            {
                "OUTPUT0": list(range(1, 33)),
                "OUTPUT1": list(range(-1, 31)),
                "model_name": "simple",
                "model_version": "1",
            },
            separators=(",", ":"),
        )
    ]


def _stream(server: Server, values: list[int], **options: Any) -> list[Any]:
    return stream_repeat(server.grpc, values, **options)


def test_a_decoupled_model_streams_every_response_in_order(up: Server) -> None:
    got = _stream(up, [5, 6, 7], enable_empty_final_response=True)
    assert [int(r.as_numpy("OUT")[0]) for r in got[:3]] == [5, 6, 7]
    assert [int(r.as_numpy("IDX")[0]) for r in got[:3]] == [0, 1, 2]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert finals == [False, False, False, True]
    assert got[3].get_response().outputs == []  # the final flag alone: an empty response
    assert {r.get_response().id for r in got} == {"s1"}


def test_a_streamed_request_counts_once_as_a_success(up: Server) -> None:
    def counts() -> tuple[int, int]:
        with grpcclient.InferenceServerClient(up.grpc) as client:
            stats = client.get_inference_statistics("repeat").model_stats[0].inference_stats
        return stats.success.count, stats.fail.count

    before = counts()
    _stream(up, [1, 2, 3], enable_empty_final_response=True)
    _stream(up, [4], parameters={"final": "together"})
    with httpx.stream("POST", f"http://{up.http}/v2/models/repeat/generate_stream", json={"IN": [5, 6]}) as response:
        assert len([line for line in response.iter_lines() if line]) == 2
    assert counts() == (before[0] + 3, before[1])  # none counted as cancelled when its reader stopped


def test_the_final_flag_rides_the_last_response_when_sent_with_it(up: Server) -> None:
    got = _stream(up, [1, 2], parameters={"final": "together"})
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [1, 2]


def test_a_decoupled_model_is_refused_on_model_infer(up: Server) -> None:
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    with grpcclient.InferenceServerClient(up.grpc) as client, pytest.raises(InferenceServerException) as caught:
        client.infer("repeat", inputs)
    assert caught.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    # Over HTTP, in the HTTP front's words, as Triton's.
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
    refused = httpx.post(f"http://{up.http}/v2/models/repeat/infer", json=body)
    assert (refused.status_code, refused.json()) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )


def test_a_decoupled_model_is_refused_over_http_before_its_body_is_read(up: Server) -> None:
    # As Triton's HTTP front: the transaction policy is checked before the body, so even
    # a malformed one answers that HTTP infer cannot serve the model.
    for body, headers in ((b"{not json", {}), (b"{}", {"Inference-Header-Content-Length": "99"})):
        refused = httpx.post(f"http://{up.http}/v2/models/repeat/infer", content=body, headers=headers)
        assert (refused.status_code, refused.json()) == (
            501,
            {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
        )


def test_a_decoupled_ensemble_streams_each_response_through_its_later_steps(up: Server) -> None:
    # As Triton: each response of the decoupled step, through the steps after it, is one
    # response of the ensemble, in order; an error response ends the stream there.
    got = stream_repeat(up.grpc, [3, 4, 5], model="tripled", enable_empty_final_response=True)
    answers = [r for r in got if r.get_response().outputs]
    assert [(int(r.as_numpy("TRIPLE")[0]), int(r.as_numpy("IDX")[0])) for r in answers] == [(9, 0), (12, 1), (15, 2)]
    assert {r.get_response().model_name for r in answers} == {"tripled"}
    assert got[-1].get_response().parameters["triton_final_response"].bool_param
    # The error in the middle, then as the step's last response: the answers of the
    # responses before it still come, then the error, then nothing (not even a final flag).
    for fail_at, answered in ((1, [3]), (2, [3, 6])):
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        inputs = [grpcclient.InferInput("IN", [3], "INT32")]
        inputs[0].set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
        with grpcclient.InferenceServerClient(up.grpc) as client:
            client.start_stream(callback=lambda result, error, into=answers: into.put((result, error)))
            parameters = {"fail_at": fail_at, "delay_ms": 50}  # answers made after the step's stream ended
            client.async_stream_infer("tripled", inputs, parameters=parameters, enable_empty_final_response=True)
            for expected in answered:
                result, error = answers.get(timeout=30)
                assert error is None and int(result.as_numpy("TRIPLE")[0]) == expected
            _, error = answers.get(timeout=30)
            assert error.message() == f"in ensemble 'tripled', no answer for {fail_at + 1}"
            with pytest.raises(queue.Empty):
                answers.get(timeout=2)
            client.stop_stream()


def test_a_decoupled_ensemble_is_decoupled_to_its_clients(up: Server) -> None:
    config = httpx.get(f"http://{up.http}/v2/models/tripled/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}
    plain = httpx.get(f"http://{up.http}/v2/models/mixed/config").json()
    assert plain["model_transaction_policy"] == {"decoupled": False}  # core sets it on every ensemble
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
    refused = httpx.post(f"http://{up.http}/v2/models/tripled/infer", json=body)
    assert (refused.status_code, refused.json()) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    with grpcclient.InferenceServerClient(up.grpc) as client, pytest.raises(InferenceServerException) as caught:
        client.infer("tripled", inputs)
    assert caught.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    events = []
    with httpx.stream("POST", f"http://{up.http}/v2/models/tripled/generate_stream", json={"IN": [2, 5]}) as response:
        assert response.status_code == 200
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
    assert [(event["TRIPLE"], event["IDX"]) for event in events] == [(6, 0), (15, 1)]


def test_generate_stream_sends_each_response_as_an_event(up: Server) -> None:
    events = []
    with httpx.stream("POST", f"http://{up.http}/v2/models/repeat/generate_stream", json={"IN": [3, 4, 5]}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    assert [(e["OUT"], e["IDX"]) for e in events] == [(3, 0), (4, 1), (5, 2)]
    assert {e["model_name"] for e in events} == {"repeat"}


def test_generate_answers_one_response_as_flat_json(up: Server) -> None:
    body = {"INPUT0": [1.0, 2.0, 3.0, 4.0], "INPUT1": [1.0, 1.0, 1.0, 1.0], "echo": "hi"}
    response = httpx.post(f"http://{up.http}/v2/models/add_sub/generate", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["OUTPUT0"] == [2.0, 3.0, 4.0, 5.0]
    assert answer["OUTPUT1"] == [0.0, 1.0, 2.0, 3.0]
    # Keys Triton's fronts would check or read (a timeout, a priority, a triton_ key) are the
    # model's own parameters in a generate body: Triton passes them as they are.
    plain = {**body, "timeout": "soon", "priority": 9, "triton_x": 1, "echo": "hi"}
    passed = httpx.post(f"http://{up.http}/v2/models/add_sub/generate", json=plain)
    assert passed.status_code == 200, passed.text
    assert passed.json()["echo"] == "hi"  # the model's response parameters sit beside its outputs
    refused = httpx.post(f"http://{up.http}/v2/models/repeat/generate", json={"IN": [1, 2]})
    assert refused.status_code == 200  # Triton's status for it: the error is the body of a 200
    assert refused.json() == {
        "error": "generate expects model to produce exactly 1 response, use generate stream for model that "
        "generates various number of responses"
    }


def test_an_error_response_mid_stream_is_passed_and_the_stream_goes_on(up: Server) -> None:
    # As Triton: the error reaches the client in-band, not final, and the responses after it follow.
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    inputs = [grpcclient.InferInput("IN", [3], "INT32")]
    inputs[0].set_data_from_numpy(np.array([5, 6, 7], dtype=np.int32))
    got: list[Any] = []
    with grpcclient.InferenceServerClient(up.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(
                "repeat", inputs, request_id="e1", parameters={"fail_at": 1}, enable_empty_final_response=True
            )
            while not got or got[-1] != "final":
                result, error = answers.get(timeout=30)
                if error is not None:
                    got.append(f"error: {error.message()}")
                    continue
                response = result.get_response()
                assert response.id == "e1"
                final = response.parameters["triton_final_response"].bool_param
                got.append("final" if final else int(result.as_numpy("OUT")[0]))
        finally:
            client.stop_stream()
    assert got == [5, "error: no answer for 6", 7, "final"]

    # The error message itself, as Triton words it: the request's model, version and id, not final.
    request = service_pb2.ModelInferRequest(model_name="repeat", model_version="1", id="e2")
    request.inputs.add(name="IN", datatype="INT32", shape=[2])
    request.raw_input_contents.append(np.array([5, 6], dtype=np.int32).tobytes())
    request.parameters["fail_at"].int64_param = 1
    with grpc.insecure_channel(up.grpc) as channel:
        messages = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request])))
    failed = messages[1]
    assert failed.error_message == "no answer for 6"
    assert (failed.infer_response.model_name, failed.infer_response.model_version) == ("repeat", "1")
    assert failed.infer_response.id == "e2"
    assert failed.infer_response.parameters["triton_final_response"].bool_param is False

    body = {"IN": [5, 6, 7], "fail_at": 1}
    with httpx.stream("POST", f"http://{up.http}/v2/models/repeat/generate_stream", json=body) as response:
        assert response.status_code == 200  # the first response is no error
        lines = [line for line in response.iter_lines() if line]
    assert lines == [
        'data: {"IDX":0,"OUT":5,"model_name":"repeat","model_version":"1"}',  # Triton's bytes, keys sorted
        'data: {"error":"no answer for 6"}',
        'data: {"IDX":2,"OUT":7,"model_name":"repeat","model_version":"1"}',
    ]

    refused = httpx.post(f"http://{up.http}/v2/models/repeat/generate", json={"IN": [6], "fail_at": 0})
    assert (refused.status_code, refused.json()) == (400, {"error": "no answer for 6"})
    # An error first, then an answer: the status of the error, and the body of too many answers.
    several = httpx.post(f"http://{up.http}/v2/models/repeat/generate", json={"IN": [6, 7], "fail_at": 0})
    assert several.status_code == 400
    assert several.json()["error"].startswith("generate expects model to produce exactly 1 response")
    with httpx.stream(
        "POST", f"http://{up.http}/v2/models/repeat/generate_stream", json={"IN": [6, 7], "fail_at": 0}
    ) as response:
        assert response.status_code == 400
        lines = [line for line in response.iter_lines() if line]
    assert lines == [
        'data: {"error":"no answer for 6"}',
        'data: {"IDX":1,"OUT":7,"model_name":"repeat","model_version":"1"}',
    ]


def test_generate_stream_reports_an_error_as_an_event(up: Server) -> None:
    body = {"IN": [7], "mode": "raise"}
    with httpx.stream("POST", f"http://{up.http}/v2/models/misbehaving/generate_stream", json=body) as response:
        status = response.status_code
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    [event] = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert event["error"].startswith("Failed to process the request(s) for model 'misbehaving_0_0'")
    assert status == 400  # Triton's: the first response sets the status, 400 when it is an error
    # Without the stream: the same error, with the same status.
    answer = httpx.post(f"http://{up.http}/v2/models/misbehaving/generate", json=body)
    assert (answer.status_code, answer.json()) == (400, event)


def test_a_traced_stream_request_to_a_decoupled_model_streams_too(tmp_path: Path) -> None:
    repo = write_python_models(write_repository(tmp_path / "repo", ("simple",)))
    tracing = ("--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", f"--trace-config=triton,file={tmp_path}/t")
    with turnout_up(repo, *tracing) as traced:
        got = _stream(traced, [2, 3], enable_empty_final_response=True)
    assert [int(r.as_numpy("OUT")[0]) for r in got[:2]] == [2, 3]
    assert len(got) == 3


def _stream_request(model: str, request_id: str, name: str = "IN", **parameters: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name=name, datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([1], dtype=np.int32).tobytes())
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    return request


def test_stream_errors_are_worded_as_triton_words_them(up: Server) -> None:
    # As Triton 2.51: the model's error response names the model and is final; a request
    # refused before it ran carries its id alone.
    requests = [
        _stream_request("misbehaving", "answered", mode="error"),
        _stream_request("misbehaving", "refused", name="WRONG"),
        _stream_request("nope", "unknown"),
    ]
    with grpc.insecure_channel(up.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        messages = {m.infer_response.id: m for m in stub.ModelStreamInfer(iter(requests))}
        answered = messages["answered"]
        assert answered.error_message == "bad input on purpose"
        assert answered.infer_response.model_name == "misbehaving"
        assert answered.infer_response.parameters["triton_final_response"].bool_param is True
        for refused, text in (("refused", "unexpected inference input 'WRONG'"), ("unknown", "unknown model")):
            assert text in messages[refused].error_message
            assert messages[refused].infer_response == service_pb2.ModelInferResponse(id=refused)
        # On ModelInfer the error reaches the client as Triton's status and text alone.
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(_stream_request("misbehaving", "unary", mode="error"))
        assert caught.value.details() == "bad input on purpose"
        assert not [key for key, _ in caught.value.trailing_metadata() or () if key.startswith("turnout")]
