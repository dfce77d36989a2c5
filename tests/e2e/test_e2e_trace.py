"""Triton's trace extension on a real `turnout up`: trace files as Triton writes them,
sampling by rate, count and per-model settings, and OpenTelemetry spans received by a
real OTLP/HTTP receiver process, with the client's traceparent honoured."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.otlp_receiver import READY
from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import ROOT, eventually, make_models, pump_lines, terminate, turnout_up, write_repository

TRACING_ON = ("--trace-config=level=TIMESTAMPS", "--trace-config=rate=1")
HTTP_ORDER = [
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
    "INFER_RESPONSE_COMPLETE",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
]
GRPC_ORDER = [
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    *HTTP_ORDER[2:-3],
    "INFER_RESPONSE_COMPLETE",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
]


def traces_in(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The traces of a trace file by request id: the record naming the model, and the
    timestamps in the order the file holds them."""
    by_id: dict[int, dict[str, Any]] = {}
    for record in records:
        trace = by_id.setdefault(record["id"], {"timestamps": []})
        if "timestamps" in record:
            assert len(record["timestamps"]) == 1  # one object per timestamp, as Triton writes them
            trace["timestamps"] += [(t["name"], t["ns"]) for t in record["timestamps"]]
        else:
            trace["head"] = record
    return {trace["head"].get("request_id", ""): trace for trace in by_id.values()}


def assert_well_ordered(trace: dict[str, Any], names: list[str]) -> None:
    stamps = trace["timestamps"]
    assert [name for name, _ in stamps] == names
    times = [ns for _, ns in stamps]
    assert times == sorted(times), stamps  # monotonic, in Triton's order
    at = dict(stamps)
    # The sidecar's queue and compute lie inside the gateway's request.
    assert at["REQUEST_START"] <= at["QUEUE_START"] <= at["COMPUTE_START"] <= at["COMPUTE_END"] <= at["REQUEST_END"]


def no_trace_parameter(parameters: Any) -> bool:
    return "turnout_trace" not in (parameters or {})


def test_trace_file_over_http_and_grpc_with_per_model_settings(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple", "simple_stats"))
    path = tmp_path / "trace.json"
    a, b = simple_arrays()
    with turnout_up(repo, f"--trace-config=triton,file={path}", *TRACING_ON) as server:
        with httpclient.InferenceServerClient(server.http) as client:
            assert client.get_trace_settings()["trace_file"] == str(path)
            result = client.infer("simple", http_inputs(a, b), request_id="http-1")
            check_simple(result, a, b)
            assert no_trace_parameter(result.get_response().get("parameters"))
            # A model's own setting: stats off while the global setting traces everything.
            client.update_trace_settings(model_name="simple_stats", settings={"trace_level": ["OFF"]})
            client.infer("simple_stats", http_inputs(a, b), request_id="stats-off")
            client.infer("simple", http_inputs(a, b), request_id="http-2")
        with grpcclient.InferenceServerClient(server.grpc) as client:
            result = client.infer("simple", grpc_inputs(a, b), request_id="grpc-1")
            check_simple(result, a, b)
            assert no_trace_parameter(result.get_response().parameters)
            # And the other way round: tracing off, but on for one model.
            client.update_trace_settings(settings={"trace_level": ["OFF"]})
            client.update_trace_settings(model_name="simple_stats", settings={"trace_level": ["TIMESTAMPS"]})
            client.infer("simple", grpc_inputs(a, b), request_id="simple-off")
            client.infer("simple_stats", grpc_inputs(a, b), request_id="stats-on")
        # The update that turned the global setting off wrote its traces: the file is
        # valid JSON while the server runs.
        assert eventually(lambda: path.exists() and len(traces_in(json.loads(path.read_text()))) == 3)
    traces = traces_in(json.loads(path.read_text()))
    assert sorted(traces) == ["grpc-1", "http-1", "http-2", "stats-on"]
    for request_id in ("http-1", "http-2"):
        assert traces[request_id]["head"]["model_name"] == "simple"
        assert traces[request_id]["head"]["model_version"] == 1
        assert_well_ordered(traces[request_id], HTTP_ORDER)
    assert_well_ordered(traces["grpc-1"], GRPC_ORDER)
    assert traces["stats-on"]["head"]["model_name"] == "simple_stats"
    assert_well_ordered(traces["stats-on"], GRPC_ORDER)
    ids = [trace["head"]["id"] for trace in traces.values()]
    assert len(set(ids)) == len(ids)


def test_rate_count_and_log_frequency(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    path = tmp_path / "trace.json"
    flags = (
        f"--trace-config=triton,file={path}",
        "--trace-config=triton,log-frequency=2",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=2",
        "--trace-config=count=3",
    )
    a, b = simple_arrays()
    with turnout_up(repo, *flags) as server, httpclient.InferenceServerClient(server.http) as client:
        for n in range(1, 11):
            client.infer("simple", http_inputs(a, b), request_id=f"r{n}")
        # Every 2nd request, 3 of them: two fill the first indexed file, and the third,
        # which spends the count, is written at once in the next.
        first, second = Path(f"{path}.0"), Path(f"{path}.1")
        assert eventually(lambda: first.exists() and second.exists())
        assert client.get_trace_settings()["trace_count"] == "0"
    assert sorted(traces_in(json.loads(first.read_text()))) == ["r2", "r4"]
    assert sorted(traces_in(json.loads(second.read_text()))) == ["r6"]
    assert not path.exists() and not Path(f"{path}.2").exists()


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[int, queue.Queue[str | None]]]:
    """A receiver process; yields its port and the queue of its span lines."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.otlp_receiver"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    sink: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=pump_lines, args=(process.stdout, sink, lines), daemon=True)
    pump.start()
    try:
        ready = sink.get(timeout=30)
        assert ready is not None and ready.startswith(READY), lines
        yield int(ready.split("port=")[1]), sink
    finally:
        terminate(process, 5)
        pump.join(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


def collect_spans(sink: queue.Queue[str | None], count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(spans) < count and time.monotonic() < deadline:
        try:
            line = sink.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:
            break
        spans.append(json.loads(line))
    return spans


HTTP_PARENT = ("0af7651916cd43dd8448eb211c12666c", "b7ad6b7169242424")
GRPC_PARENT = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def traceparent(ids: tuple[str, str]) -> str:
    return f"00-{ids[0]}-{ids[1]}-01"


def check_trace(spans: list[dict[str, Any]], parent: tuple[str, str], front: str, request_id: str) -> None:
    mine = [span for span in spans if span["trace_id"] == parent[0]]  # the client's trace id honoured
    by_name = {span["name"]: span for span in mine}
    assert sorted(by_name) == ["InferRequest", "compute", "queue", "sidecar", "simple"], mine
    root, model = by_name["InferRequest"], by_name["simple"]
    sidecar, queued, compute = by_name["sidecar"], by_name["queue"], by_name["compute"]
    assert root["parent_span_id"] == parent[1]
    assert model["parent_span_id"] == root["span_id"]
    assert sidecar["parent_span_id"] == model["span_id"]
    assert queued["parent_span_id"] == sidecar["span_id"] == compute["parent_span_id"]
    assert [e["name"] for e in root["events"]] == [
        f"{front}_{'RECV' if front == 'HTTP' else 'WAITREAD'}_START",
        f"{front}_{'RECV' if front == 'HTTP' else 'WAITREAD'}_END",
        "INFER_RESPONSE_COMPLETE",
        f"{front}_SEND_START",
        f"{front}_SEND_END",
    ]
    assert [e["name"] for e in model["events"]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e["name"] for e in compute["events"]] == [
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
    ]
    assert model["attributes"]["triton.model_name"] == "simple"
    assert model["attributes"]["triton.model_version"] == 1
    assert model["attributes"]["triton.request_id"] == request_id
    # Each child lies inside its parent, in time.
    for outer, inner in ((root, model), (model, sidecar), (sidecar, queued), (sidecar, compute)):
        assert outer["start"] <= inner["start"] <= inner["end"] <= outer["end"], (outer["name"], inner["name"])
    assert queued["end"] == compute["start"]
    assert root["resource"]["service.name"] == "turnout-test"


def test_opentelemetry_spans_with_the_clients_context(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    a, b = simple_arrays()
    with otlp_receiver() as (port, sink):
        flags = (
            "--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url=http://127.0.0.1:{port}/v1/traces",
            "--trace-config=opentelemetry,resource=service.name=turnout-test",
            "--trace-config=opentelemetry,bsp_schedule_delay=50",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=1000",  # a propagated context is traced whatever the rate
            "--log-verbose=1",
        )
        with turnout_up(repo, *flags) as server:
            with httpclient.InferenceServerClient(server.http) as client:
                settings = client.get_trace_settings()
                assert settings["trace_mode"] == "opentelemetry"
                assert settings["url"] == f"http://127.0.0.1:{port}/v1/traces"
                headers = {"traceparent": traceparent(HTTP_PARENT)}
                result = client.infer("simple", http_inputs(a, b), request_id="otel-http", headers=headers)
                check_simple(result, a, b)
            with grpcclient.InferenceServerClient(server.grpc) as client:
                headers = {"traceparent": traceparent(GRPC_PARENT)}
                result = client.infer("simple", grpc_inputs(a, b), request_id="otel-grpc", headers=headers)
                check_simple(result, a, b)
                assert no_trace_parameter(result.get_response().parameters)
            spans = collect_spans(sink, 10)
            # The sidecar was told the context of the gateway's model span.
            assert f"traceparent '00-{HTTP_PARENT[0]}-" in server.output()
    check_trace(spans, HTTP_PARENT, "HTTP", "otel-http")
    check_trace(spans, GRPC_PARENT, "GRPC", "otel-grpc")


def test_ensemble_steps_and_stream_requests(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    pair = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    chain = [
        ("simple", -1, pair, {"OUTPUT0": "s1", "OUTPUT1": "d1"}),
        ("simple", -1, {"INPUT0": "s1", "INPUT1": "d1"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
    ]
    tensors = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
    make_models().write_ensemble(repo, "twice", tensors, [("SUM", "INT32", [16]), ("DIFF", "INT32", [16])], chain)
    path = tmp_path / "trace.json"
    a, b = simple_arrays()
    with turnout_up(repo, f"--trace-config=triton,file={path}", *TRACING_ON) as server:
        with httpclient.InferenceServerClient(server.http) as client:
            result = client.infer("twice", http_inputs(a, b), request_id="ensemble-1")
            assert (result.as_numpy("SUM") == 2 * a).all()
        client = grpcclient.InferenceServerClient(server.grpc)
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for request_id in ("stream-1", "stream-2"):
                client.async_stream_infer("simple", grpc_inputs(a, b), request_id=request_id)
            for _ in range(2):
                result, error = answers.get(timeout=20)
                assert error is None
                assert no_trace_parameter(result.get_response().parameters)
        finally:
            client.stop_stream()
            client.close()
    records = json.loads(path.read_text())
    heads = {record["id"]: record for record in records if "model_name" in record}
    parent = next(head for head in heads.values() if head["model_name"] == "twice")
    assert "parent_id" not in parent
    children = [head for head in heads.values() if head.get("parent_id") == parent["id"]]
    assert [child["model_name"] for child in children] == ["simple", "simple"]
    stamps: dict[int, list[str]] = {}
    for record in records:
        for stamp in record.get("timestamps", []):
            stamps.setdefault(record["id"], []).append(stamp["name"])
    assert stamps[parent["id"]] == [*HTTP_ORDER[:3], "REQUEST_END", *HTTP_ORDER[-3:]]  # no queue of its own
    for child in children:
        assert stamps[child["id"]] == HTTP_ORDER[2:9]
    streamed = traces_in([r for r in records if r["id"] not in (parent["id"], *(c["id"] for c in children))])
    assert sorted(streamed) == ["stream-1", "stream-2"]
    for trace in streamed.values():
        assert_well_ordered(trace, GRPC_ORDER)
