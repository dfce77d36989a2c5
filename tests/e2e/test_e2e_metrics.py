"""Triton's metrics on a sidecar's own port and on the gateway's, summed across replicas;
failure reasons, histograms, request ids in both processes' logs, live log levels."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from protos.ready import GATEWAY_READY, SIDECAR_READY, parse_ready
from tests.e2e.simple_requests import grpc_inputs, http_inputs, simple_arrays
from tests.harness import ROOT, Server, eventually, turnout_up, write_repository

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

TRITON_FAMILIES = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
    "nv_model_load_duration_secs",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
)


def scrape(address: str) -> tuple[dict[str, str], Samples]:
    """Family types by name, and every sample by (name, sorted labels)."""
    text = httpx.get(f"http://{address}/metrics", timeout=30).text
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            # The parser adds `_total` to counter samples; Triton's names are bare.
            name = family.name if family.type == "counter" else sample.name
            samples[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return types, samples


def value(samples: Samples, name: str, model: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model": model, "version": "1", **labels}.items())))
    return samples.get(key, 0.0)


def write_mismatch(repo: Path) -> None:
    """`mismatch`: OUT = A + B over two independent dynamic dims, so unequal lengths pass
    validation and fail inside ONNX Runtime (a BACKEND failure)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["OUT"])],
        "mismatch",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["a"]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, ["b"]),
        ],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["c"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "mismatch" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "mismatch" / "1" / "model.onnx"))
    config = 'name: "mismatch"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    config += (
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    config += 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    (repo / "mismatch" / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_repository(
        tmp_path_factory.mktemp("repo_metrics"), ("simple", "simple_batched", "simple_queue", "simple_timeout")
    )
    write_mismatch(path)
    return path


@pytest.fixture(scope="module")
def verbose_server(repo: Path) -> Iterator[Server]:
    with turnout_up(repo, "--log-verbose=1", "--log-format=json") as running:
        yield running


@contextlib.contextmanager
def _ready_process(command: list[str], ready_prefix: str) -> Iterator[dict[str, str]]:
    """Run `command`; yield the fields of its ready line, then SIGTERM it (killed after 15 s)."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert process.stdout is not None
    try:
        for line in process.stdout:
            fields = parse_ready(line, ready_prefix)
            if fields is not None:
                yield fields
                break
        else:
            raise AssertionError(f"{command[2]} exited with {process.wait()} before it was ready")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def sidecar(repo: Path) -> contextlib.AbstractContextManager[dict[str, str]]:
    """One `python -m sidecars` process; yields the fields of its ready line."""
    command = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repo}"]
    command += ["--metrics-port=0", "--lane=tcp", "--exit-timeout-secs=2"]
    return _ready_process(command, SIDECAR_READY)


def gateway(*specs: str) -> contextlib.AbstractContextManager[dict[str, str]]:
    """`turnout gateway` routing to the given sidecars; yields its ready line's fields."""
    command = [sys.executable, "-m", "turnout", "gateway", "--host=127.0.0.1", "--http-port=0", "--grpc-port=0"]
    command += ["--metrics-port=0", "--exit-timeout-secs=2", *(f"--sidecar={s}" for s in specs)]
    return _ready_process(command, GATEWAY_READY)


def infer_simple(url: str, model: str = "simple", request_id: str = "") -> None:
    with grpcclient.InferenceServerClient(url) as client:
        client.infer(model, grpc_inputs(*simple_arrays()), request_id=request_id)


def test_sidecar_metrics_port_and_fleet_sum(repo: Path) -> None:
    with sidecar(repo) as one, sidecar(repo) as two:
        assert one["metrics"] != "off"
        types, before = scrape(one["metrics"])
        for family in TRITON_FAMILIES:
            assert family in types, family
        assert types["nv_inference_request_success"] == "counter"
        assert types["nv_inference_pending_request_count"] == "gauge"
        assert value(before, "nv_model_load_duration_secs", "simple") > 0
        specs = [f"onnxruntime={s['grpc']},{s['lane']},{s['metrics']}" for s in (one, two)]
        with gateway(*specs) as front:
            for _ in range(6):
                infer_simple(front["grpc"])
            _, own = scrape(one["metrics"])
            _, other = scrape(two["metrics"])
            _, fleet = scrape(front["metrics"])
            with grpcclient.InferenceServerClient(front["grpc"]) as client:
                stats = client.get_inference_statistics("simple").model_stats
        mine = value(own, "nv_inference_request_success", "simple")
        theirs = value(other, "nv_inference_request_success", "simple")
        assert mine + theirs == 6
        assert value(fleet, "nv_inference_request_success", "simple") == 6
        assert value(fleet, "nv_inference_count", "simple") == 6
        assert value(fleet, "nv_inference_request_duration_us", "simple") > 0
        # The statistics extension sums the replicas too: one entry, all six requests.
        assert len(stats) == 1
        assert stats[0].inference_stats.success.count == 6
        assert stats[0].inference_count == 6
        # The gateway's own histogram per model, version and protocol.
        histogram = ("turnout_gateway_request_duration_seconds_count", (("model", "simple"), ("protocol", "grpc")))
        counts = [
            v
            for (name, labels), v in fleet.items()
            if (name, tuple(pair for pair in labels if pair[0] != "version")) == histogram
        ]
        assert sum(counts) == 6


def test_the_metrics_port_answers_as_triton_s(server: Server) -> None:
    # Each answer as Triton 2.51's metrics port gave it: HTTP/1.1, no Server (Python's
    # would name its version) or Date header, any other path answered empty, any other
    # method refused with 405.
    with httpx.Client(base_url=f"http://{server.metrics}") as client:
        for path in ("/metrics", "/metrics/", "/metrics"):  # one connection, kept
            response = client.get(path)
            assert (response.status_code, response.http_version) == (200, "HTTP/1.1")
            assert response.headers["content-type"] == "text/plain; charset=utf-8"
            assert "server" not in response.headers and "date" not in response.headers
            assert "nv_inference_request_success" in response.text
        response = client.get("/nope")
        assert (response.status_code, response.content) == (200, b"")
        for method in ("POST", "PUT", "DELETE"):
            response = client.request(method, "/metrics")
            assert (response.status_code, response.content) == (405, b'{"error":"Method Not Allowed"}')
        assert client.head("/metrics").status_code == 405
        assert client.get("/metrics").status_code == 200  # the connection still serves


def test_failure_reasons(verbose_server: Server) -> None:
    failure = "nv_inference_request_failure"
    _, before = scrape(verbose_server.metrics)
    with grpcclient.InferenceServerClient(verbose_server.grpc) as client:
        # Refused before it runs (a wrong shape): no model saw it, and Triton counts it nowhere.
        bad = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.int32))
        other = grpcclient.InferInput("INPUT1", [1, 3], "INT32")
        other.set_data_from_numpy(np.zeros((1, 3), dtype=np.int32))
        with pytest.raises(InferenceServerException):
            client.infer("simple", [bad, other])
        refused = client.get_inference_statistics("simple").model_stats[0].inference_stats.fail.count
        # BACKEND: ONNX Runtime cannot add 3 values to 5.
        a = grpcclient.InferInput("A", [3], "FP32")
        a.set_data_from_numpy(np.zeros(3, dtype=np.float32))
        b = grpcclient.InferInput("B", [5], "FP32")
        b.set_data_from_numpy(np.zeros(5, dtype=np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("mismatch", [a, b])
    # A full queue refuses as the request arrives: not counted either. simple_queue holds
    # one request a second and queues at most one more.
    errors: list[Exception] = []

    def send(model: str) -> None:
        try:
            infer_simple(verbose_server.grpc, model)
        except InferenceServerException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=("simple_queue",)) for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    assert any("Exceeds maximum queue size" in str(e) for e in errors)
    # REJECTED: a request whose queue timeout passes while it waits (simple_timeout).
    send("simple_timeout")
    assert "Request timeout expired" in str(errors[-1])
    _, samples = scrape(verbose_server.metrics)
    assert value(samples, failure, "simple", reason="OTHER") == value(before, failure, "simple", reason="OTHER")
    assert refused == sum(
        value(samples, failure, "simple", reason=r) for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    )
    assert value(samples, failure, "mismatch", reason="BACKEND") == 1
    assert value(samples, failure, "simple_queue", reason="REJECTED") == 0
    assert value(samples, failure, "simple_timeout", reason="REJECTED") == 1
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert (failure, (("model", "simple"), ("reason", reason), ("version", "1"))) in samples


def test_batch_size_histogram_and_pending(verbose_server: Server) -> None:
    _, before = scrape(verbose_server.metrics)
    threads = [threading.Thread(target=infer_simple, args=(verbose_server.grpc, "simple_batched")) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _, after = scrape(verbose_server.metrics)
    count = "turnout_sidecar_batch_size_count"
    rows = "turnout_sidecar_batch_size_sum"
    assert value(after, rows, "simple_batched") - value(before, rows, "simple_batched") == 8
    executions = value(after, count, "simple_batched") - value(before, count, "simple_batched")
    assert 1 <= executions < 8  # the dynamic batcher formed batches
    assert value(after, "nv_inference_exec_count", "simple_batched") == value(after, count, "simple_batched")
    assert value(after, "nv_inference_pending_request_count", "simple_batched") == 0
    assert value(after, "turnout_sidecar_queue_depth", "simple_batched") == 0


def test_request_id_in_both_processes_json_logs(verbose_server: Server) -> None:
    infer_simple(verbose_server.grpc, request_id="trace-me-42")
    with httpclient.InferenceServerClient(verbose_server.http) as client:
        client.infer("simple", http_inputs(*simple_arrays()))  # no id: the gateway makes one

    def both() -> bool:
        loggers = {
            str(d.get("logger", "")).split(".")[0]
            for d in verbose_server.json_lines()
            if d.get("request_id") == "trace-me-42"
        }
        return {"gateway", "sidecars"} <= loggers

    assert eventually(both), verbose_server.output()[-3000:]
    generated = [d for d in verbose_server.json_lines() if str(d.get("logger", "")).startswith("gateway.core")]
    ids = {str(d["request_id"]) for d in generated if d.get("request_id") and d["request_id"] != "trace-me-42"}
    assert ids
    sidecar_ids = {
        str(d.get("request_id")) for d in verbose_server.json_lines() if str(d.get("logger", "")).startswith("sidecars")
    }
    assert ids & sidecar_ids  # the generated id reached the sidecar too
    for document in verbose_server.json_lines():
        assert {"time", "level", "logger", "message"} <= document.keys()


def test_log_level_changes_live(repo: Path) -> None:
    with turnout_up(repo) as server:
        infer_simple(server.grpc, request_id="quiet-1")
        with httpclient.InferenceServerClient(server.http) as client:
            settings = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
            assert settings["log_verbose_level"] == 1
            infer_simple(server.grpc, request_id="loud-1")
            assert eventually(lambda: sum("[request id: loud-1]" in line for line in server.lines) >= 2)
            assert not any("quiet-1" in line for line in server.lines)
            client.update_log_settings({"log_verbose_level": 0})
            infer_simple(server.grpc, request_id="quiet-2")
        time.sleep(0.5)
        assert not any("quiet-2" in line for line in server.lines)
        with pytest.raises(InferenceServerException), httpclient.InferenceServerClient(server.http) as client:
            client.update_log_settings({"log_format": "xml"})
