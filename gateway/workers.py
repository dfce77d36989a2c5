"""--gateway-workers N: N gateway processes serve the same HTTP and gRPC ports, so all of
a host's cores serve (one Python process uses about one).

Each worker is a whole gateway listening on the ports itself (SO_REUSEPORT), and the
kernel spreads incoming connections over them. The parent process serves only the
metrics port and keeps the workers: it starts them, passes SIGTERM and SIGINT on (each
worker drains as a lone gateway does), and when one dies it stops the others and exits
with a failure, so that whatever runs the gateway starts it again whole: a new worker
alone would lack what the others hold.

What a client changes through one worker, every worker holds before the client is
answered: registered shared-memory regions, log and trace settings, and what a model
load or unload changes. The worker that took the request applies it, then has its
siblings apply it over their control sockets (gRPC on Unix sockets in a folder the
parent owns). What each worker counts alone adds up: an ensemble's statistics (ensembles
run in the gateway) are summed over the workers, and the metrics port sums the workers'
own families and adds the fleet's Triton families once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import httpx
from google.protobuf.message import Message

from gateway.metrics_port import FLEET_PATH, OWN_PATH
from gateway.settings import GatewaySettings, WorkerPlace
from protos import event_loop
from protos import grpc_service_pb2 as pb
from protos.children import die_with_parent
from protos.ready import GATEWAY_READY, join_host_port, parse_ready, ready_line
from protos.status import TurnoutError, internal
from protos.triton_metrics import MetricsEndpoint, on_loop

logger = logging.getLogger(__name__)

WORKER_READY = "GATEWAY_WORKER_READY"
SERVICE = "turnout.GatewayWorker"
SHARE_TIMEOUT_SECS = 10.0
START_TIMEOUT_SECS = 60.0

# The changes every worker holds alike, by the RPC that makes them, and the query that
# sums what each counts alone.
SHM_REGISTER = "SystemSharedMemoryRegister"
SHM_UNREGISTER = "SystemSharedMemoryUnregister"
CUDA_SHM_REGISTER = "CudaSharedMemoryRegister"
CUDA_SHM_UNREGISTER = "CudaSharedMemoryUnregister"
TRACE_SETTING = "TraceSetting"
LOG_SETTINGS = "LogSettings"
MODELS_CHANGED = "ModelsChanged"  # a load or unload went through (the request names the model)
# The dependency graph's state after a load or unload: parameters `implicit` and `held` (JSON).
DEPENDENCIES = "Dependencies"
ENSEMBLE_STATISTICS = "EnsembleStatistics"

SHARED: dict[str, type[Message]] = {
    SHM_REGISTER: pb.SystemSharedMemoryRegisterRequest,
    SHM_UNREGISTER: pb.SystemSharedMemoryUnregisterRequest,
    CUDA_SHM_REGISTER: pb.CudaSharedMemoryRegisterRequest,
    CUDA_SHM_UNREGISTER: pb.CudaSharedMemoryUnregisterRequest,
    TRACE_SETTING: pb.TraceSettingRequest,
    LOG_SETTINGS: pb.LogSettingsRequest,
    MODELS_CHANGED: pb.RepositoryModelLoadRequest,
    DEPENDENCIES: pb.RepositoryModelLoadRequest,
}

Apply = Callable[[str, Any], Awaitable[None]]


class Siblings:
    """This worker's siblings, over their control sockets; none without --gateway-workers.
    Create it inside the event loop that uses it."""

    def __init__(self, sockets: Sequence[str] = ()) -> None:
        self._channels = [grpc.aio.insecure_channel(f"unix:{path}") for path in sockets]

    async def share(self, method: str, request: Message) -> None:
        """Have every sibling apply `request`, applied here already; raises INTERNAL
        naming the siblings that did not."""
        if not self._channels:
            return
        calls = [
            channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=_serialize)(
                request, timeout=SHARE_TIMEOUT_SECS, wait_for_ready=True
            )
            for channel in self._channels
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            details = failures[0].details() if isinstance(failures[0], grpc.aio.AioRpcError) else failures[0]
            raise internal(
                f"the change was applied by this gateway worker but not by {len(failures)} of its "
                f"{len(self._channels)} siblings: {details}"
            )

    async def ensemble_statistics(self) -> list[pb.ModelStatisticsResponse]:
        """Each sibling's ensemble counters."""
        if not self._channels:
            return []
        calls = [
            channel.unary_unary(
                f"/{SERVICE}/{ENSEMBLE_STATISTICS}",
                request_serializer=_serialize,
                response_deserializer=pb.ModelStatisticsResponse.FromString,
            )(pb.ModelStatisticsRequest(), timeout=SHARE_TIMEOUT_SECS, wait_for_ready=True)
            for channel in self._channels
        ]
        answers: list[pb.ModelStatisticsResponse] = []
        for answer in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(answer, BaseException):
                raise internal(f"a gateway worker's ensemble statistics could not be read: {answer}")
            answers.append(answer)
        return answers

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))


def _serialize(message: Message) -> bytes:
    serialized: bytes = message.SerializeToString()
    return serialized


def control_server(
    path: str, apply: Apply, ensemble_statistics: Callable[[], Sequence[pb.ModelStatistics]]
) -> grpc.aio.Server:
    """A worker's control socket: its siblings' changes (`apply`) and its ensemble counters."""

    def applying(method: str) -> Callable[[Message, grpc.aio.ServicerContext], Awaitable[pb.ServerLiveResponse]]:
        async def handle(request: Message, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
            try:
                await apply(method, request)
            except TurnoutError as exc:
                await context.abort(grpc.StatusCode.INTERNAL, exc.message)
            return pb.ServerLiveResponse()

        return handle

    async def statistics(request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Message:
        return pb.ModelStatisticsResponse(model_stats=ensemble_statistics())

    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            applying(method), request_deserializer=message.FromString, response_serializer=_serialize
        )
        for method, message in SHARED.items()
    }
    handlers[ENSEMBLE_STATISTICS] = grpc.unary_unary_rpc_method_handler(
        statistics, request_deserializer=pb.ModelStatisticsRequest.FromString, response_serializer=_serialize
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"unix:{path}")
    return server


# --- the parent ------------------------------------------------------------------------


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) with SO_REUSEPORT to `port` (0: a free one), which
    keeps the port the workers share from anyone outside their group."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[str]
    metrics: str = ""  # host:port of its own metrics endpoint


def run(settings: GatewaySettings) -> int:
    """Serve with settings.workers worker processes until SIGTERM/SIGINT; the exit status."""
    if not hasattr(socket, "SO_REUSEPORT"):
        print("turnout gateway: --gateway-workers needs SO_REUSEPORT, which this system lacks", file=sys.stderr)
        return 1
    from gateway.app import PortUnavailable

    try:
        return event_loop.run(_serve(settings), settings.event_loop)
    except (PortUnavailable, OSError) as exc:
        print(f"turnout gateway: {exc}", file=sys.stderr, flush=True)
        return 1


def _refused(settings: GatewaySettings, what: str, port: int, flag: str, exc: OSError) -> Exception:
    """A port the gateway cannot take, in the words a one-process gateway uses."""
    from gateway.app import port_unavailable  # gateway.app imports this module

    return port_unavailable(what, settings.host, port, flag, str(exc.strerror))


def _reserve(settings: GatewaySettings, what: str, port: int, flag: str) -> socket.socket:
    try:
        return reserve_port(settings.host, port)
    except OSError as exc:
        raise _refused(settings, what, port, flag, exc) from None


async def _serve(settings: GatewaySettings) -> int:
    reserved = []
    http_port, grpc_port = settings.http_port, settings.grpc_port
    if settings.allow_http:
        reserved.append(_reserve(settings, "HTTP", http_port, "--http-port"))
        http_port = reserved[-1].getsockname()[1]
    if settings.allow_grpc:
        reserved.append(_reserve(settings, "gRPC", grpc_port, "--grpc-port"))
        grpc_port = reserved[-1].getsockname()[1]
    folder = tempfile.mkdtemp(prefix="turnout-gateway-")
    controls = [os.path.join(folder, f"worker-{index}.sock") for index in range(settings.workers)]
    workers: list[_Worker] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    endpoint: MetricsEndpoint | None = None
    metrics: WorkerMetrics | None = None
    status = 0
    try:
        for index, control in enumerate(controls):
            place = WorkerPlace(index, control, tuple(c for c in controls if c != control))
            worker_settings = replace(settings, workers=1, http_port=http_port, grpc_port=grpc_port, worker=place)
            workers.append(_start(index, worker_settings, folder))
        started = await asyncio.wait_for(
            asyncio.gather(*(asyncio.to_thread(_wait_ready, w) for w in workers)), START_TIMEOUT_SECS
        )
        if not all(started):
            return 1
        addresses: dict[str, str] = {}
        if settings.allow_http:
            addresses["http"] = join_host_port(settings.host, http_port)
        if settings.allow_grpc:
            addresses["grpc"] = join_host_port(settings.host, grpc_port)
        if settings.allow_metrics:
            metrics = WorkerMetrics(workers)
            try:
                endpoint = MetricsEndpoint(settings.host, settings.metrics_port, on_loop(metrics.render, loop))
            except OSError as exc:
                raise _refused(settings, "metrics", settings.metrics_port, "--metrics-port", exc) from None
            addresses["metrics"] = join_host_port(settings.host, endpoint.port)
        print(ready_line(GATEWAY_READY, **addresses, workers=len(workers)), flush=True)
        exited = asyncio.ensure_future(_first_exit(workers))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if exited.done():
            worker = exited.result()
            logger.error(
                "gateway worker %d exited with status %s; stopping the others",
                worker.index,
                worker.process.returncode,
            )
            status = 1
        else:
            exited.cancel()
    except TimeoutError:
        logger.error("the gateway workers did not all start within %.0f s", START_TIMEOUT_SECS)
        status = 1
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        statuses = await asyncio.gather(*(asyncio.to_thread(w.process.wait) for w in workers))
        if endpoint is not None:
            endpoint.close()
        if metrics is not None:
            await metrics.close()
        for sock in reserved:
            sock.close()
        for path in controls:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return status or max((s for s in statuses if s > 0), default=0)


def _start(index: int, settings: GatewaySettings, folder: str) -> _Worker:
    path = os.path.join(folder, f"worker-{index}.settings")
    with open(path, "wb") as file:
        pickle.dump(settings, file)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.workers", path],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    return _Worker(index, process)


def _wait_ready(worker: _Worker) -> bool:
    """Read the worker's ready line (then keep passing its output on); False when it
    exited first."""
    stdout = worker.process.stdout
    assert stdout is not None
    for line in stdout:
        fields = parse_ready(line, WORKER_READY)
        if fields is not None:
            worker.metrics = fields.get("metrics", "")
            _pass_on(stdout)
            return True
        sys.stdout.write(line)
    logger.error("gateway worker %d exited with status %s before it served", worker.index, worker.process.wait())
    return False


def _pass_on(stream: Any) -> None:
    def copy() -> None:
        for line in stream:
            sys.stdout.write(line)

    threading.Thread(target=copy, daemon=True).start()


async def _first_exit(workers: Sequence[_Worker]) -> _Worker:
    while True:
        for worker in workers:
            if worker.process.poll() is not None:
                return worker
        await asyncio.sleep(0.2)


class WorkerMetrics:
    """The metrics port of a gateway with workers: each worker's own families (what it
    counted), summed, and the fleet's Triton families once, from the first worker that
    answers. Each worker remembers departed replicas on its own, so two workers' fleet
    views can differ by a little; counters never go back when the answering worker
    changes (`FleetHighWater`)."""

    def __init__(self, workers: Sequence[_Worker], timeout: float = 2.0) -> None:
        self._workers = workers
        self._http = httpx.AsyncClient(timeout=timeout)
        self._fleet = FleetHighWater()

    async def render(self) -> bytes:
        answers = await asyncio.gather(
            *(self._http.get(f"http://{w.metrics}{OWN_PATH}") for w in self._workers), return_exceptions=True
        )
        texts = []
        for worker, answer in zip(self._workers, answers, strict=True):
            if isinstance(answer, BaseException) or answer.status_code != 200:
                logger.warning("metrics of gateway worker %d left out of this scrape: %s", worker.index, answer)
            else:
                texts.append(answer.text)
        for worker in self._workers:
            with contextlib.suppress(httpx.HTTPError):
                fleet = await self._http.get(f"http://{worker.metrics}{FLEET_PATH}")
                if fleet.status_code == 200:
                    texts.append(self._fleet.hold(fleet.text))
                    break
        return sum_expositions(texts).encode()

    async def close(self) -> None:
        await self._http.aclose()


class FleetHighWater:
    """The largest value each counter sample of the fleet's exposition has shown. A
    scrape answered by another worker than the last may count a departed replica's past
    a little lower; Prometheus would read that as a counter reset and count the whole
    total again in rate(), so such a sample shows its largest value instead."""

    def __init__(self) -> None:
        self._marks: dict[str, float] = {}

    def hold(self, text: str) -> str:
        lines = text.splitlines()
        kind = ""
        for index, line in enumerate(lines):
            if line.startswith("# TYPE "):
                kind = line.split(maxsplit=3)[3]
            elif line and not line.startswith("#") and _monotonic(kind, line):
                key, _, value = line.rpartition(" ")
                number = float(value)
                mark = self._marks.get(key)
                if mark is not None and number < mark:
                    lines[index] = f"{key} {_number(mark)}"
                else:
                    self._marks[key] = number
        return "\n".join(lines) + "\n"


def _monotonic(kind: str, sample: str) -> bool:
    """Whether a sample only grows: a counter's, a histogram's, and a summary's count and
    sum (its quantiles move both ways)."""
    if kind == "summary":
        return "quantile=" not in sample
    return kind in ("counter", "histogram")


def sum_expositions(texts: Sequence[str]) -> str:
    """Prometheus text expositions of the same families combined sample by sample, in the
    order families first appear. Counters, histograms and summaries add up; a gauge
    states what a worker sees (the replicas it knows), so it keeps the largest, and a
    counter's `*_created` time the earliest."""
    families: dict[str, tuple[list[str], dict[str, float]]] = {}
    for text in texts:
        samples: dict[str, float] | None = None
        combine: Callable[[float, float], float] = operator.add
        heads: list[str] = []
        for line in text.splitlines():
            if line.startswith("# HELP "):
                heads = [line]
            elif line.startswith("# TYPE "):
                _, _, name, kind = line.split(maxsplit=3)
                heads.append(line)
                samples = families.setdefault(name, (heads, {}))[1]
                combine = min if name.endswith("_created") else max if kind == "gauge" else operator.add
            elif line and not line.startswith("#") and samples is not None:
                key, _, value = line.rpartition(" ")
                number = float(value)
                samples[key] = combine(samples[key], number) if key in samples else number
    lines: list[str] = []
    for heads, samples in families.values():
        lines += heads
        lines += [f"{key} {_number(value)}" for key, value in samples.items()]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _worker_main(path: str) -> int:
    from gateway.app import run as run_gateway

    with open(path, "rb") as file:
        settings: GatewaySettings = pickle.load(file)
    os.unlink(path)
    return run_gateway(settings)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1]))
