"""Every user error on the command line ends with a non-zero exit and a line that says
what is wrong and where, never a traceback: a sweep over `turnout up`, `gateway`,
`sidecar` and `bench`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port, make_models

NOISE = ("Traceback", "Exception ignored", "never awaited", "Event loop is closed")
PORTS = ("--host=127.0.0.1", "--http-port=0", "--grpc-port=0", "--metrics-port=0")


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    make_models().write_simple(repo)
    return repo


def plan_repository(tmp_path: Path) -> Path:
    """A TensorRT model: its sidecar cannot start where TensorRT is not installed."""
    repo = tmp_path / "plans"
    (repo / "engine" / "1").mkdir(parents=True)
    (repo / "engine" / "1" / "model.plan").write_bytes(b"not an engine")
    return repo


def bad_routing(tmp_path: Path) -> Path:
    path = tmp_path / "routing.yaml"
    path.write_text("models:\n  simple:\n    weights: {'1': -5}\n")
    return path


# (name, arguments given the test's folder, what the error says)
CASES = [
    ("up: no such repository", lambda t: ["up", "--model-repository=/no/such/folder"], "/no/such/folder"),
    ("up: repository is a file", lambda t: ["up", f"--model-repository={ROOT / 'README.md'}"], "is a file"),
    (
        "up: port not a number",
        lambda t: ["up", f"--model-repository={repository(t)}", "--http-port=abc"],
        "--http-port",
    ),
    (
        "up: boolean",
        lambda t: ["up", f"--model-repository={repository(t)}", "--exit-on-error=maybe"],
        "--exit-on-error",
    ),
    (
        "up: control mode",
        lambda t: ["up", f"--model-repository={repository(t)}", "--model-control-mode=sometimes"],
        "--model-control-mode",
    ),
    (
        "up: log file",
        lambda t: ["up", f"--model-repository={repository(t)}", "--log-file=/no/such/folder/log"],
        "cannot write to '/no/such/folder/log'",
    ),
    (
        "up: trace config",
        lambda t: ["up", f"--model-repository={repository(t)}", "--trace-config=level=LOUD"],
        "--trace-config",
    ),
    (
        "up: a sidecar that cannot start",
        lambda t: ["up", f"--model-repository={plan_repository(t)}", *PORTS],
        "the 'tensorrt' package is not installed",
    ),
    (
        "up: a repository that is a model folder",
        lambda t: ["up", f"--model-repository={repository(t) / 'simple'}", *PORTS],
        "looks like a model folder",
    ),
    ("gateway: sidecar address", lambda t: ["gateway", "--sidecar=onnxruntime", *PORTS], "--sidecar"),
    (
        "gateway: routing file",
        lambda t: ["gateway", "--sidecar=onnxruntime=127.0.0.1:1", f"--routing={bad_routing(t)}", *PORTS],
        "routing",
    ),
    (
        "sidecar: framework",
        lambda t: ["sidecar", "--framework=tensorflow", f"--model-repository={repository(t)}"],
        "--framework",
    ),
    (
        "sidecar: no such repository",
        lambda t: ["sidecar", "--framework=onnxruntime", "--model-repository=/no/such/folder"],
        "failed to stat file /no/such/folder",
    ),
    (
        "sidecar: framework not installed",
        lambda t: ["sidecar", "--framework=tensorrt", f"--model-repository={repository(t)}"],
        "the tensorrt sidecar cannot start",
    ),
    (
        "sidecar: backend config",
        lambda t: [
            "sidecar",
            "--framework=onnxruntime",
            f"--model-repository={repository(t)}",
            "--backend-config=default-max-batch-size=many",
        ],
        "default-max-batch-size",
    ),
    ("bench: nothing listening", lambda t: ["bench", "-m", "simple", "-u", f"localhost:{free_port()}"], "localhost"),
    ("bench: concurrency", lambda t: ["bench", "-m", "simple", "--concurrency-range=a:b"], "concurrency"),
]


@pytest.mark.parametrize(("name", "arguments", "says"), CASES, ids=[case[0] for case in CASES])
def test_a_user_error_is_a_line_and_an_exit_status_never_a_traceback(
    name: str, arguments: object, says: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "turnout", *arguments(tmp_path)]  # type: ignore[operator]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    for noise in NOISE:
        assert noise not in output, output
    assert says in output, output
