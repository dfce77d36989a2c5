"""Real object-store servers for the remote-repository tests, each its own process on a
free loopback port: moto's S3 server and a GCS emulator; and helpers that put a model
repository into a bucket and take parts of it out again."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.harness import free_port

_RUNNING = re.compile(r"Running on (http://\S+)")

# Fake credentials: moto accepts any. Shared config files are pointed nowhere and the EC2
# metadata service is off, so nothing on the machine changes what the SDK finds.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
ISOLATION = {
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_VARIABLES = (*CREDENTIALS, "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3")
GCS_VARIABLES = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "NO_GCE_CHECK")


class _Bucket:
    """Writes through the store's own fsspec filesystem."""

    def filesystem(self) -> Any:
        raise NotImplementedError

    def create_bucket(self, bucket: str) -> None:
        self.filesystem().mkdir(bucket)

    def upload(self, local: Path, destination: str) -> None:
        """Copy the folder `local` (its contents) to `destination`, "bucket/prefix"."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        self.filesystem().pipe({f"{destination}/{p.relative_to(local).as_posix()}": p.read_bytes() for p in files})

    def remove(self, path: str) -> None:
        """Delete every object under "bucket/prefix"."""
        self.filesystem().rm(path, recursive=True)


@dataclass
class ObjectStore(_Bucket):
    endpoint: str  # http://127.0.0.1:PORT
    process: subprocess.Popen[str]

    @property
    def host_port(self) -> str:
        return self.endpoint.removeprefix("http://")

    def environment(self, *, endpoint: bool = True) -> dict[str, str]:
        """What a process needs to read this store (AWS_ENDPOINT_URL unless the URLs name it)."""
        env = {**CREDENTIALS, **ISOLATION}
        if endpoint:
            env["AWS_ENDPOINT_URL"] = self.endpoint
        return env

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=self.endpoint,
            use_listings_cache=False,
            skip_instance_cache=True,
        )


@dataclass
class GcsStore(_Bucket):
    endpoint: str  # http://127.0.0.1:PORT

    def environment(self) -> dict[str, str]:
        """gcsfs talks to the emulator; google-auth skips the metadata server and, finding
        no credentials, gcsfs goes anonymous (as the emulator wants)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "NO_GCE_CHECK": "true"}

    def filesystem(self) -> Any:
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(token="anon", endpoint_url=self.endpoint, skip_instance_cache=True)


@contextlib.contextmanager
def moto_server() -> Iterator[ObjectStore]:
    """Run `python -m moto.server` on a free loopback port until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        endpoint = _wait_for(process, _RUNNING).group(1)
        # Keep its request log drained, so a busy server never blocks on a full pipe.
        threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
        yield ObjectStore(endpoint, process)
    finally:
        _stop(process)


@contextlib.contextmanager
def gcs_emulator(bucket: str) -> Iterator[GcsStore]:
    """Run a GCS emulator (in memory, with `bucket`) on a free loopback port until the block ends."""
    port = free_port()  # the emulator does not report a port it picked itself
    command = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--in-memory", "--default-bucket", bucket],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        _wait_for(process, re.compile("All services started"))
        threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
        yield GcsStore(f"http://127.0.0.1:{port}")
    finally:
        _stop(process)


def _wait_for(process: subprocess.Popen[str], ready: re.Pattern[str]) -> re.Match[str]:
    """The server's ready line; it prints one at once or exits."""
    seen: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        found = ready.search(line)
        if found:
            return found
    raise AssertionError(f"the server exited before it was ready; output:\n{''.join(seen)}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _drain(stream: Any) -> None:
    for _ in stream:
        pass


# How long a poll may take to show a change in the object store.
POLL_DEADLINE_S = 20.0


def linear_answer(client: Any, version: str = "") -> float:
    """What the `linear` model answers for ones over gRPC: its version's factor."""
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return float(client.infer("linear", [tensor], model_version=version).as_numpy("OUTPUT0")[0, 0])


def wait_for_poll(condition: Callable[[], bool], output: Callable[[], str]) -> None:
    """Wait until `condition` holds; on time-out fail showing the server's `output`."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, output()
        time.sleep(0.1)
