"""The documents' commands, run as written: every fenced block marked `runnable` in
README.md and docs/deploy.md, in document order, in a folder of its own, with the
environment's commands first on PATH (as after `source .venv/bin/activate`).

- ```sh runnable / ```python runnable: must exit 0 (a python block runs from a file, named
  by its first line when that reads `# name.py: ...`).
- ```sh server: a server started in the background; the next blocks run once it prints
  its ready line, and it stops at the next server block or the end of its section, when
  the document's own server (if any) comes back. Its ports
  come from the TURNOUT_UP_* variables (0: free ones); a block's `localhost:8000`, `:8001`
  and `:8002` are rewritten to the ports it got.
- ```sh cleanup: run at the document's end whatever happened before.
README.md's blocks run against `turnout up` on model_repository/, what `make run` starts;
docs/deploy.md's walk-through needs root (network namespaces) and a Consul binary.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos.ready import GATEWAY_READY, parse_ready
from tests.fleet.fleet_harness import CONSUL, NO_CONSUL, consul_binary
from tests.harness import ROOT, pump_lines

BLOCK = re.compile(
    r"^```(?P<language>\w+) (?P<kind>runnable|server|cleanup)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL
)
DEFAULT_PORTS = {"8000": "http", "8001": "grpc", "8002": "metrics"}
BLOCK_TIMEOUT_S = 180
READY_TIMEOUT_S = 90


@dataclass(frozen=True)
class Block:
    language: str
    kind: str
    body: str
    line: int
    section: str  # the `## ` heading it is under


def blocks_of(document: Path) -> list[Block]:
    text = document.read_text()
    found = []
    for match in BLOCK.finditer(text):
        headings = re.findall(r"^## (.*)$", text[: match.start()], re.MULTILINE)
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(match["language"], match["kind"], match["body"], line, headings[-1] if headings else ""))
    return found


class Session:
    """One document's working folder, environment and current server."""

    def __init__(self, folder: Path, default: str = "") -> None:
        self.folder = folder
        (folder / "model_repository").symlink_to(ROOT / "model_repository")  # "from the checkout"
        (folder / "scripts").symlink_to(ROOT / "scripts")
        self.default = default  # the command of the document's own server ("" for none)
        self.section = ""  # the section whose server block runs now ("" for the default)
        bin_dir = str(Path(sys.executable).parent)
        path = os.pathsep.join([bin_dir, str(CONSUL.parent), os.environ.get("PATH", "")])
        self.env = dict(os.environ, PATH=path, PYTHONUNBUFFERED="1")
        self.env.update(VIRTUAL_ENV=str(Path(bin_dir).parent), PYTHONPATH=str(ROOT))
        for flag in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT"):
            self.env[f"TURNOUT_UP_{flag}"] = "0"
        self.env["TURNOUT_UP_HOST"] = "127.0.0.1"
        self.addresses: dict[str, str] = {}
        self._server: subprocess.Popen[str] | None = None
        self._pump = threading.Thread()
        self._lines: list[str] = []

    def run(self, block: Block) -> None:
        if block.kind == "server":
            self.serve(block.body)
            self.section = block.section
            return
        if self.section and block.section != self.section:
            self.serve(self.default) if self.default else self.stop()
            self.section = ""
        body = block.body
        for port, name in DEFAULT_PORTS.items():
            if name in self.addresses:
                body = body.replace(f"localhost:{port}", self.addresses[name])
        if block.language == "python":
            # From a file (TorchScript reads a module's source), named as its first line says.
            named = re.match(r"# (\w+\.py):", body)
            script = self.folder / (named[1] if named else f"block_{block.line}.py")
            script.write_text(body)
            command = [sys.executable, script.name]
        else:
            command = ["bash", "-euo", "pipefail", "-c", body]
        done = subprocess.run(
            command, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
        assert done.returncode == 0, f"block at line {block.line} exited {done.returncode}:\n{done.stdout}{done.stderr}"

    def serve(self, command: str) -> None:
        self.stop()
        self._lines = []
        self._server = subprocess.Popen(
            ["bash", "-c", "exec " + command.strip()],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        sink: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=pump_lines, args=(self._server.stdout, sink, self._lines), daemon=True)
        self._pump.start()
        while True:
            try:
                line = sink.get(timeout=READY_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"`{command.strip()}` printed no ready line:\n{''.join(self._lines)}") from None
            if line is None:
                raise AssertionError(f"`{command.strip()}` exited before it was ready:\n{''.join(self._lines)}")
            fields = parse_ready(line, GATEWAY_READY)
            if fields is not None:
                self.addresses = {name: "localhost:" + address.rpartition(":")[2] for name, address in fields.items()}
                return

    def stop(self) -> None:
        if self._server is None:
            return
        os.killpg(self._server.pid, signal.SIGTERM)
        try:
            self._server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait()
        self._pump.join(timeout=5)
        if self._server.stdout is not None:
            self._server.stdout.close()
        self._server = None


@contextmanager
def session(folder: Path, default: str) -> Iterator[Session]:
    current = Session(folder, default)
    if default:
        current.serve(default)
    try:
        yield current
    finally:
        current.stop()


def test_the_documents_mark_blocks_to_run() -> None:
    assert len(blocks_of(ROOT / "README.md")) >= 5
    assert blocks_of(ROOT / "docs/deploy.md")


def test_readme_blocks_run(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="README's own-model recipe exports a torch module")
    run_document(ROOT / "README.md", tmp_path, f"turnout up --model-repository {ROOT / 'model_repository'}")


def test_deploy_walk_through_runs(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the walk-through makes network namespaces: run as root with iproute2 (apt install iproute2)")
    if consul_binary() is None:
        pytest.skip(NO_CONSUL)
    run_document(ROOT / "docs/deploy.md", tmp_path, "")


def run_document(document: Path, folder: Path, default: str) -> None:
    found = blocks_of(document)
    with session(folder, default) as docs:
        try:
            for block in found:
                if block.kind != "cleanup":
                    docs.run(block)
        finally:
            docs.stop()
            for block in found:
                if block.kind == "cleanup":
                    docs.run(block)
