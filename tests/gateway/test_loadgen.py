"""`turnout bench` against a real `turnout up`: a short concurrency sweep over each
protocol, its table on stdout and its CSV, JSON and PNG files."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT, Server, turnout_up, write_repository

SHORT = ["--warmup-secs=0.2", "--measurement-interval=200", "--max-trials=3", "--no-progress"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_bench"), ("simple", "identity_fp32"))
    with turnout_up(repo, "--allow-client-shm=true") as running:
        yield running


def bench(*flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "turnout", "bench", *SHORT, *flags]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90)


def test_grpc_sweep_writes_table_csv_json_and_png(server: Server, tmp_path: Path) -> None:
    csv_path, json_path, png_path = tmp_path / "r.csv", tmp_path / "r.json", tmp_path / "r.png"
    result = bench(
        "-m", "simple", "-u", server.grpc, "-i", "grpc", "--concurrency-range", "1:3:2",
        "--metrics-url", server.metrics, "-f", str(csv_path), "--json", str(json_path), "--plot", str(png_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["Conc", "Rate/s", "Infer/s"]
    assert [line.split()[:2] for line in lines[1:]] == [["1", "closed"], ["3", "closed"]]
    rows = list(csv.DictReader(csv_path.read_text().splitlines()))
    assert [int(r["concurrency"]) for r in rows] == [1, 3]
    assert all(float(r["throughput"]) > 0 and r["errors"] == "0" for r in rows)
    document = json.loads(json_path.read_text())
    assert document["model"] == "simple" and len(document["points"]) == 2
    point = document["points"][0]
    assert 0 < point["p50_us"] <= point["p90_us"] <= point["p95_us"] <= point["p99_us"]
    # The statistics extension split the server's time; the metrics port gave its CPU.
    assert point["server_compute_us"] > 0
    assert 0 <= point["server_cpu"] <= 1
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_http_with_shared_memory_and_request_rate(server: Server) -> None:
    result = bench("-m", "simple", "-u", server.http, "-i", "http", "--shared-memory", "system", "--request-rate", "50")
    assert result.returncode == 0, result.stderr
    row = result.stdout.strip().splitlines()[1].split()
    assert row[:2] == ["open", "50"] and float(row[2]) > 0 and row[-1] == "0"


def test_input_data_file_and_dynamic_shape(server: Server, tmp_path: Path) -> None:
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"INPUT0": [1.0, 2.0, 3.0]}]}))
    result = bench(
        "-m", "identity_fp32", "-u", server.grpc, "--input-data", str(data), "--shape", "INPUT0:3", "-b", "2"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[1].split()[-1] == "0"  # no errors


def test_an_unknown_model_or_an_absent_server_is_one_error_line(server: Server) -> None:
    unknown = bench("-m", "no_such_model", "-u", server.grpc)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().splitlines() == [
        f"Error: {server.grpc}: Request for unknown model: 'no_such_model' is not found"
    ]
    absent = bench("-m", "simple", "-u", "127.0.0.1:1")
    assert absent.returncode == 1
    assert absent.stderr.startswith("Error: 127.0.0.1:1: failed to connect") and "Traceback" not in absent.stderr
