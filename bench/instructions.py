"""`python -m bench.instructions`: the instructions one `simple` request costs each process.

The gateway (`turnout gateway`), the ONNX Runtime sidecar and the floor (bench.floor_server:
one process serving `simple` itself) run under valgrind's callgrind with instrumentation
off. For each protocol, a closed-loop client warms up, then the processes serving it count
every user-space instruction, in every thread, while the client sends exactly --requests
requests (turnout's two first, then the floor); the counts, divided by the requests, are
split by the shared object that ran them (CPython's interpreter, protobuf, deflate (zlib, ISA-L), uvloop,
httptools, grpc, ONNX Runtime, libc, ...), and turnout's two processes together are
printed as a multiple of the floor. Instructions, unlike CPU time, barely move with the machine's load (two
runs of one build agree within about 1%), so a change of a few percent shows here where
timings on a shared machine cannot see it. The kernel's share (system calls, switches) is
bench.profile's; what the Python code does is bench.calls'.

Needs valgrind (a system package, e.g. `apt-get install valgrind`); each process runs about
fifty times slower under it, so a cell of 2000 requests takes a minute or so.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.__main__ import _process
from bench.calls import around_requests
from bench.floor_server import READY as FLOOR_READY
from protos.ready import GATEWAY_READY, SIDECAR_READY, parse_ready
from scripts.make_models import write_simple

# Part of a shared object's path -> the column it counts in; the first that matches.
PARTS = [
    ("/libpython", "CPython"),
    ("/lib-dynload/", "CPython"),  # its C modules: _json, _asyncio, zlib's binding, ...
    ("/google/_upb/", "protobuf"),
    ("/libz.", "deflate"),
    ("/isal/", "deflate"),  # ISA-L's, compressing HTTP answers
    ("/uvloop/", "uvloop"),
    ("/httptools/", "httptools"),
    ("/grpc/", "grpc"),
    ("/onnxruntime/", "ONNX Runtime"),
    ("/numpy", "numpy"),
    ("/libc.", "libc"),
    ("/ld-linux", "libc"),
]
# About how many times slower a process runs under callgrind.
VALGRIND_SLOWDOWN = 100
COLUMNS = ["CPython", "protobuf", "deflate", "uvloop", "httptools", "grpc", "ONNX Runtime", "numpy", "libc", "other"]


def part_of(shared_object: str) -> str:
    return next((part for marker, part in PARTS if marker in shared_object), "other")


def split(dump: Path) -> tuple[int, dict[str, int]]:
    """A callgrind dump's total instructions, and each part's own share of them: every
    cost line counts for the object named by the `ob=` before it, except the line after a
    `calls=`, which is the cost of the call (counted where it was spent)."""
    parts: dict[str, int] = defaultdict(int)
    part, total, call_cost = "other", 0, False
    with dump.open() as lines:  # names written out in full (--compress-strings=no)
        for line in lines:
            if line.startswith("ob="):
                part = part_of(line[3:].strip())
            elif line.startswith("calls="):
                call_cost = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if call_cost:
                    call_cost = False
                else:
                    parts[part] += int(line.split()[1])
            elif line.startswith("totals:"):
                total = int(line.split()[1])
    return total, parts


def _control(pid: int, *options: str) -> None:
    subprocess.run(["callgrind_control", *options, str(pid)], capture_output=True, check=True)


async def _cell(protocol: str, url: str, concurrency: int, requests: int, pids: dict[str, int]) -> None:
    """Count both processes' instructions around exactly `requests` requests."""

    async def start() -> None:
        for pid in pids.values():
            _control(pid, "--instr=on")
            _control(pid, "--zero")

    async def stop() -> None:
        for pid in pids.values():
            _control(pid, "--dump")
            _control(pid, "--instr=off")

    await around_requests(protocol, url, concurrency, requests, start, stop)


def _newest(folder: str, label: str, pid: int) -> Path:
    deadline = time.monotonic() + 30
    while True:
        dumps = sorted(Path(folder).glob(f"{label}.{pid}.*"), key=lambda path: path.stat().st_mtime)
        if dumps and dumps[-1].stat().st_size > 0:
            time.sleep(0.2)  # written in one go; let it finish
            return dumps[-1]
        if time.monotonic() > deadline:
            raise SystemExit(f"callgrind wrote no dump for the {label}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests counted per cell")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.instructions needs valgrind (callgrind and callgrind_control)")
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder) / "repo"
        write_simple(repo)

        def counted(label: str) -> list[str]:
            out = f"--callgrind-out-file={folder}/{label}.%p"
            return [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--compress-strings=no",
                out,
                sys.executable,
                "-m",
            ]

        common = ["--log-info=false"]
        # Timed under valgrind, `simple` would look too slow to run inline: the thresholds
        # scaled (bench.slowed_sidecar), it runs where it runs at full speed.
        sidecar = [*counted("sidecar"), "bench.slowed_sidecar", str(VALGRIND_SLOWDOWN), "--framework=onnxruntime"]
        sidecar += [f"--model-repository={repo}", *common]
        rows = []
        with (
            _process(sidecar, SIDECAR_READY) as (sidecar_ready, sidecar_pid),
            _process([*counted("floor"), "bench.floor_server"], FLOOR_READY) as (floor_ready, floor_pid),
        ):
            fields = parse_ready(sidecar_ready, SIDECAR_READY) or {}
            floor = parse_ready(floor_ready, FLOOR_READY) or {}
            gateway = [*counted("gateway"), "turnout", "gateway", "--host=127.0.0.1", *common]
            gateway += [f"--sidecar=onnxruntime={fields['grpc']},{fields['lane']}"]
            gateway += ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
            with _process(gateway, GATEWAY_READY) as (gateway_ready, gateway_pid):
                addresses = parse_ready(gateway_ready, GATEWAY_READY) or {}
                for protocol, key in (("gRPC", "grpc"), ("HTTP binary", "http")):
                    servers = [
                        (addresses[key], {"gateway": gateway_pid, "sidecar": sidecar_pid}),
                        (floor[key], {"floor": floor_pid}),
                    ]
                    for url, pids in servers:
                        asyncio.run(_cell(protocol, url, args.concurrency, args.requests, pids))
                        for label, pid in pids.items():
                            total, parts = split(_newest(folder, label, pid))
                            for dump in Path(folder).glob(f"{label}.{pid}.*"):
                                dump.unlink()
                            rows.append((protocol, label, total, parts))
    print(f"Instructions per request ({args.requests} requests a cell, concurrency {args.concurrency}; all threads):")
    print("| cell | process | total | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for protocol, label, total, parts in rows:
        shares = " | ".join(f"{parts.get(column, 0) / args.requests / 1000:.1f} k" for column in COLUMNS)
        print(
            f"| {protocol} c{args.concurrency} | {label} | {total / args.requests / 1000:.1f} k | {shares} |",
            flush=True,
        )
    totals = {(protocol, label): total for protocol, label, total, _ in rows}
    for protocol in ("gRPC", "HTTP binary"):
        turnout = totals[(protocol, "gateway")] + totals[(protocol, "sidecar")]
        print(f"{protocol}: gateway and sidecar together {turnout / totals[(protocol, 'floor')]:.2f}x the floor's")


if __name__ == "__main__":
    main()
