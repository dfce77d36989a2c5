"""`python -m bench.instructions` counts a request's instructions in a real gateway, sidecar
and floor server under valgrind's callgrind: every cell and process is there, the parts
add up to no more than the total, each process spends them where it must (the gateway's
HTTP answers compressed (ISA-L's deflate), as the client accepts; ONNX Runtime running the model in
the sidecar; numpy in the floor, which computes `simple` itself), and turnout's two
processes are set against the floor."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from bench.instructions import COLUMNS
from tests.harness import ROOT

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")


def test_instructions_per_request() -> None:
    command = [sys.executable, "-m", "bench.instructions", "--requests", "100", "--concurrency", "2"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[3:] == COLUMNS
    rows = {}
    for line in lines[2:]:
        cell, process, *values = (text.strip() for text in line.strip("|").split("|"))
        rows[(cell, process)] = dict(zip(header[2:], (float(v.removesuffix(" k")) for v in values), strict=True))
    cells = ("gRPC c2", "HTTP binary c2")
    assert set(rows) == {(cell, process) for cell in cells for process in ("gateway", "sidecar", "floor")}
    for figures in rows.values():
        parts = sum(figures[column] for column in COLUMNS)
        assert 0 < parts <= figures["total"] + 0.1 * len(COLUMNS)  # each rounded to 0.1 k
        assert figures["CPython"] > figures["total"] / 4
    assert rows[("HTTP binary c2", "gateway")]["deflate"] > 0 == rows[("gRPC c2", "gateway")]["deflate"]
    assert rows[("gRPC c2", "gateway")]["grpc"] > 0
    for cell in cells:
        assert rows[(cell, "sidecar")]["ONNX Runtime"] > 0
        assert rows[(cell, "floor")]["numpy"] > 0 == rows[(cell, "floor")]["ONNX Runtime"]
    ratios = [line for line in result.stdout.splitlines() if "together" in line]
    assert [line.split(":")[0] for line in ratios] == ["gRPC", "HTTP binary"]
    for line in ratios:
        ratio = re.search(r"together ([0-9.]+)x the floor's", line)
        # Over gRPC turnout's two processes together now run about as many as the floor's
        # one (a grpc.aio server): the figure is a ratio of the counts, not a bound.
        assert ratio is not None and float(ratio.group(1)) > 0
