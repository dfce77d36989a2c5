"""The load itself: inputs built from a model's metadata (random or from a file, inline or
in system shared memory), closed-loop workers at a concurrency or an open loop at a
request rate, and measurement windows repeated until three in a row agree.

Works against any server that speaks the v2 protocol (tritonclient's aio clients)."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
import tritonclient.http.aio as httpclient
from tritonclient.utils import triton_to_np_dtype

STABLE_WINDOWS = 3


@dataclass(frozen=True)
class LoadSettings:
    model: str
    url: str
    protocol: str = "grpc"  # grpc | http
    batch_size: int = 1
    input_data: str = "random"  # random | a JSON file {"INPUT0": [...], ...} or perf_analyzer's {"data": [{...}]}
    shared_memory: str = "none"  # none | system
    warmup_secs: float = 1.0
    window_secs: float = 1.0
    max_windows: int = 10
    stability: float = 0.10  # windows agree when throughput and p50 lie within this of their mean
    metrics_url: str = ""  # host:port of the server's /metrics, for its CPU utilization
    shapes: dict[str, list[int]] = field(default_factory=dict)  # for dynamic dims: NAME -> dims


@dataclass
class Point:
    """One load level's figures, from its stable windows."""

    concurrency: int
    request_rate: float
    throughput: float  # inferences per second (requests x batch size)
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    avg_us: float
    client_cpu: float  # this process's CPU time / wall time
    server_cpu: float  # the server host's nv_cpu_utilization over the windows (-1 if unknown)
    server_queue_us: float  # per request, from the statistics extension
    server_compute_us: float
    windows: int
    stable: bool
    errors: int


class Target:
    """One model on one server: its client and the request it sends."""

    def __init__(self, settings: LoadSettings) -> None:
        self.settings = settings
        self.module: Any = grpcclient if settings.protocol == "grpc" else httpclient
        self.client: Any = self.module.InferenceServerClient(settings.url)
        self.inputs: list[Any] = []
        self._regions: list[tuple[str, Any, int]] = []

    async def prepare(self) -> None:
        s = self.settings
        metadata, config = await self._metadata()
        batched = int(config.get("max_batch_size", 0)) > 0
        arrays = self._arrays(metadata, batched)
        for spec in metadata["inputs"]:
            name = spec["name"]
            array = arrays[name]
            tensor = self.module.InferInput(name, list(array.shape), spec["datatype"])
            if s.shared_memory == "system":
                self._place_in_shared_memory(tensor, name, array)
            elif self.module is httpclient:
                tensor.set_data_from_numpy(array, binary_data=True)
            else:
                tensor.set_data_from_numpy(array)
            self.inputs.append(tensor)
        for region, _, byte_size in self._regions:
            await self.client.register_system_shared_memory(region, region_key(region), byte_size)

    async def _metadata(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.module is grpcclient:
            metadata = await self.client.get_model_metadata(self.settings.model, as_json=True)
            config = (await self.client.get_model_config(self.settings.model, as_json=True))["config"]
            for spec in metadata["inputs"]:
                spec["shape"] = [int(d) for d in spec["shape"]]
            return metadata, {"max_batch_size": int(config.get("max_batch_size", 0))}
        return (
            await self.client.get_model_metadata(self.settings.model),
            await self.client.get_model_config(self.settings.model),
        )

    def _arrays(self, metadata: dict[str, Any], batched: bool) -> dict[str, np.ndarray]:
        s = self.settings
        if s.input_data != "random":
            document = json.loads(Path(s.input_data).read_text())
            if "data" in document:
                document = document["data"][0]
        rng = np.random.default_rng(0)
        arrays = {}
        for spec in metadata["inputs"]:
            name, datatype = spec["name"], spec["datatype"]
            dims = list(s.shapes.get(name, spec["shape"][1:] if batched else spec["shape"]))
            dims = [1 if d < 0 else d for d in dims]
            shape = [s.batch_size, *dims] if batched else dims
            dtype = triton_to_np_dtype(datatype)
            if s.input_data != "random":
                given = document[name]
                values = given["content"] if isinstance(given, dict) else given
                one = np.array(values, dtype=dtype).reshape(dims)
                array = np.stack([one] * s.batch_size) if batched else one
            elif datatype == "BYTES":
                array = np.array([str(v).encode() for v in rng.integers(0, 100, int(np.prod(shape)))], dtype=np.object_)
                array = array.reshape(shape)
            elif datatype == "BOOL":
                array = rng.integers(0, 2, shape).astype(bool)
            elif np.issubdtype(dtype, np.integer):
                array = rng.integers(0, 100, shape).astype(dtype)
            else:
                array = rng.standard_normal(shape).astype(dtype)
            arrays[name] = array
        return arrays

    def _place_in_shared_memory(self, tensor: Any, name: str, array: np.ndarray) -> None:
        import tritonclient.utils.shared_memory as shm

        region = f"turnout_bench_{name}_{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(region, region_key(region), array.nbytes)
        shm.set_shared_memory_region(handle, [array])
        self._regions.append((region, handle, array.nbytes))
        tensor.set_shared_memory(region, array.nbytes)

    async def infer(self) -> None:
        await self.client.infer(self.settings.model, self.inputs)

    async def server_times(self) -> tuple[int, int, int]:
        """(successes, queue ns, compute ns) so far, from the statistics extension."""
        try:
            if self.module is grpcclient:
                answer = await self.client.get_inference_statistics(self.settings.model, as_json=True)
            else:
                answer = await self.client.get_inference_statistics(self.settings.model)
        except Exception:  # a server without the statistics extension: no split
            return 0, 0, 0
        success = queue = compute = 0
        for stats in answer.get("model_stats", []):
            inference = stats.get("inference_stats", {})
            success += int(inference.get("success", {}).get("count", 0))
            queue += int(inference.get("queue", {}).get("ns", 0))
            for part in ("compute_input", "compute_infer", "compute_output"):
                compute += int(inference.get(part, {}).get("ns", 0))
        return success, queue, compute

    async def close(self) -> None:
        import tritonclient.utils.shared_memory as shm

        for region, handle, _ in self._regions:
            try:
                await self.client.unregister_system_shared_memory(region)
            finally:
                shm.destroy_shared_memory_region(handle)
        await self.client.close()


def region_key(region: str) -> str:
    return f"/{region}"


async def server_cpu(metrics_url: str) -> float:
    """The host's nv_cpu_utilization since the previous scrape; -1 if unknown."""
    if not metrics_url:
        return -1.0
    import httpx

    try:
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"http://{metrics_url}/metrics")).text
    except httpx.HTTPError:
        return -1.0
    for line in text.splitlines():
        if line.startswith("nv_cpu_utilization "):
            return float(line.split()[1])
    return -1.0


class _Window:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0


async def measure(
    target: Target,
    concurrency: int = 0,
    request_rate: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
) -> Point:
    """Load at `concurrency` workers (closed loop) or `request_rate` per second (open loop):
    warm up, then measure windows until STABLE_WINDOWS agree or max_windows ran."""
    s = target.settings
    window = _Window()
    stop = asyncio.Event()

    async def one() -> None:
        started = time.perf_counter()
        try:
            await target.infer()
        except Exception:
            window.errors += 1
            return
        window.latencies.append(time.perf_counter() - started)

    async def worker() -> None:
        while not stop.is_set():
            await one()

    async def scheduler() -> None:
        pending: set[asyncio.Task[None]] = set()
        interval = 1.0 / request_rate
        next_at = time.perf_counter()
        while not stop.is_set():
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*pending, return_exceptions=True)

    runners: list[Awaitable[None]] = (
        [scheduler()] if request_rate > 0 else [worker() for _ in range(max(concurrency, 1))]
    )
    tasks = [asyncio.ensure_future(r) for r in runners]
    try:
        await asyncio.sleep(s.warmup_secs)
        results: list[tuple[float, list[float], int, float, float]] = []
        await server_cpu(s.metrics_url)  # starts the server's CPU interval
        before = await target.server_times()
        for index in range(s.max_windows):
            window.latencies, window.errors = [], 0
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(s.window_secs)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            latencies, errors = window.latencies, window.errors
            results.append((len(latencies) / wall, latencies, errors, cpu / wall, wall))
            if progress is not None:
                progress(index + 1, s.max_windows)
            if _stable(results[-STABLE_WINDOWS:], s.stability):
                break
        after = await target.server_times()
        host_cpu = await server_cpu(s.metrics_url)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    used = results[-STABLE_WINDOWS:]
    latencies = sorted(v for r in used for v in r[1])
    served = max(after[0] - before[0], 1)
    return Point(
        concurrency=concurrency,
        request_rate=request_rate,
        throughput=statistics.fmean(r[0] for r in used) * s.batch_size,
        p50_us=_percentile(latencies, 50),
        p90_us=_percentile(latencies, 90),
        p95_us=_percentile(latencies, 95),
        p99_us=_percentile(latencies, 99),
        avg_us=statistics.fmean(latencies) * 1e6 if latencies else 0.0,
        client_cpu=statistics.fmean(r[3] for r in used),
        server_cpu=host_cpu,
        server_queue_us=(after[1] - before[1]) / served / 1000,
        server_compute_us=(after[2] - before[2]) / served / 1000,
        windows=len(results),
        stable=_stable(used, s.stability),
        errors=sum(r[2] for r in results),
    )


def _stable(windows: list[tuple[float, list[float], int, float, float]], tolerance: float) -> bool:
    if len(windows) < STABLE_WINDOWS:
        return False
    throughputs = [w[0] for w in windows]
    medians = [_percentile(sorted(w[1]), 50) for w in windows]
    for values in (throughputs, medians):
        mean = statistics.fmean(values)
        if mean <= 0 or any(abs(v - mean) > tolerance * mean for v in values):
            return False
    return True


def _percentile(ordered: list[float], percent: float) -> float:
    """Microseconds at `percent` of sorted latencies in seconds (nearest rank)."""
    if not ordered:
        return 0.0
    rank = max(0, min(len(ordered) - 1, math.ceil(percent / 100 * len(ordered)) - 1))
    return ordered[rank] * 1e6
