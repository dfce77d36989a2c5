"""Logs at the default level: a failing request is logged by the gateway and by the
sidecar under one request id (the gateway's own when the client sent none), and
`--log-file` sends both processes' lines to a file that, as in Triton, no client can move."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import Server, eventually, turnout_up, write_repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("repo_logs"), ("simple",))


def _fail(server: Server, request_id: str = "") -> None:
    """An inference the sidecar rejects: FP32 inputs where `simple` takes INT32."""
    data = np.zeros((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    with (
        httpclient.InferenceServerClient(server.http) as client,
        pytest.raises(InferenceServerException, match="data-type"),
    ):
        client.infer("simple", inputs, request_id=request_id)


def test_a_failing_request_is_logged_in_both_processes_under_one_id(repo: Path) -> None:
    with turnout_up(repo, "--log-format=json") as server:
        _fail(server)  # no client id: the gateway's own

        def failures() -> dict[str, set[str]]:
            ids: dict[str, set[str]] = {}
            for document in server.json_lines():
                if "infer failed" in str(document.get("message")) and document.get("request_id"):
                    process = str(document.get("logger")).split(".")[0]
                    ids.setdefault(process, set()).add(str(document["request_id"]))
            return ids

        assert eventually(lambda: {"gateway", "sidecars"} <= failures().keys()), server.output()[-3000:]
        found = failures()
        assert found["gateway"] == found["sidecars"], found
        assert all(d["level"] in ("INFO", "WARNING") for d in server.json_lines() if d.get("request_id"))


def test_log_file_takes_both_processes_lines_and_no_client_moves_it(repo: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"

    def both_wrote(path: Path, request_id: str) -> bool:
        text = path.read_text() if path.exists() else ""
        lines = [line for line in text.splitlines() if f"[request id: {request_id}]" in line]
        return any(" gateway." in line for line in lines) and any(" sidecars." in line for line in lines)

    with turnout_up(repo, f"--log-file={first}") as server:
        _fail(server, "to-first")
        assert eventually(lambda: both_wrote(first, "to-first")), first.read_text()[-2000:]
        assert not any("to-first" in line for line in server.lines)

        fixed = "log file location can not be updated through network protocol"
        with httpclient.InferenceServerClient(server.http) as client:
            with pytest.raises(InferenceServerException, match=fixed) as refused:
                client.update_log_settings({"log_file": str(second), "log_verbose_level": 1})
            assert refused.value.status() == "501"
            after = client.get_log_settings()
            assert (after["log_file"], after["log_verbose_level"]) == (str(first), 0)  # nothing of it applied
            assert client.update_log_settings({"log_file": None})["log_file"] == str(first)  # null: no change
        with grpcclient.InferenceServerClient(server.grpc) as rpc:
            with pytest.raises(InferenceServerException, match=fixed) as refused:
                rpc.update_log_settings({"log_file": ""})
            assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
        _fail(server, "still-first")
        assert eventually(lambda: both_wrote(first, "still-first")), first.read_text()[-2000:]
        assert not second.exists()


def test_the_supervisors_lines_take_the_chosen_format_and_scrapes_log_nothing(repo: Path) -> None:
    with turnout_up(repo, "--log-format=json") as server:
        for _ in range(3):
            with httpclient.InferenceServerClient(server.http) as client:
                assert client.is_server_ready()
            httpx.get(f"http://{server.metrics}/metrics", timeout=10).raise_for_status()
        supervisor = [d for d in server.json_lines() if d.get("logger") == "turnout.supervisor"]
        assert any("onnxruntime sidecar ready on" in str(d["message"]) for d in supervisor), server.output()[-2000:]
        # The metrics port scrapes every sidecar over HTTP: at the default level that is silent.
        assert not any(str(d.get("logger", "")).startswith("httpx") for d in server.json_lines())
        assert not any("HTTP Request:" in line for line in server.lines)


def test_each_sidecar_prints_tritons_model_table_before_it_is_ready(tmp_path: Path) -> None:
    repo = write_repository(tmp_path, ("simple", "identity_fp32"))
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with turnout_up(repo, "--exit-on-error=false") as server:
        output = server.output()
    table = [line for line in output.splitlines() if line.startswith(("+-", "| "))]
    assert re.search(r"^\| Model +\| Version +\| Status +\|$", "\n".join(table), re.M), output[-3000:]
    assert any(re.fullmatch(r"\| simple +\| 1 +\| READY +\|", line) for line in table), table
    assert any(re.fullmatch(r"\| broken +\| 1 +\| UNAVAILABLE: .+\|", line) for line in table), table
    assert output.index("| simple") < output.index("TURNOUT_READY")
