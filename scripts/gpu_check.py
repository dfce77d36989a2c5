"""GPU check for turnout: run it as `scripts/gpu-check` (or `.venv/bin/python -m scripts.gpu_check`) on a machine with
an NVIDIA GPU (CUDA torch, onnxruntime-gpu; tensorrt optional). It serves one MLP as
ONNX and TorchScript on CPU and on KIND_GPU through `turnout up`, compares GPU outputs
with the CPU ones, builds and serves a TensorRT engine from the ONNX model when
`tensorrt` imports, times every variant with the same batched load, and prints a table.
Then it serves `simple` through `turnout up --gateway-workers N` for each N of --workers
(1, 2, 4, 8), driven by --clients client processes over gRPC and HTTP binary, and prints
what the gateway's processes and the sidecar spent a request: how far more workers carry
on a host with cores to spare (`--workers-only` runs that part alone, on any machine).

It builds its repository first, then stops with status 2 and one line where no GPU is
visible, so a CPU machine can dry-run it that far. Budget: well under 10 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from bench.__main__ import _cpu_seconds, _gateway_cpu, _grpc, _http, _inputs, children_running
from protos.ready import GATEWAY_READY, parse_ready
from scripts.make_models import write_mlp, write_simple, write_torch_mlp

ROOT = Path(__file__).resolve().parent.parent

SIZES = (512, 2048, 2048, 10)
BATCH = 8
GPU = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
TENSORRT_EP = 'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }'
TOLERANCE = 2e-2  # GPU kernels (TF32, fused GEMMs) round differently from CPU ones


def build_repository(repo: Path) -> list[tuple[str, str, str]]:
    """The models to check as (name, reference CPU model, what it exercises)."""
    batching = "dynamic_batching { }"
    write_mlp(repo, "mlp_cpu", SIZES, extra_config=batching + "\ninstance_group [ { kind: KIND_CPU count: 1 } ]")
    write_mlp(repo, "mlp_onnx_gpu", SIZES, extra_config=f"{batching}\n{GPU}")
    write_mlp(repo, "mlp_onnx_trt_ep", SIZES, extra_config=f"{batching}\n{GPU}\n{TENSORRT_EP}")
    write_torch_mlp(repo, "mlp_torch_cpu", SIZES, extra_config=batching + "\ninstance_group [ { kind: KIND_CPU } ]")
    write_torch_mlp(repo, "mlp_torch_gpu", SIZES, extra_config=f"{batching}\n{GPU}")
    checks = [
        ("mlp_cpu", "mlp_cpu", "ONNX Runtime, CPU"),
        ("mlp_onnx_gpu", "mlp_cpu", "ONNX Runtime, CUDA EP"),
        ("mlp_onnx_trt_ep", "mlp_cpu", "ONNX Runtime, TensorRT EP"),
        ("mlp_torch_cpu", "mlp_cpu", "TorchScript, CPU"),
        ("mlp_torch_gpu", "mlp_cpu", "TorchScript, cuda:0"),
    ]
    if build_engine(repo / "mlp_cpu" / "1" / "model.onnx", repo / "mlp_plan"):
        checks.append(("mlp_plan", "mlp_cpu", "TensorRT engine"))
    return checks


def build_engine(onnx_file: Path, model_dir: Path) -> bool:
    """A TensorRT engine of the ONNX model with one profile for batches 1..64; no config,
    so the sidecar completes it from the engine's I/O."""
    try:
        import tensorrt as trt
    except ImportError:
        print("gpu-check: tensorrt is not importable; the TensorRT engine row is skipped")
        return False
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_file.read_bytes()):
        raise SystemExit(f"gpu-check: TensorRT could not parse {onnx_file}: {parser.get_error(0)}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("INPUT0", (1, SIZES[0]), (BATCH, SIZES[0]), (64, SIZES[0]))
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.plan").write_bytes(bytes(engine))
    (model_dir / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    return True


def ran_on(repo: Path, name: str) -> str:
    """Where a check's model actually runs. ONNX Runtime drops a provider it cannot start
    and runs on CPU instead, so ask a session opened as the sidecar opens it."""
    if name.endswith("_cpu"):
        return "cpu"
    if not name.startswith("mlp_onnx"):
        return "cuda:0"
    import onnxruntime as ort

    from sidecars.onnxruntime.providers import CPU, CUDA, TENSORRT
    from sidecars.onnxruntime.runtime import preload_gpu_libraries

    preload_gpu_libraries()
    wanted = [TENSORRT, CUDA, CPU] if "trt" in name else [CUDA, CPU]
    providers = [provider for provider in wanted if provider in ort.get_available_providers()]
    session = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=providers)
    used = [provider.removesuffix("ExecutionProvider") for provider in session.get_providers() if provider != CPU]
    return "+".join(used) or "CPU (fallback)"


def describe() -> None:
    """The versions and device the table was measured with."""
    import onnxruntime as ort
    import torch

    print(f"gpu-check: torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print(f"gpu-check: onnxruntime {ort.__version__}, providers {', '.join(ort.get_available_providers())}")


def gpu_visible() -> str | None:
    """Why no GPU can be checked, or None when torch sees one."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (is this a CPU build or a machine without a GPU?)"
    return None


def serve(repo: Path, *flags: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`turnout up` on `repo`, and the addresses its ready line gives."""
    command = [sys.executable, "-m", "turnout", "up", f"--model-repository={repo}", "--host=127.0.0.1"]
    command += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--exit-on-error=false", "--log-info=false"]
    process = subprocess.Popen([*command, *flags], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout is not None
    for line in process.stdout:
        fields = parse_ready(line, GATEWAY_READY)
        if fields is not None:
            return process, fields
    raise SystemExit(f"gpu-check: turnout up exited with {process.wait()} before it was ready")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(timeout=60)


# Requests each client process keeps in flight while the gateway's workers are measured.
CLIENT_CONCURRENCY = 16
Scaling = tuple[int, str, float, float, float]  # workers, protocol, req/s, gateway and sidecar CPU us a request


def drive(
    url: str, protocol: str, seconds: float, warmup: float, answered: multiprocessing.Queue[tuple[float, float]]
) -> None:
    """One client process: `simple` at CLIENT_CONCURRENCY for `seconds` after `warmup`;
    puts the requests it sent (warm-up included) and its rate."""
    arrays = _inputs("simple", np.random.default_rng(0))
    run = _grpc if protocol == "grpc" else _http
    figures = asyncio.run(run(url, "simple", arrays, CLIENT_CONCURRENCY, warmup, seconds))
    rate = figures.requests / figures.seconds
    answered.put((rate * (figures.seconds + warmup), rate))


def scale_workers(counts: list[int], clients: int, seconds: float) -> list[Scaling]:
    """For each worker count and protocol: req/s over all clients, and the CPU the
    gateway's processes (parent and workers) and the sidecar spent a request."""
    rows = []
    warmup = 1.0
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gpu-check-workers-") as folder:
        write_simple(Path(folder))
        for count in counts:
            process, addresses = serve(Path(folder), f"--gateway-workers={count}")
            try:
                sidecar = children_running(process.pid, "--framework=onnxruntime")[0]
                for protocol in ("grpc", "http"):
                    gateway_before, sidecar_before = _gateway_cpu(process.pid), _cpu_seconds(sidecar)
                    answered: multiprocessing.Queue[tuple[float, float]] = spawn.Queue()
                    work = (addresses[protocol], protocol, seconds, warmup, answered)
                    drivers = [spawn.Process(target=drive, args=work) for _ in range(clients)]
                    for driver in drivers:
                        driver.start()
                    results = [answered.get(timeout=seconds + 120) for _ in drivers]
                    for driver in drivers:
                        driver.join()
                    sent = sum(requests for requests, _ in results)
                    gateway = (_gateway_cpu(process.pid) - gateway_before) / sent * 1e6
                    used = (_cpu_seconds(sidecar) - sidecar_before) / sent * 1e6
                    rows.append((count, protocol, sum(rate for _, rate in results), gateway, used))
                    print(f"gpu-check: {count} workers, {protocol}: {rows[-1][2]:.0f} req/s", flush=True)
            finally:
                stop(process)
    return rows


def print_scaling(rows: list[Scaling], clients: int) -> None:
    print(
        f"\nsimple through turnout up --gateway-workers N, {clients} client processes of {CLIENT_CONCURRENCY} in flight"
    )
    print(f"{'workers':>8}{'protocol':>10}{'req/s':>10}{'gateway CPU us/req':>20}{'sidecar CPU us/req':>20}")
    for count, protocol, rate, gateway, sidecar in rows:
        print(f"{count:>8}{protocol:>10}{rate:>10.0f}{gateway:>20.0f}{sidecar:>20.0f}")


async def measure(url: str, model: str, batch: np.ndarray, seconds: float) -> tuple[np.ndarray, float, float]:
    """The model's output for `batch`, then its throughput and median latency under 16
    concurrent batched requests for `seconds`."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    try:
        output = (await client.infer(model, [tensor])).as_numpy("OUTPUT0")
        latencies: list[float] = []
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                await client.infer(model, [tensor])
                latencies.append(time.perf_counter() - start)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(16)))
        elapsed = time.monotonic() - started
        return output, len(latencies) * batch.shape[0] / elapsed, float(np.median(latencies) * 1e3)
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="load per model (default 5)")
    parser.add_argument("--workers", default="1,2,4,8", help="gateway worker counts to measure ('' for none)")
    parser.add_argument("--clients", type=int, default=6, help="client processes driving the workers (default 6)")
    parser.add_argument("--workers-only", action="store_true", help="only the gateway workers' scaling (no GPU needed)")
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",") if count]
    if args.workers_only:
        print_scaling(scale_workers(counts, args.clients, args.seconds), args.clients)
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        repo = Path(folder)
        checks = build_repository(repo)
        print(f"gpu-check: built {len(checks)} models in {repo}")
        missing = gpu_visible()
        if missing:
            print(f"gpu-check: no GPU to check: {missing}", file=sys.stderr)
            return 2
        describe()
        process, addresses = serve(repo)
        url = addresses["grpc"]
        try:
            batch = np.random.default_rng(0).standard_normal((BATCH, SIZES[0])).astype(np.float32)
            rows, failures = [], 0
            reference: dict[str, np.ndarray] = {}
            for name, cpu_model, what in checks:
                try:
                    output, rate, p50 = asyncio.run(measure(url, name, batch, args.seconds))
                except InferenceServerException as error:
                    print(f"gpu-check: {name} failed: {error}", file=sys.stderr)
                    failures += 1
                    rows.append((what, name, "FAILED (see above)", float("nan"), False, 0.0, float("nan")))
                    continue
                reference.setdefault(cpu_model, output)
                difference = float(np.max(np.abs(output - reference[cpu_model])))
                ok = difference <= TOLERANCE
                failures += not ok
                rows.append((what, name, ran_on(repo, name), difference, ok, rate, p50))
        finally:
            stop(process)
    scaling = scale_workers(counts, args.clients, args.seconds) if counts else []
    print(f"\n{'variant':<28}{'model':<18}{'ran on':<26}{'max |diff|':>11}{'ok':>5}{'rows/s':>10}{'p50 ms':>9}")
    for what, name, where, difference, ok, rate, p50 in rows:
        print(f"{what:<28}{name:<18}{where:<26}{difference:>11.2e}{'yes' if ok else 'NO':>5}{rate:>10.0f}{p50:>9.2f}")
    if scaling:
        print_scaling(scaling, args.clients)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
