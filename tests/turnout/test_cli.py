"""One command line: every `turnout` command takes `-h`, names itself `turnout <command>`
in its usage line, and spells booleans Triton's way (`--flag=true|false`, bare = true)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT


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
