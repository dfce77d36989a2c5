"""Traces from sampling to Triton's trace file, on a fake nanosecond clock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.tracing import trace as names
from gateway.tracing.config import TIMESTAMPS, TraceConfig
from gateway.tracing.trace import Trace
from gateway.tracing.tracer import Tracer
from protos.trace import SIDECAR_TIMESTAMPS, SidecarReport
from tests.harness import ROOT


class Ticks:
    """A nanosecond clock that moves 1000 ns each time it is read."""

    def __init__(self, start: int = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def tracer_for(path: Path, **values: object) -> Tracer:
    config = TraceConfig(level=frozenset({TIMESTAMPS}), rate=1, file=str(path), **values)  # type: ignore[arg-type]
    return Tracer(config, clock=Ticks())


def run_one(tracer: Tracer, model: str = "simple", request_id: str = "", sidecar_offset: int = 0) -> Trace:
    """One traced HTTP request through the steps the front end and the gateway take."""
    trace = tracer.sample(model, {})
    assert trace is not None
    trace.stamp(names.HTTP_RECV_START)
    trace.stamp(names.HTTP_RECV_END)
    trace.start_request("", request_id)
    sent = trace.now()
    base = trace.now() + sidecar_offset
    report = SidecarReport("1", {name: base + 10 * i for i, name in enumerate(SIDECAR_TIMESTAMPS)})
    received = trace.now()
    trace.sidecar_answered(report, sent, received)
    trace.stamp(names.REQUEST_END)
    trace.stamp(names.HTTP_SEND_START)
    trace.stamp(names.HTTP_SEND_END)
    trace.finish()
    return trace


def grouped(records: list[dict[str, object]]) -> dict[int, list[dict[str, object]]]:
    by_id: dict[int, list[dict[str, object]]] = {}
    for record in records:
        by_id.setdefault(int(record["id"]), []).append(record)  # type: ignore[call-overload]
    return by_id


async def test_a_trace_in_tritons_records(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path)
    run_one(tracer, request_id="r1")
    await tracer.close()
    records = json.loads(path.read_text())
    assert records[2] == {"id": 1, "model_name": "simple", "model_version": 1, "request_id": "r1"}
    stamps = [(r["timestamps"][0]["name"], r["timestamps"][0]["ns"]) for r in records if "timestamps" in r]
    assert all(len(r["timestamps"]) == 1 for r in records if "timestamps" in r)
    assert [name for name, _ in stamps] == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "REQUEST_START",
        "QUEUE_START",
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
        "REQUEST_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    assert [ns for _, ns in stamps] == sorted(ns for _, ns in stamps)


async def test_a_sidecar_on_another_clock_is_centred_in_the_call(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path)
    trace = run_one(tracer, sidecar_offset=-(10**12))  # a clock far behind ours
    await tracer.close()
    stamps = dict(trace.timestamps)
    assert stamps[names.REQUEST_START] < stamps[names.QUEUE_START] < stamps[names.COMPUTE_END]
    assert stamps[names.COMPUTE_END] < stamps[names.REQUEST_END]
    assert stamps[names.COMPUTE_END] - stamps[names.QUEUE_START] == 40  # its own durations kept


async def test_the_main_file_is_written_when_the_settings_retire(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path)
    run_one(tracer)
    tracer.settings.update("", {"trace_rate": ["1"]})  # replaces the global setting: its traces are written
    run_one(tracer)
    await tracer.close()
    records = json.loads(path.read_text())
    assert sorted(grouped(records)) == [1, 2]
    assert not (tmp_path / "trace.json.0").exists()


async def test_log_frequency_writes_indexed_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path, log_frequency=2)
    for _ in range(5):
        run_one(tracer)
    await tracer.close()
    assert not path.exists()
    files = [json.loads((tmp_path / f"trace.json.{n}").read_text()) for n in range(3)]
    assert [sorted(grouped(records)) for records in files] == [[1, 2], [3, 4], [5]]


async def test_a_spent_count_writes_an_indexed_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path, count=2)
    run_one(tracer)
    run_one(tracer)
    assert tracer.sample("simple", {}) is None
    await tracer.close()
    assert sorted(grouped(json.loads((tmp_path / "trace.json.0").read_text()))) == [1, 2]
    assert not path.exists()


async def test_ensemble_steps_are_child_traces_written_with_their_parent(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = tracer_for(path)
    parent = tracer.sample("ensemble", {})
    assert parent is not None
    parent.start_request("", "")
    for step in ("simple", "linear"):
        child = parent.child(step, "1")
        child.start_request("1", "")
        child.stamp(names.REQUEST_END)
        child.finish()
    parent.stamp(names.REQUEST_END)
    parent.finish()
    await tracer.close()
    heads = [r for r in json.loads(path.read_text()) if "model_name" in r]
    assert heads == [
        {"id": 1, "model_name": "ensemble", "model_version": -1},
        {"id": 2, "model_name": "simple", "model_version": 1, "parent_id": 1},
        {"id": 3, "model_name": "linear", "model_version": 1, "parent_id": 1},
    ]


async def test_untraced_when_off(tmp_path: Path) -> None:
    tracer = Tracer(TraceConfig(file=str(tmp_path / "t.json")), clock=Ticks())
    assert tracer.sample("simple", {}) is None
    await tracer.close()
    assert list(tmp_path.iterdir()) == []


def test_the_gateway_imports_no_opentelemetry_sdk_unless_asked() -> None:
    """The SDK is an extra: a gateway that does not export spans must start without it."""
    code = (
        "import sys, gateway.app, gateway.http.front, gateway.tracing.tracer\n"
        "from gateway.tracing.tracer import Tracer\n"
        "Tracer()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
