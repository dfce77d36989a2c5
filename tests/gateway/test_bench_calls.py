"""`python -m bench.calls` counts a request's work in a real gateway and sidecar. Its counts
are exact (up to what the processes do in the background meanwhile, such as a health
check), so the protobuf work per request is held here: the gateway forwards a gRPC
request's bytes as they came (one parse, to route it, no serialization), builds and
serializes one request from an HTTP body and renders its answer from the JSON header it
remembered (no parse); the sidecar reads a request like one it served before from its
raw buffers (no parse) and writes its answer's bytes itself (no serialization)."""

from __future__ import annotations

import subprocess
import sys

from pytest import approx

from tests.harness import ROOT


def test_counts_per_request() -> None:
    command = [sys.executable, "-m", "bench.calls", "--requests", "100", "--concurrency", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cell, process, *values = (text.strip() for text in line.strip("|").split("|"))
        rows[(cell, process)] = dict(zip(header[2:], (float(v) for v in values), strict=True))
    cells = ("gRPC c1", "HTTP binary c1")
    assert set(rows) == {(cell, process) for cell in cells for process in ("gateway", "sidecar")}

    once, never = approx(1.0, abs=0.1), approx(0.0, abs=0.1)
    grpc, http = rows[("gRPC c1", "gateway")], rows[("HTTP binary c1", "gateway")]
    assert grpc["protobuf parses"] == once and grpc["protobuf serializations"] == never
    assert http["protobuf parses"] == never and http["protobuf serializations"] == once
    for cell in cells:
        sidecar = rows[(cell, "sidecar")]
        assert sidecar["protobuf parses"] == never and sidecar["protobuf serializations"] == never
        # simple runs at once, with no task, once its runs measure fast enough to run inline;
        # on a busy host they may not, and it runs on its thread with one task. Which of the
        # two is timing, so the at-once path itself is held by the batcher's and lane's tests.
        assert sidecar["tasks"] <= 1.1
    for figures in rows.values():
        assert 0 < figures["of them turnout's"] < figures["Python calls"]
        assert figures["contextvar sets"] == once  # the request id, once in each process
        assert figures["wake-ups"] >= 1
