"""Closed-loop load: N concurrent callers, each sending its next request when the last returns."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Figures:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds


def _figures(latencies: list[float], seconds: float) -> Figures:
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Figures(len(latencies), seconds, statistics.median(latencies) * 1e3, p99 * 1e3)


async def run_async(call: Callable[[], Awaitable[object]], concurrency: int, warmup: float, duration: float) -> Figures:
    """Drive an async call from `concurrency` tasks; measure only after the warm-up."""
    latencies: list[float] = []
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + duration

    async def caller() -> None:
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                return
            await call()
            if began >= measure_from:
                latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return _figures(latencies, duration)


def run_threads(call: Callable[[], object], concurrency: int, warmup: float, duration: float) -> Figures:
    """The same closed loop on threads, for blocking in-process calls."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + duration

    def caller() -> None:
        mine = []
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                break
            call()
            if began >= measure_from:
                mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(caller) for _ in range(concurrency)]:
            future.result()
    return _figures(latencies, duration)
