"""`python -m bench` (or `make bench`): simple and an FP32 MLP through the gateway
(gRPC and HTTP binary) beside in-process ONNX Runtime, a plain grpc.aio echo server, a
plain uvicorn echo, one sidecar called directly over its lane, and for simple the floor
(one process serving the model itself over both protocols) with turnout as its ratio;
the MLP with dynamic batching off and on at concurrency 32, in alternating pairs; the
gateway's CPU time per request; and the same MLP as TorchScript through the PyTorch
sidecar beside in-process torch. All in one run, so the ratios hold on a noisy machine.
Writes a results table (Markdown, CSV) and plots.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc.aio as grpcclient
import tritonclient.http.aio as httpclient

from bench.closed_loop import Figures, run_async, run_threads
from bench.floor_server import READY as FLOOR_READY
from protos import grpc_service_pb2 as pb
from protos.lane import LaneClient
from protos.ready import GATEWAY_READY, SIDECAR_READY, parse_ready
from scripts.make_models import write_identity, write_mlp, write_simple, write_torch_mlp

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "simple": {"INPUT0": ("INT32", (1, 16)), "INPUT1": ("INT32", (1, 16))},
    "mlp": {"INPUT0": ("FP32", (1, 512))},
    "mlp_torch": {"INPUT0": ("FP32", (1, 512))},
    "mlp_nobatch": {"INPUT0": ("FP32", (1, 512))},
    # An identity over 1 MiB of FP32: the data path's cost for a large tensor.
    "tensor1m": {"INPUT0": ("FP32", (1, 262144))},
}
# Compressing 1 MiB of random floats takes zlib about 40 ms (Triton's HTTP server as much,
# when the client accepts it, as tritonclient's aio client does): this model's answers are
# asked for uncompressed, so its HTTP row measures the data path.
_UNCOMPRESSED = {"tensor1m"}


def _inputs(model: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for name, (datatype, shape) in MODELS[model].items():
        if datatype == "INT32":
            arrays[name] = rng.integers(-100, 100, shape, dtype=np.int32)
        else:
            arrays[name] = rng.standard_normal(shape, dtype=np.float32)
    return arrays


@contextmanager
def _process(command: list[str], ready_prefix: str) -> Iterator[tuple[str, int]]:
    """Start a server process and yield its ready line and pid."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith(ready_prefix):
                yield line.strip(), process.pid
                break
        else:
            raise SystemExit(f"{command[2]} exited with {process.wait()} before it was ready")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


async def _grpc(url: str, model: str, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), MODELS[model][name][0])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        return await run_async(lambda: client.infer(model, inputs), conc, warmup, dur)
    finally:
        await client.close()


async def _http(url: str, model: str, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    client = httpclient.InferenceServerClient(url, conn_limit=max(conc, 1))
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), MODELS[model][name][0])
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    headers = {"Accept-Encoding": "identity"} if model in _UNCOMPRESSED else None
    try:
        return await run_async(lambda: client.infer(model, inputs, headers=headers), conc, warmup, dur)
    finally:
        await client.close()


def _in_process(model_file: Path, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return run_threads(lambda: session.run(None, arrays), conc, warmup, dur)


def _in_process_torch(model_file: Path, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    import torch

    module = torch.jit.load(str(model_file))  # type: ignore[no-untyped-call]
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}

    def call() -> object:
        with torch.inference_mode():
            return module(**tensors).numpy()

    return run_threads(call, conc, warmup, dur)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_running(pid: int, marker: str) -> list[int]:
    """The child processes of `pid` whose command line holds `marker`."""
    found = []
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        for child in children.read().split():
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(int(child))
    return found


def _gateway_cpu(pid: int) -> float:
    """CPU time of a gateway process and of its workers (gateway.workers), if any."""
    return _cpu_seconds(pid) + sum(_cpu_seconds(worker) for worker in children_running(pid, "gateway.workers"))


@contextmanager
def _maybe(command: list[str] | None, ready_prefix: str) -> Iterator[tuple[str, int]]:
    """`_process(command, ...)`, or nothing when `command` is None."""
    if command is None:
        yield "", 0
        return
    with _process(command, ready_prefix) as started:
        yield started


async def _lane(address: str, model: str, arrays: dict[str, np.ndarray], conc: int, w: float, d: float) -> Figures:
    """The sidecar alone: a serialized ModelInfer straight onto its lane (the gateway's own hop)."""
    request = pb.ModelInferRequest(model_name=model)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=MODELS[model][name][0], shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    payload = request.SerializeToString()
    client = LaneClient(address)
    try:
        return await run_async(lambda: client.call(payload), conc, w, d)
    finally:
        client.close()


Row = tuple[str, int, str, Figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="simple,mlp")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--batching-concurrency", type=int, default=32, help="MLP batching off vs on, at this")
    parser.add_argument(
        "--batching-rounds", type=int, default=3, help="MLP batching off/on pairs, alternating; the median is reported"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="turnout's, the sidecars' and the floor's",
    )
    parser.add_argument(
        "--gateway-workers",
        type=int,
        default=2,
        help="also serve simple through a gateway with this many workers (1: not)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results table and plots")
    args = parser.parse_args()
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    cpu_per_request: dict[str, float] = {}
    batching_ratios: list[float] = []

    with tempfile.TemporaryDirectory() as repo:
        write_simple(Path(repo))
        write_mlp(Path(repo))
        write_mlp(Path(repo), name="mlp_nobatch", extra_config="")
        write_identity(Path(repo), "tensor1m", "FP32", dims=MODELS["tensor1m"]["INPUT0"][1][1:])
        with_torch = _has_torch() and "mlp" in models
        if with_torch:
            write_torch_mlp(Path(repo), "mlp_torch")
        gateway_cmd = [sys.executable, "-m", "turnout", "up", f"--model-repository={repo}", "--host=127.0.0.1"]
        gateway_cmd += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--log-info=false"]
        gateway_cmd += [f"--event-loop={args.event_loop}"]
        sidecar_cmd = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repo}"]
        sidecar_cmd += ["--lane=tcp", "--log-info=false", "--allow-metrics=false", f"--event-loop={args.event_loop}"]
        workers = args.gateway_workers
        workers_cmd = [*gateway_cmd, f"--gateway-workers={workers}"] if workers > 1 else None
        with (
            _process(gateway_cmd, GATEWAY_READY) as (ready, gateway_pid),
            _maybe(workers_cmd, GATEWAY_READY) as (workers_ready, workers_pid),
            _process(sidecar_cmd, SIDECAR_READY) as (sidecar_ready, _),
            _process([sys.executable, "-m", "bench.floor_server", args.event_loop], FLOOR_READY) as (floor_ready, _),
        ):
            fields = parse_ready(ready, GATEWAY_READY) or {}
            with_workers = parse_ready(workers_ready, GATEWAY_READY) or {}
            floor = parse_ready(floor_ready, FLOOR_READY) or {}
            lane = (parse_ready(sidecar_ready, SIDECAR_READY) or {})["lane"]
            for model in models:
                arrays = _inputs(model, rng)
                with (
                    _process([sys.executable, "-m", "bench.echo_server", model], "ECHO_READY") as (echo, _),
                    _process([sys.executable, "-m", "bench.http_echo", model], "ECHO_READY") as (http_echo, _),
                ):
                    echo_url = f"127.0.0.1:{echo.split()[1]}"
                    http_echo_url = f"127.0.0.1:{http_echo.split()[1]}"
                    for conc in levels:
                        w, d = args.warmup, args.duration
                        model_file = Path(repo) / model / "1" / "model.onnx"
                        cells = [
                            ("in-process onnxruntime", _in_process(model_file, arrays, conc, w, d)),
                            ("echo server, gRPC", asyncio.run(_grpc(echo_url, model, arrays, conc, w, d))),
                            (
                                "echo server, HTTP (uvicorn)",
                                asyncio.run(_http(http_echo_url, model, arrays, conc, w, d)),
                            ),
                            ("sidecar alone, lane", asyncio.run(_lane(lane, model, arrays, conc, w, d))),
                        ]
                        if model == "simple":
                            cells += [
                                ("floor, gRPC", asyncio.run(_grpc(floor["grpc"], model, arrays, conc, w, d))),
                                ("floor, HTTP binary", asyncio.run(_http(floor["http"], model, arrays, conc, w, d))),
                            ]
                        gateways = [("turnout", "", fields, gateway_pid)]
                        if with_workers and model == "simple":
                            gateways.append((f"turnout {workers} workers", f" {workers}w", with_workers, workers_pid))
                        for name, key, addresses, pid in gateways:
                            for protocol, label in (("grpc", "gRPC"), ("http", "HTTP binary")):
                                before = _gateway_cpu(pid)
                                run = _grpc if protocol == "grpc" else _http
                                figures = asyncio.run(run(addresses[protocol], model, arrays, conc, w, d))
                                # Requests in the warm-up count too: the CPU time spans it.
                                sent = figures.requests * (w + d) / d
                                cpu = (_gateway_cpu(pid) - before) / sent
                                cpu_per_request[f"{model} c{conc} {protocol}{key}"] = cpu
                                cells.append((f"{name}, {label}", figures))
                        if with_torch and model == "mlp":
                            torch_file = Path(repo) / "mlp_torch" / "1" / "model.pt"
                            cells += [
                                ("in-process torch (jit)", _in_process_torch(torch_file, arrays, conc, w, d)),
                                (
                                    "turnout TorchScript, gRPC",
                                    asyncio.run(_grpc(fields["grpc"], "mlp_torch", arrays, conc, w, d)),
                                ),
                            ]
                        rows += [(model, conc, path, figures) for path, figures in cells]
                        _print(rows[-len(cells) :])
            if "mlp" in models:
                arrays = _inputs("mlp", rng)
                conc, w, d = args.batching_concurrency, args.warmup, args.duration
                # Off and on alternate, so a machine whose load drifts moves both cells of
                # a pair alike; the pair with the median ratio is the one reported.
                pairs: list[tuple[float, Figures, Figures]] = []
                for _ in range(max(args.batching_rounds, 1)):
                    off = asyncio.run(_grpc(fields["grpc"], "mlp_nobatch", arrays, conc, w, d))
                    on = asyncio.run(_grpc(fields["grpc"], "mlp", arrays, conc, w, d))
                    pairs.append((on.throughput / off.throughput, off, on))
                pairs.sort(key=lambda pair: pair[0])
                batching_ratios = [ratio for ratio, _, _ in pairs]
                _, off, on = pairs[len(pairs) // 2]
                cells = [("turnout gRPC, batching off", off), ("turnout gRPC, batching on", on)]
                rows += [("mlp", conc, path, figures) for path, figures in cells]
                _print(rows[-len(cells) :])
    print()
    for key, seconds in cpu_per_request.items():
        print(f"gateway CPU per request, {key}: {seconds * 1e6:.0f} us")
    targets = _targets(rows, cpu_per_request, batching_ratios) + _against_floor(rows)
    for line in targets:
        print(line)
    _write(args.out, rows, cpu_per_request, targets)


def _find(rows: list[Row], model: str, conc: int, path: str) -> Figures | None:
    return next((f for m, c, p, f in rows if m == model and c == conc and p == path), None)


def _targets(rows: list[Row], cpu: dict[str, float], batching_ratios: list[float]) -> list[str]:
    """The issue's speed targets, each as measured ratio against its goal."""
    lines = []
    echo16, turnout16 = _find(rows, "simple", 16, "echo server, gRPC"), _find(rows, "simple", 16, "turnout, gRPC")
    if echo16 and turnout16:
        ratio = turnout16.throughput / echo16.throughput
        lines.append(f"simple gRPC c16 req/s vs echo: {ratio:.0%} (goal >= 50%)")
    echo1, turnout1 = _find(rows, "simple", 1, "echo server, gRPC"), _find(rows, "simple", 1, "turnout, gRPC")
    if echo1 and turnout1:
        lines.append(f"simple gRPC c1 p50 vs echo: {turnout1.p50_ms / echo1.p50_ms:.2f}x (goal <= 2x)")
    http_echo = _find(rows, "simple", 16, "echo server, HTTP (uvicorn)")
    http16 = _find(rows, "simple", 16, "turnout, HTTP binary")
    if http_echo and http16:
        lines.append(
            f"simple HTTP c16 req/s vs uvicorn echo: {http16.throughput / http_echo.throughput:.0%} (goal >= 40%)"
        )
    if batching_ratios:
        median = batching_ratios[len(batching_ratios) // 2]
        each = ", ".join(f"{ratio:.2f}x" for ratio in batching_ratios)
        lines.append(
            f"MLP dynamic batching on vs off: {median:.2f}x, the median of {len(batching_ratios)} "
            f"alternating pairs ({each}) (goal >= 3x)"
        )
    grpc_cpu = [v for k, v in cpu.items() if k.startswith("simple c16 grpc")]
    if grpc_cpu:
        lines.append(f"gateway CPU per gRPC request (simple c16): {grpc_cpu[0] * 1e6:.0f} us (goal <= 110 us, at c32)")
    return lines


def _against_floor(rows: list[Row]) -> list[str]:
    """simple through turnout as a ratio of the floor: req/s (higher is better) and p50."""
    lines = []
    for model, conc, path, floor in rows:
        protocol = path.removeprefix("floor, ")
        if model != "simple" or not path.startswith("floor, "):
            continue
        turnout = _find(rows, model, conc, f"turnout, {protocol}")
        if turnout is not None:
            lines.append(
                f"simple {protocol} c{conc} turnout vs floor: req/s {turnout.throughput / floor.throughput:.0%}, "
                f"p50 {turnout.p50_ms / floor.p50_ms:.2f}x ({turnout.throughput:.0f} vs {floor.throughput:.0f} req/s)"
            )
    return lines


def _write(out: Path, rows: list[Row], cpu: dict[str, float], targets: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    table = ["| model | concurrency | path | req/s | p50 ms | p99 ms |", "|---|---|---|---|---|---|"]
    table += [f"| {m} | {c} | {p} | {f.throughput:.0f} | {f.p50_ms:.2f} | {f.p99_ms:.2f} |" for m, c, p, f in rows]
    table += ["", *(f"- gateway CPU per request, {k}: {v * 1e6:.0f} us" for k, v in cpu.items())]
    table += ["", *(f"- {line}" for line in targets)]
    (out / "results.md").write_text("\n".join(table) + "\n")
    with (out / "results.csv").open("w") as csv_file:
        csv_file.write("model,concurrency,path,requests_per_s,p50_ms,p99_ms\n")
        for m, c, p, f in rows:
            csv_file.write(f"{m},{c},{p},{f.throughput:.1f},{f.p50_ms:.3f},{f.p99_ms:.3f}\n")
    groups = sorted({(m, c) for m, c, _, _ in rows})
    figure, axes = plt.subplots(len(groups), 1, figsize=(8, 2.2 * len(groups)), squeeze=False)
    for axis, (model, conc) in zip(axes[:, 0], groups, strict=True):
        cells = [(p, f) for m, c, p, f in rows if (m, c) == (model, conc) and not p.startswith("in-process")]
        axis.barh([p for p, _ in cells], [f.throughput for _, f in cells])
        axis.set_title(f"{model}, concurrency {conc} (req/s)", fontsize=9)
        axis.tick_params(labelsize=8)
    figure.tight_layout()
    figure.savefig(out / "throughput.png", dpi=90)
    plt.close(figure)
    print(f"results written to {out}")


def _print(rows: list[tuple[str, int, str, Figures]]) -> None:
    base = rows[0][3].throughput
    print(f"\n{'model':<8}{'conc':>5}  {'path':<27}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'vs in-proc':>12}")
    for model, conc, path, f in rows:
        ratio = f.throughput / base
        print(f"{model:<8}{conc:>5}  {path:<27}{f.throughput:>10.0f}{f.p50_ms:>9.2f}{f.p99_ms:>9.2f}{ratio:>11.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
