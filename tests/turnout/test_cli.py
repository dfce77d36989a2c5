"""One command line: every `turnout` command takes `-h`, names itself `turnout <command>`
in its usage line, and spells booleans Triton's way (`--flag=true|false`, bare = true)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.harness import ROOT, make_models, turnout_up, write_repository


def turnout(*arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "turnout", *arguments]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["up", "gateway", "sidecar", "bench"])
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_every_command_takes_h_and_names_itself_turnout_command(command: str, flag: str) -> None:
    done = turnout(command, flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: turnout {command} [OPTIONS]"), done.stdout[:200]


@pytest.mark.parametrize("value", ["=false", "=true", ""])
def test_the_sidecar_takes_tritons_boolean_form(value: str, tmp_path: Path) -> None:
    # A bad port value stops it after the booleans parsed: no sidecar starts.
    done = turnout(
        "sidecar",
        "--framework=onnxruntime",
        f"--model-repository={tmp_path}",
        f"--exit-on-error{value}",
        f"--strict-readiness{value}",
        f"--log-info{value}",
        "--port=-1",
    )
    assert done.returncode == 2
    assert "Invalid value for '--port'" in done.stderr, done.stderr
    assert "does not take a value" not in done.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def _ports(taken: int, flag: str) -> list[str]:
    ports = {"http": 0, "grpc": 0, "metrics": 0, flag: taken}
    return ["--host=127.0.0.1", *(f"--{name}-port={port}" for name, port in ports.items())]


def _one_clean_line(done: subprocess.CompletedProcess[str]) -> str:
    output = done.stdout + done.stderr
    for noise in ("Traceback", "Exception ignored", "never awaited", "Event loop is closed"):
        assert noise not in output, output
    lines = [line for line in done.stderr.splitlines() if "cannot serve" in line]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(("flag", "what"), [("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "metrics")])
def test_turnout_up_names_a_taken_port_and_its_flag_before_starting_sidecars(
    taken_port: int, flag: str, what: str, tmp_path: Path
) -> None:
    done = turnout("up", f"--model-repository={tmp_path}", *_ports(taken_port, flag))
    assert done.returncode == 1
    line = _one_clean_line(done)
    assert line == f"Error: cannot serve {what} on 127.0.0.1:{taken_port} (--{flag}-port): Address already in use"
    assert "sidecar ready" not in done.stdout + done.stderr


@pytest.mark.parametrize(("flag", "what"), [("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "metrics")])
def test_turnout_gateway_names_a_taken_port_and_its_flag_in_one_line(taken_port: int, flag: str, what: str) -> None:
    done = turnout("gateway", "--sidecar=onnxruntime=127.0.0.1:1", *_ports(taken_port, flag))
    assert done.returncode == 1
    line = _one_clean_line(done)
    assert line.startswith(f"turnout gateway: cannot serve {what} on 127.0.0.1:{taken_port} (--{flag}-port): "), line


TRITON_LAUNCH = (
    "--backend-directory=/opt/tritonserver/backends",
    "--model-load-thread-count=4",
    "--pinned-memory-pool-byte-size=268435456",
    "--cuda-memory-pool-byte-size=0:67108864",
    "--metrics-interval-ms=2000",
    "--allow-gpu-metrics=false",
    "--http-thread-count=8",
    "--id=triton",
    "--rate-limit=off",
    "--grpc-infer-allocation-pool-size=8",
    "--cache-config=local,size=1048576",
    "--allow-sagemaker=false",
    "--model-load-retry-count=2",
    "--reuse-grpc-port=false",
)
# Flags turnout acts on, or takes with Triton's default value: no warning.
TRITON_HONOURED = (
    "--http-address=127.0.0.1",
    "--grpc-address=127.0.0.1",
    "--grpc-keepalive-time=7200000",
    "--grpc-infer-response-compression-level=none",
    "--model-namespacing=false",
    "--model-config-name=",
)
# Every flag of current Triton's command line (command_line_parser.cc), `--help` aside.
TRITON_FLAGS = (
    "allow-client-shm",
    "allow-cpu-metrics",
    "allow-gpu-metrics",
    "allow-grpc",
    "allow-http",
    "allow-metrics",
    "allow-sagemaker",
    "allow-vertex-ai",
    "backend-config",
    "backend-directory",
    "buffer-manager-thread-count",
    "cache-config",
    "cache-directory",
    "cuda-memory-pool-byte-size",
    "cuda-virtual-address-size",
    "disable-auto-complete-config",
    "enable-peer-access",
    "exit-on-error",
    "exit-timeout-secs",
    "grpc-address",
    "grpc-header-forward-pattern",
    "grpc-http2-max-ping-strikes",
    "grpc-http2-max-pings-without-data",
    "grpc-http2-min-recv-ping-interval-without-data",
    "grpc-infer-allocation-pool-size",
    "grpc-infer-response-compression-level",
    "grpc-infer-thread-count",
    "grpc-keepalive-permit-without-calls",
    "grpc-keepalive-time",
    "grpc-keepalive-timeout",
    "grpc-max-connection-age",
    "grpc-max-connection-age-grace",
    "grpc-max-response-pool-size",
    "grpc-port",
    "grpc-restricted-protocol",
    "grpc-root-cert",
    "grpc-server-cert",
    "grpc-server-key",
    "grpc-use-ssl",
    "grpc-use-ssl-mutual",
    "host-policy",
    "http-address",
    "http-header-forward-pattern",
    "http-max-input-size",
    "http-port",
    "http-restricted-api",
    "http-thread-count",
    "id",
    "load-model",
    "log-error",
    "log-file",
    "log-format",
    "log-info",
    "log-verbose",
    "log-warning",
    "metrics-address",
    "metrics-config",
    "metrics-interval-ms",
    "metrics-port",
    "min-supported-compute-capability",
    "model-config-name",
    "model-control-mode",
    "model-load-gpu-limit",
    "model-load-retry-count",
    "model-load-thread-count",
    "model-namespacing",
    "model-repository",
    "model-store",
    "pinned-memory-pool-byte-size",
    "rate-limit",
    "rate-limit-resource",
    "repoagent-directory",
    "repository-poll-secs",
    "response-cache-byte-size",
    "reuse-grpc-port",
    "reuse-http-port",
    "sagemaker-port",
    "sagemaker-safe-port-range",
    "sagemaker-thread-count",
    "strict-model-config",
    "strict-readiness",
    "trace-config",
    "trace-count",
    "trace-file",
    "trace-level",
    "trace-log-frequency",
    "trace-rate",
    "vertex-ai-default-model",
    "vertex-ai-port",
    "vertex-ai-thread-count",
)


def test_turnout_up_takes_every_flag_of_tritons_command_line() -> None:
    done = turnout("up", "--help")
    missing = [name for name in TRITON_FLAGS if f"--{name}" not in done.stdout]
    assert not missing, missing


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--model-namespacing=true"], "cannot honour --model-namespacing=true"),
        (["--http-header-forward-pattern=("], "Invalid value for '--http-header-forward-pattern'"),
        (
            ["--http-address=127.0.0.1"],
            "turnout binds every front end to one address; these differ: --http-address=127.0.0.1, "
            "--grpc-address=0.0.0.0, --metrics-address=127.0.0.1",
        ),
        (["--host=127.0.0.1", "--grpc-address=10.0.0.1", "--http-address=10.0.0.1"], "--host=127.0.0.1 and the"),
    ],
)
def test_triton_flags_turnout_cannot_honour_stop_the_start(tmp_path: Path, flags: list[str], error: str) -> None:
    done = turnout("up", f"--model-repository={tmp_path}", *flags)
    assert done.returncode == 2, done.stderr
    assert error in done.stderr, done.stderr
    assert "sidecar ready" not in done.stdout + done.stderr


def test_a_triton_launch_command_starts_turnout_up_with_one_warning_per_flag_it_ignores(tmp_path: Path) -> None:
    repo = write_repository(tmp_path, ("simple",))
    with turnout_up(repo, *TRITON_LAUNCH, *TRITON_HONOURED, "--strict-model-config=false") as server:
        output = server.output()
        with httpclient.InferenceServerClient(server.http) as client:
            assert client.is_model_ready("simple")
    for flag in TRITON_LAUNCH:
        name = flag.split("=", 1)[0]
        assert sum(line.startswith(f"turnout: ignoring {flag}: ") for line in output.splitlines()) == 1, name
    assert "--backend-config" not in output
    for flag in TRITON_HONOURED:
        assert flag.split("=", 1)[0] not in output, flag


@pytest.mark.parametrize(("strict", "ready"), [("true", False), ("false", True)])
def test_strict_model_config_turns_auto_complete_off_as_in_triton(tmp_path: Path, strict: str, ready: bool) -> None:
    make_models().write_identity(tmp_path, name="no_config", datatype="FP32", with_config=False)
    with (
        turnout_up(tmp_path, f"--strict-model-config={strict}", "--exit-on-error=false") as server,
        httpclient.InferenceServerClient(server.http) as client,
    ):
        assert client.is_model_ready("no_config") is ready


@pytest.mark.parametrize("command", ["up", "gateway"])
def test_a_bad_trace_config_is_refused_in_tritons_words_before_anything_starts(command: str, tmp_path: Path) -> None:
    where = f"--model-repository={tmp_path}" if command == "up" else "--sidecar=onnxruntime=127.0.0.1:1"
    done = turnout(command, where, "--trace-config=level=loud")
    assert done.returncode == 2
    assert "invalid value for trace level option: loud" in done.stderr
    assert "Traceback" not in done.stderr and "sidecar ready" not in done.stdout + done.stderr


def test_tritons_deprecated_trace_flags_give_way_to_trace_config(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    trace_file = tmp_path / "trace.json"
    flags = (f"--trace-file={trace_file}", "--trace-level=TIMESTAMPS", "--trace-rate=7", "--trace-config=rate=3")
    with turnout_up(repo, *flags) as server, httpclient.InferenceServerClient(server.http) as client:
        settings = client.get_trace_settings()
    assert settings["trace_file"] == str(trace_file)
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "3"


def test_the_flags_the_commands_share_read_the_same_everywhere() -> None:
    from sidecars.__main__ import main as sidecar_command
    from turnout.cli import cli

    commands = {"up": cli.commands["up"], "gateway": cli.commands["gateway"], "sidecar": sidecar_command}

    def described(command: object, flag: str) -> tuple[object, ...] | None:
        for option in command.params:  # type: ignore[attr-defined]
            if f"--{flag}" in option.opts:
                return (repr(option.type), option.default, option.help, option.is_flag)
        return None

    for flag in ("strict-readiness", "exit-timeout-secs", "log-verbose", "log-format", "log-file", "grpc-use-ssl"):
        seen = {name: described(command, flag) for name, command in commands.items()}
        assert None not in seen.values() and len(set(seen.values())) == 1, (flag, seen)
    for flag in ("exit-on-error", "disable-auto-complete-config", "repository-poll-secs"):
        assert described(commands["up"], flag) == described(commands["sidecar"], flag) is not None, flag
