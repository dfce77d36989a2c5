"""`python -m bench.profile`: where a `simple` request's cost goes, per process and thread.

One run drives the floor (bench/floor_server.py: one process serving `simple` itself) and
turnout (`turnout up`: the gateway, and the ONNX Runtime sidecar behind its lane) with the
same closed-loop client, over gRPC and HTTP binary, at each concurrency. Around each cell
it reads every thread's CPU time and voluntary context switches from /proc, and, where
`perf trace` may attach (Linux, root or perf_event_paranoid allowing), counts every
system call of each server process. All figures are per request.

Counts (system calls, context switches) barely move with the machine's load; CPU times
do, so compare them only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from bench.__main__ import _grpc, _http, _inputs, _process, children_running
from bench.closed_loop import Figures
from bench.floor_server import READY as FLOOR_READY
from protos.ready import GATEWAY_READY, parse_ready
from scripts.make_models import write_simple

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ThreadUse:
    cpu: float = 0.0  # seconds
    switches: int = 0  # voluntary context switches


def _threads(pid: int) -> dict[str, ThreadUse]:
    """CPU time and voluntary switches of each thread of `pid`, by `name:tid`."""
    use: dict[str, ThreadUse] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                text = stat.read()
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                switches = next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rpartition(")")[2].split()
        use[f"{name}:{tid}"] = ThreadUse((int(fields[11]) + int(fields[12])) / TICKS, switches)
    return use


def _child(pid: int, marker: str) -> int:
    """The child process of `pid` whose command line holds `marker`."""
    found = children_running(pid, marker)
    if not found:
        raise SystemExit(f"no child of {pid} runs {marker}")
    return found[0]


def _perf_usable() -> bool:
    if shutil.which("perf") is None:
        return False
    probe = subprocess.run(["perf", "trace", "-s", "--", "true"], capture_output=True, text=True)
    return probe.returncode == 0 and "syscall" in probe.stderr + probe.stdout


_SYSCALL_ROW = re.compile(r"^\s+(\w+)\s+(\d+)\s+\d+\s")


def _parse_perf(text: str) -> Counter[str]:
    calls: Counter[str] = Counter()
    for line in text.splitlines():
        if match := _SYSCALL_ROW.match(line):
            calls[match.group(1)] += int(match.group(2))
    return calls


@dataclass
class Cell:
    requests: int
    seconds: float
    threads: dict[str, dict[str, ThreadUse]]  # process label -> thread -> use
    syscalls: dict[str, Counter[str]] = field(default_factory=dict)


def _measure(processes: dict[str, int], drive: Callable[[], Coroutine[None, None, Figures]], perf: bool) -> Cell:
    before = {label: _threads(pid) for label, pid in processes.items()}
    tracers = {}
    if perf:
        for label, pid in processes.items():
            handle, path = tempfile.mkstemp(prefix="perf-", suffix=".txt")
            os.close(handle)
            tracer = subprocess.Popen(["perf", "trace", "-s", "-p", str(pid), "-o", path], stderr=subprocess.DEVNULL)
            tracers[label] = (tracer, path)
    figures = asyncio.run(drive())
    after = {label: _threads(pid) for label, pid in processes.items()}
    syscalls = {}
    for label, (tracer, path) in tracers.items():
        tracer.send_signal(signal.SIGINT)  # perf writes its summary on the way out
        tracer.wait(timeout=30)
        syscalls[label] = _parse_perf(Path(path).read_text())
        os.unlink(path)
    used = {
        label: {
            name: ThreadUse(
                use.cpu - before[label].get(name, ThreadUse()).cpu,
                use.switches - before[label].get(name, ThreadUse()).switches,
            )
            for name, use in after[label].items()
        }
        for label in processes
    }
    return Cell(figures.requests, figures.seconds, used, syscalls)


def _report(title: str, cell: Cell, warmup: float) -> list[str]:
    # CPU and switches span the warm-up as well: count its requests too.
    sent = cell.requests * (cell.seconds + warmup) / cell.seconds
    lines = [f"{title}: {cell.requests / cell.seconds:.0f} req/s"]
    for label, threads in cell.threads.items():
        cpu = sum(t.cpu for t in threads.values()) / sent * 1e6
        switches = sum(t.switches for t in threads.values()) / sent
        line = f"  {label:9s} CPU {cpu:5.0f} us/req, {switches:5.1f} switches/req"
        if label in cell.syscalls:
            calls = cell.syscalls[label]
            total = sum(calls.values()) / sent
            top = ", ".join(f"{name} {count / sent:.1f}" for name, count in calls.most_common(6))
            line += f", {total:5.1f} syscalls/req ({top})"
        lines.append(line)
        busy = sorted(threads.items(), key=lambda item: -item[1].cpu)
        for name, use in busy:
            if use.cpu / sent * 1e6 >= 5:
                lines.append(
                    f"      {name.split(':')[0]:15s} {use.cpu / sent * 1e6:5.0f} us/req, "
                    f"{use.switches / sent:5.1f} switches/req"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--no-perf", action="store_true", help="skip system call counts")
    parser.add_argument("--event-loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    args = parser.parse_args()
    perf = not args.no_perf and _perf_usable()
    if not perf and not args.no_perf:
        print("(no system call counts: `perf trace` is missing or may not attach here)")
    arrays = _inputs("simple", np.random.default_rng(0))
    w, d = args.warmup, args.duration
    with tempfile.TemporaryDirectory() as repo:
        write_simple(Path(repo))
        up = [sys.executable, "-m", "turnout", "up", f"--model-repository={repo}", "--host=127.0.0.1"]
        up += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--log-info=false"]
        up += [f"--event-loop={args.event_loop}"]
        floor_cmd = [sys.executable, "-m", "bench.floor_server", args.event_loop]
        with (
            _process(up, GATEWAY_READY) as (ready, gateway_pid),
            _process(floor_cmd, FLOOR_READY) as (floor_ready, floor_pid),
        ):
            turnout = parse_ready(ready, GATEWAY_READY) or {}
            floor = parse_ready(floor_ready, FLOOR_READY) or {}
            sidecar_pid = _child(gateway_pid, "--framework=onnxruntime")
            for conc in (int(c) for c in args.concurrency.split(",")):
                for protocol, run in (("gRPC", _grpc), ("HTTP binary", _http)):
                    key = "grpc" if protocol == "gRPC" else "http"
                    servers = (
                        ("floor", floor[key], {"floor": floor_pid}),
                        ("turnout", turnout[key], {"gateway": gateway_pid, "sidecar": sidecar_pid}),
                    )
                    for name, url, processes in servers:
                        cell = _measure(processes, partial(run, url, "simple", arrays, conc, w, d), perf)
                        print("\n".join(_report(f"{name}, {protocol}, concurrency {conc}", cell, w)), flush=True)


if __name__ == "__main__":
    main()
