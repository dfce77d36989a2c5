"""`python -m bench.calls`: what one `simple` request costs in Python work, counted exactly.

The gateway (`turnout gateway`) and the ONNX Runtime sidecar run under bench.profiled. For
each protocol and concurrency, a closed-loop client warms up, then both processes profile
their main thread (where the event loop runs) while the client sends exactly --requests
requests. The profiles' call counts, divided by the requests, give per request: Python
function calls, protobuf parses and serializations, Prometheus client calls and
context-variable sets (on uvloop, as turnout runs); then, from a second pass on asyncio's
loop, whose methods are Python (uvloop's are Cython, which a profile does not see): loop
wake-ups, tasks, futures, callbacks, timers and thread hand-offs, grpc.aio's own included.
A coroutine's every resumption counts as a call, as cProfile counts it.

Counts, unlike times, do not move with the machine's load. The kernel's share (reads,
writes, switches between grpc's threads) is bench.profile's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from bench.__main__ import MODELS, ROOT, _inputs, _process
from protos.ready import GATEWAY_READY, SIDECAR_READY, parse_ready
from scripts.make_models import write_simple

# A label, and a test on a profile entry's file and function name; C functions have the
# file "~" and names like "<method 'SerializeToString' of '...Message' objects>".
Count = tuple[str, Callable[[str, str], bool]]


def _asyncio(*names: str) -> Callable[[str, str], bool]:
    """A method of asyncio's own loop (Python code, so the profile sees every call;
    uvloop's are Cython, which it does not)."""
    files = ("base_events.py", "selector_events.py", "selectors.py")
    return lambda where, function: where.endswith(files) and function in names


def _c_function(*parts: str) -> Callable[[str, str], bool]:
    return lambda where, function: where == "~" and any(part in function for part in parts)


def _ours(where: str) -> bool:
    return where.startswith(str(ROOT)) and not where.startswith(str(ROOT / ".venv"))


# Counted on uvloop, the loop turnout runs on: the Python calls, and these.
WORK: list[Count] = [
    ("protobuf parses", _c_function("FromString", "ParseFromString")),
    ("protobuf serializations", _c_function("SerializeToString")),
    ("prometheus calls", lambda where, _: "prometheus_client" in where),
    ("contextvar sets", _c_function("'set' of '_contextvars.ContextVar'")),
]
# Counted on asyncio's loop, which runs the same code of ours, uvicorn's and grpc.aio's
# but is Python itself: what the event loop is asked to do. A wake-up is one wait on the
# selector (one loop turn); callbacks include the timers.
LOOP: list[Count] = [
    ("wake-ups", _asyncio("select")),
    ("tasks", _asyncio("create_task")),
    ("futures", _asyncio("create_future")),
    ("callbacks", _asyncio("call_soon", "call_soon_threadsafe", "call_at")),
    ("timers", _asyncio("call_at")),
    ("thread hand-offs", _asyncio("run_in_executor")),
]


def per_request(profile: pstats.Stats, requests: int, counts: list[Count], python: bool) -> dict[str, float]:
    """Each of `counts` in one profile, per request, after the Python calls if `python`."""
    stats = profile.stats  # type: ignore[attr-defined]
    entries = [(where, name, calls) for (where, _, name), (_, calls, *_) in stats.items()]
    figures = {}
    if python:
        figures["Python calls"] = sum(calls for where, _, calls in entries if where != "~") / requests
        figures["of them turnout's"] = sum(calls for where, _, calls in entries if _ours(where)) / requests
    for label, test in counts:
        figures[label] = sum(calls for where, name, calls in entries if test(where, name)) / requests
    return figures


async def _exactly(call: Callable[[], Awaitable[object]], requests: int, concurrency: int) -> None:
    """`requests` calls from `concurrency` callers, each starting its next when one returns."""
    left = requests

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    await asyncio.gather(*(caller() for _ in range(concurrency)))


async def around_requests(
    protocol: str,
    url: str,
    concurrency: int,
    requests: int,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
) -> None:
    """Warm up a closed-loop `simple` client, then `start`, exactly `requests` requests, `stop`."""
    arrays = _inputs("simple", np.random.default_rng(0))
    if protocol == "gRPC":
        import tritonclient.grpc.aio as client_module
    else:
        import tritonclient.http.aio as client_module
    options = {} if protocol == "gRPC" else {"conn_limit": max(concurrency, 1)}
    client = client_module.InferenceServerClient(url, **options)
    inputs = []
    for name, array in arrays.items():
        tensor = client_module.InferInput(name, list(array.shape), MODELS["simple"][name][0])
        if protocol == "gRPC":
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)

    def call() -> Awaitable[object]:
        answer: Awaitable[object] = client.infer("simple", inputs)
        return answer

    try:
        await _exactly(call, max(200, 20 * concurrency), concurrency)  # warm: connections, caches, the run window
        await start()
        await _exactly(call, requests, concurrency)
        await stop()
    finally:
        await client.close()


async def _cell(protocol: str, url: str, concurrency: int, requests: int, pids: dict[str, int]) -> None:
    """Profile both processes around exactly `requests` requests (bench.profiled's signal)."""

    async def toggle() -> None:
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)  # each process starts (or stops) its profile at its next bytecode

    await around_requests(protocol, url, concurrency, requests, toggle, toggle)


def _wait_for(path: Path, timeout: float = 30.0) -> pstats.Stats:
    deadline = time.monotonic() + timeout
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"no profile was written to {path}")
        time.sleep(0.1)
    time.sleep(0.2)  # written in one go; let it finish
    return pstats.Stats(str(path))


def _pass(loop: str, args: argparse.Namespace, folder: str) -> dict[tuple[str, int, str], dict[str, float]]:
    """One gateway and one sidecar on `loop`, every cell counted; figures by (protocol,
    concurrency, process)."""
    counts, python = (WORK, True) if loop == "uvloop" else (LOOP, False)
    repo = Path(folder) / "repo"
    if not repo.exists():
        write_simple(repo)
    profiled = [sys.executable, "-m", "bench.profiled"]
    common = [f"--event-loop={loop}", "--log-info=false"]
    sidecar = [*profiled, f"{folder}/{loop}-sidecar", "sidecars", "--framework=onnxruntime", *common]
    sidecar += [f"--model-repository={repo}"]
    found: dict[tuple[str, int, str], dict[str, float]] = {}
    with _process(sidecar, SIDECAR_READY) as (sidecar_ready, sidecar_pid):
        fields = parse_ready(sidecar_ready, SIDECAR_READY) or {}
        gateway = [*profiled, f"{folder}/{loop}-gateway", "turnout", "gateway", "--host=127.0.0.1", *common]
        gateway += [f"--sidecar=onnxruntime={fields['grpc']},{fields['lane']}"]
        gateway += ["--http-port=0", "--grpc-port=0", "--metrics-port=0"]
        with _process(gateway, GATEWAY_READY) as (gateway_ready, gateway_pid):
            addresses = parse_ready(gateway_ready, GATEWAY_READY) or {}
            pids = {"gateway": gateway_pid, "sidecar": sidecar_pid}
            window = 0
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for protocol, key in (("gRPC", "grpc"), ("HTTP binary", "http")):
                    asyncio.run(_cell(protocol, addresses[key], concurrency, args.requests, pids))
                    for label in pids:
                        profile = _wait_for(Path(f"{folder}/{loop}-{label}.{window}"))
                        found[(protocol, concurrency, label)] = per_request(profile, args.requests, counts, python)
                    window += 1
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--requests", type=int, default=4000, help="requests counted per cell")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = _pass("uvloop", args, folder)
        loop = _pass("asyncio", args, folder)
    columns = ["Python calls", "of them turnout's", *(label for label, _ in WORK), *(label for label, _ in LOOP)]
    print(f"Per request ({args.requests} requests a cell; main threads; loop counts from a run on asyncio's loop):")
    print("| cell | process | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for key, figures in work.items():
        figures = {**figures, **loop[key]}
        protocol, concurrency, label = key
        values = " | ".join(f"{figures[column]:.1f}" for column in columns)
        print(f"| {protocol} c{concurrency} | {label} | {values} |", flush=True)


if __name__ == "__main__":
    main()
