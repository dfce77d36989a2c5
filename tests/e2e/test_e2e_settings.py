"""Trace and log settings through both protocols, and the Prometheus endpoint."""

from __future__ import annotations

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import http_inputs, simple_arrays
from tests.harness import Server

TRACE_DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
LOG_DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def test_http_trace_settings(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        assert client.get_trace_settings() == TRACE_DEFAULTS
        assert client.get_trace_settings(model_name="simple") == TRACE_DEFAULTS
        updated = client.update_trace_settings(model_name="simple", settings={"trace_rate": "5"})
        assert updated == {**TRACE_DEFAULTS, "trace_rate": "5"}
        assert client.get_trace_settings(model_name="simple")["trace_rate"] == "5"
        # The global settings and other models are untouched.
        assert client.get_trace_settings()["trace_rate"] == "1000"
        assert client.get_trace_settings(model_name="linear")["trace_rate"] == "1000"
        cleared = client.update_trace_settings(model_name="simple", settings={"trace_rate": None})
        assert cleared == TRACE_DEFAULTS
        assert client.get_trace_settings(model_name="simple") == TRACE_DEFAULTS


def test_grpc_trace_settings(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        settings = client.get_trace_settings(model_name="simple_string", as_json=True)["settings"]
        assert {k: v.get("value", []) for k, v in settings.items()} == {
            k: v if isinstance(v, list) else [v] for k, v in TRACE_DEFAULTS.items()
        }
        updated = client.update_trace_settings(model_name="simple_string", settings={"trace_count": "7"})
        assert list(updated.settings["trace_count"].value) == ["7"]
        cleared = client.update_trace_settings(model_name="simple_string", settings={"trace_count": None})
        assert list(cleared.settings["trace_count"].value) == ["-1"]


def test_http_log_settings(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        assert client.get_log_settings() == LOG_DEFAULTS
        try:
            updated = client.update_log_settings({"log_verbose_level": 1, "log_info": False})
            assert updated == {**LOG_DEFAULTS, "log_verbose_level": 1, "log_info": False}
            assert client.get_log_settings()["log_verbose_level"] == 1
        finally:
            restored = client.update_log_settings({"log_verbose_level": 0, "log_info": True})
        assert restored == LOG_DEFAULTS


def test_grpc_log_settings(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        settings = client.get_log_settings().settings
        assert settings["log_file"].string_param == ""
        assert settings["log_info"].bool_param is True
        assert settings["log_verbose_level"].uint32_param == 0
        assert settings["log_format"].string_param == "default"
        try:
            updated = client.update_log_settings({"log_verbose_level": 2}).settings
            assert updated["log_verbose_level"].uint32_param == 2
        finally:
            client.update_log_settings({"log_verbose_level": 0})
        assert client.get_log_settings().settings["log_verbose_level"].uint32_param == 0


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b"", 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
        (b'{"trace_file": null}', 501, "trace file location can not be updated through network protocol"),
        (b'{"trace_level": "TIMESTAMPS"}', 500, "attempt to access JSON non-array as array"),
        (b'{"trace_level": [1]}', 500, "attempt to access JSON non-string as string"),
        (b'{"trace_rate": "abc", "trace_count": 5}', 400, "Unable to parse 'trace_rate', got: abc"),
        (b'{"trace_count": "-5"}', 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-5"),
        (
            b'{"trace_count": "99999999999"}',
            400,
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 99999999999",
        ),
    ],
)
def test_http_trace_updates_are_refused_as_triton_refuses_them(
    server: Server, body: bytes, status: int, text: str
) -> None:
    """Triton 2.51's statuses and words (checked side by side), and nothing changes."""
    answer = httpx.post(f"http://{server.http}/v2/trace/setting", content=body, timeout=10)
    assert (answer.status_code, answer.json()) == (status, {"error": text})
    assert httpx.get(f"http://{server.http}/v2/trace/setting", timeout=10).json() == TRACE_DEFAULTS


def test_trace_updates_pass_over_what_triton_does_not_know(server: Server) -> None:
    """Unknown names and levels are ignored, numbers read as std::stoi reads them."""
    url = f"http://{server.http}/v2/trace/setting"
    try:
        answer = httpx.post(url, json={"trace_level": ["LOUD"], "trace_mode": "x", "trace_rate": " 7xyz"}, timeout=10)
        assert (answer.status_code, answer.json()) == (200, {**TRACE_DEFAULTS, "trace_rate": "7"})
        answer = httpx.post(url, json={"log_frequency": "-1"}, timeout=10)
        assert answer.json()["log_frequency"] == "4294967295"  # an int in Triton's uint32
    finally:
        httpx.post(url, json={"trace_rate": None, "log_frequency": None}, timeout=10)
    assert httpx.get(url, timeout=10).json() == TRACE_DEFAULTS


def test_trace_settings_of_a_model_that_is_not_ready_are_refused(server: Server) -> None:
    text = "Request for unknown model : nope"
    answer = httpx.post(f"http://{server.http}/v2/models/nope/trace/setting", json={"trace_level": 5}, timeout=10)
    assert (answer.status_code, answer.json()) == (400, {"error": text})  # before the body is read
    with grpcclient.InferenceServerClient(server.grpc) as client, pytest.raises(InferenceServerException) as refused:
        client.get_trace_settings(model_name="nope")
    assert (refused.value.status(), refused.value.message()) == ("StatusCode.INVALID_ARGUMENT", text)


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"log_file": "/tmp/x.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "yes"}, 500, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 1}, 500, "attempt to access JSON non-string as string"),
        ({"log_format": "xml"}, 503, "invalid argument for --log_format, got: xml"),
    ],
)
def test_http_log_updates_are_refused_as_triton_refuses_them(
    server: Server, body: dict, status: int, text: str
) -> None:
    """Triton 2.51's statuses and words, and the refused update changes nothing."""
    answer = httpx.post(f"http://{server.http}/v2/logging", json={"log_verbose_level": 3, **body}, timeout=10)
    assert (answer.status_code, answer.json()) == (status, {"error": text})
    assert httpx.get(f"http://{server.http}/v2/logging", timeout=10).json() == LOG_DEFAULTS


def test_http_log_update_skips_nulls_and_names_it_does_not_know(server: Server) -> None:
    answer = httpx.post(f"http://{server.http}/v2/logging", json={"log_info": None, "log_other": 5}, timeout=10)
    assert (answer.status_code, answer.json()) == (200, LOG_DEFAULTS)


@pytest.mark.parametrize(
    ("settings", "code", "text"),
    [
        ({"log_file": ""}, "UNIMPLEMENTED", "log file location can not be updated through network protocol"),
        # tritonclient sends None as a setting with no value in it
        ({"log_info": None}, "INVALID_ARGUMENT", "expect boolean for 'log_info'"),
        ({"log_verbose_level": None}, "INVALID_ARGUMENT", "expect int32 for 'log_verbose_level'"),
        ({"log_format": None}, "INVALID_ARGUMENT", "expect string for 'log_format'"),
        ({"log_format": "xml"}, "INVALID_ARGUMENT", "invalid argument for log_format, got: xml"),
    ],
)
def test_grpc_log_updates_are_refused_as_triton_refuses_them(
    server: Server, settings: dict, code: str, text: str
) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.update_log_settings({"log_verbose_level": 3, **settings})
        assert (refused.value.status(), refused.value.message()) == (f"StatusCode.{code}", text)
        assert client.get_log_settings().settings["log_verbose_level"].uint32_param == 0


async def test_aio_settings(server: Server) -> None:
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert (await http.get_log_settings())["log_format"] == "default"
        assert (await http.get_trace_settings())["trace_mode"] == "triton"
        assert (await rpc.get_log_settings()).settings["log_error"].bool_param is True
        assert list((await rpc.get_trace_settings()).settings["trace_level"].value) == ["OFF"]
    finally:
        await http.close()
        await rpc.close()


def test_metrics_endpoint(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        client.infer("simple", http_inputs(*simple_arrays()))
    response = httpx.get(f"http://{server.metrics}/metrics", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"  # as Triton 2.51
    text = response.text
    for family in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert f"# TYPE {family} counter" in text
    lines = [line for line in text.splitlines() if line.startswith("nv_inference_request_success{")]
    simple = [line for line in lines if 'model="simple"' in line and 'version="1"' in line]
    assert simple, lines
    assert float(simple[0].rsplit(" ", 1)[1]) >= 1
    assert httpx.get(f"http://{server.metrics}/metrics/", timeout=30).status_code == 200
