"""`python -m bench` (or `make bench`): simple and an FP32 MLP through the gateway
(gRPC and HTTP binary) beside in-process ONNX Runtime and a plain echo server, and the
same MLP as TorchScript through the gateway's PyTorch sidecar beside in-process torch,
all in one run, so the ratios hold on a noisy machine.
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

from bench.load import Figures, run_async, run_threads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from make_models import write_mlp, write_simple, write_torch_mlp  # noqa: E402

MODELS = {
    "simple": {"INPUT0": ("INT32", (1, 16)), "INPUT1": ("INT32", (1, 16))},
    "mlp": {"INPUT0": ("FP32", (1, 512))},
    "mlp_torch": {"INPUT0": ("FP32", (1, 512))},
}


def _inputs(model: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {}
    for name, (datatype, shape) in MODELS[model].items():
        if datatype == "INT32":
            arrays[name] = rng.integers(-100, 100, shape, dtype=np.int32)
        else:
            arrays[name] = rng.standard_normal(shape, dtype=np.float32)
    return arrays


@contextmanager
def _process(command: list[str], ready_prefix: str) -> Iterator[str]:
    """Start a server process and yield its ready line."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith(ready_prefix):
                yield line.strip()
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
    try:
        return await run_async(lambda: client.infer(model, inputs), conc, warmup, dur)
    finally:
        await client.close()


def _in_process(model_file: Path, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return run_threads(lambda: session.run(None, arrays), conc, warmup, dur)


def _in_process_torch(model_file: Path, arrays: dict[str, np.ndarray], conc: int, warmup: float, dur: float) -> Figures:
    import torch

    module = torch.jit.load(str(model_file))
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}

    def call() -> object:
        with torch.inference_mode():
            return module(**tensors).numpy()

    return run_threads(call, conc, warmup, dur)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="simple,mlp")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    rng = np.random.default_rng(0)

    with tempfile.TemporaryDirectory() as repo:
        write_simple(Path(repo))
        write_mlp(Path(repo))
        with_torch = _has_torch() and "mlp" in models
        if with_torch:
            write_torch_mlp(Path(repo), "mlp_torch")
        gateway_cmd = [sys.executable, "-m", "gateway", "up", f"--model-repository={repo}", "--host=127.0.0.1"]
        gateway_cmd += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--log-info=false"]
        with _process(gateway_cmd, "TURNOUT_READY") as ready:
            fields = dict(part.split("=", 1) for part in ready.split()[1:])
            rows: list[tuple[str, int, str, Figures]] = []
            for model in models:
                arrays = _inputs(model, rng)
                echo_cmd = [sys.executable, "-m", "bench.echo_server", model]
                with _process(echo_cmd, "ECHO_READY") as echo:
                    echo_url = f"127.0.0.1:{echo.split()[1]}"
                    for conc in levels:
                        w, d = args.warmup, args.duration
                        model_file = Path(repo) / model / "1" / "model.onnx"
                        cells = [
                            ("in-process onnxruntime", _in_process(model_file, arrays, conc, w, d)),
                            ("echo server, gRPC", asyncio.run(_grpc(echo_url, model, arrays, conc, w, d))),
                            ("turnout, gRPC", asyncio.run(_grpc(fields["grpc"], model, arrays, conc, w, d))),
                            ("turnout, HTTP binary", asyncio.run(_http(fields["http"], model, arrays, conc, w, d))),
                        ]
                        if with_torch and model == "mlp":
                            torch_file = Path(repo) / "mlp_torch" / "1" / "model.pt"
                            torch_url = fields["grpc"]
                            cells += [
                                ("in-process torch (jit)", _in_process_torch(torch_file, arrays, conc, w, d)),
                                (
                                    "turnout TorchScript, gRPC",
                                    asyncio.run(_grpc(torch_url, "mlp_torch", arrays, conc, w, d)),
                                ),
                            ]
                        rows += [(model, conc, path, figures) for path, figures in cells]
                        _print(rows[-len(cells) :])


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
