"""Streams from python models under `turnout up`: a decoupled model's responses over
gRPC ModelStreamInfer (tritonclient's stream) and over HTTP through the generate extension
(generate_stream read as server-sent events with a plain HTTP client)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.python_models import stream_repeat, write_python_models
from tests.harness import Server, turnout_up, write_repository


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_python_streams"), ("simple",))
    with turnout_up(write_python_models(repo)) as running:
        yield running


def test_generate_refuses_what_it_cannot_take(up: Server) -> None:
    not_an_object = httpx.post(f"http://{up.http}/v2/models/add_sub/generate", json=[1, 2])
    assert not_an_object.status_code == 400
    assert not_an_object.json()["error"] == "generate request body must be a JSON object"
    unknown = httpx.post(f"http://{up.http}/v2/models/nope/generate", json={"IN": [1]})
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["error"]


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


def test_the_final_flag_rides_the_last_response_when_sent_with_it(up: Server) -> None:
    got = _stream(up, [1, 2], parameters={"final": "together"})
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [1, 2]


def test_a_decoupled_model_is_refused_on_model_infer(up: Server) -> None:
    inputs = [grpcclient.InferInput("IN", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    with grpcclient.InferenceServerClient(up.grpc) as client, pytest.raises(InferenceServerException) as caught:
        client.infer("repeat", inputs)
    assert caught.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


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
    refused = httpx.post(f"http://{up.http}/v2/models/repeat/generate", json={"IN": [1, 2]})
    assert refused.status_code == 400
    assert "use generate_stream" in refused.json()["error"]


def test_generate_stream_reports_an_error_as_an_event(up: Server) -> None:
    body = {"IN": [7], "mode": "raise"}
    with httpx.stream("POST", f"http://{up.http}/v2/models/misbehaving/generate_stream", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    [event] = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert event["error"].startswith("Failed to process the request(s) for model 'misbehaving_0_0'")


def test_a_traced_stream_request_to_a_decoupled_model_streams_too(tmp_path: Path) -> None:
    repo = write_python_models(write_repository(tmp_path / "repo", ("simple",)))
    tracing = ("--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", f"--trace-config=triton,file={tmp_path}/t")
    with turnout_up(repo, *tracing) as traced:
        got = _stream(traced, [2, 3], enable_empty_final_response=True)
    assert [int(r.as_numpy("OUT")[0]) for r in got[:2]] == [2, 3]
    assert len(got) == 3
