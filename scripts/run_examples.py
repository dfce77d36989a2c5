"""Run Triton's Python client examples against `turnout up` and print PASS/FAIL per script.

    python -m scripts.run_examples DIR     (from the repository root) [--only NAME ...] [--timeout 120]

DIR holds the examples from Triton's client repository (src/python/examples); they are
not part of this repository. Two servers start on free ports: one serving the examples'
models with client shared memory on, one in explicit model-control mode for the
*_model_control examples (which expect seven models in the index and load `simple`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.make_models import (
    write_example_repository,
    write_identity,
    write_linear,
    write_simple,
    write_simple_string,
)
from tests.harness import turnout_up

# Examples that run against the default server (HTTP examples take host:port via -u).
SERVED = (
    "simple_http_infer_client.py",
    "simple_grpc_infer_client.py",
    "simple_http_async_infer_client.py",
    "simple_grpc_async_infer_client.py",
    "simple_http_aio_infer_client.py",
    "simple_grpc_aio_infer_client.py",
    "simple_http_string_infer_client.py",
    "simple_grpc_string_infer_client.py",
    "simple_http_shm_client.py",
    "simple_grpc_shm_client.py",
    "simple_http_shm_string_client.py",
    "simple_grpc_shm_string_client.py",
    "simple_http_health_metadata.py",
    "simple_grpc_health_metadata.py",
    "simple_grpc_custom_args_client.py",
    "simple_grpc_keepalive_client.py",
    "grpc_explicit_int_content_client.py",
    "grpc_explicit_byte_content_client.py",
    "grpc_explicit_int8_content_client.py",
    "reuse_infer_objects_client.py",
    "simple_grpc_sequence_sync_infer_client.py",
    "simple_http_sequence_sync_infer_client.py",
    "simple_grpc_sequence_stream_infer_client.py",
    "simple_grpc_aio_sequence_stream_infer_client.py",
)
# The model-control examples count the index: seven models for HTTP, eight for gRPC.
EXPLICIT = {"simple_http_model_control.py": 7, "simple_grpc_model_control.py": 8}
# Need what turnout does not serve here: a GPU (cudashm), image models.
SKIPPED = {
    "simple_http_cudashm_client.py": "needs a CUDA GPU",
    "simple_grpc_cudashm_client.py": "needs a CUDA GPU",
    "simple_grpc_custom_repeat.py": "needs a decoupled model",
    "image_client.py": "needs an image model and an image",
    "grpc_image_client.py": "needs an image model and an image",
    "ensemble_image_client.py": "needs an ensemble image model",
    "grpc_client.py": "needs densenet_onnx",
    "memory_growth_test.py": "needs custom_identity_int32",
}


def build_repository(repo: Path, models: int = 7) -> Path:
    """simple, simple_string, simple_identity, linear, simple_int8 and identities: `models`
    models in all, as the model-control examples count them."""
    write_simple(repo)
    write_simple_string(repo)
    write_identity(repo)
    write_linear(repo)
    write_simple(repo, name="simple_int8", datatype="INT8")
    extra = ["FP32", "INT32", "INT64", "FP64"]
    for datatype in extra[: models - 5]:
        write_identity(repo, name=f"identity_{datatype.lower()}", datatype=datatype)
    return repo


def run_example(script: Path, url: str, timeout: float, extra: tuple[str, ...] = ()) -> tuple[bool, str]:
    try:
        completed = subprocess.run(
            [sys.executable, str(script), "-u", url, *extra],
            cwd=script.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    output = (completed.stdout + completed.stderr).strip()
    return completed.returncode == 0, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("examples", type=Path, help="folder with Triton's client example scripts")
    parser.add_argument("--only", action="append", default=[], help="run only these scripts (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per script")
    parser.add_argument("--verbose", action="store_true", help="print each failing script's output")
    args = parser.parse_args()

    examples: Path = args.examples.resolve()
    if not examples.is_dir():
        parser.error(f"{examples} is not a folder")
    wanted = set(args.only)

    def selected(names: tuple[str, ...]) -> list[Path]:
        return [examples / n for n in names if (not wanted or n in wanted) and (examples / n).exists()]

    failures = 0
    with tempfile.TemporaryDirectory(prefix="turnout-examples-") as tmp:
        runs: list[tuple[list[Path], Path, tuple[str, ...]]] = []
        served = selected(SERVED)
        if served:
            repo = build_repository(Path(tmp) / "repo")
            write_example_repository(repo)  # and the rest of model_repository/: sequence models
            runs.append((served, repo, ("--allow-client-shm=true",)))
        for name, count in EXPLICIT.items():
            scripts = selected((name,))
            if scripts:
                repo = build_repository(Path(tmp) / f"repo_{count}", count)
                runs.append((scripts, repo, ("--model-control-mode=explicit",)))
        for scripts, repo, flags in runs:
            with turnout_up(repo, *flags) as server:
                for script in scripts:
                    # reuse_infer_objects_client picks its protocol with -i: run both.
                    variants = [("", ())]
                    if script.name == "reuse_infer_objects_client.py":
                        variants = [(" (http)", ("-i", "http")), (" (grpc)", ("-i", "grpc"))]
                    if "_sequence_" in script.name:  # -d: the dynamic (oldest, CORRID) sequence models
                        variants = [("", ()), (" (dyna)", ("-d",))]
                    for label, extra in variants:
                        grpc_url = "grpc" in script.name or "grpc" in extra
                        url = server.grpc if grpc_url else server.http
                        ok, output = run_example(script, url, args.timeout, extra)
                        failures += not ok
                        print(f"{'PASS' if ok else 'FAIL'} {script.name}{label}", flush=True)
                        if not ok and args.verbose:
                            print("    " + output.replace("\n", "\n    ")[-3000:], flush=True)
    for name, reason in sorted(SKIPPED.items()):
        if (examples / name).exists() and (not wanted or name in wanted):
            print(f"SKIP {name} ({reason})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
