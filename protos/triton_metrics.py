"""Triton's Prometheus metrics: the family names, types and HELP texts, their rendering
in the text format, the fleet sum of several scrapes, the host gauges (CPU from /proc,
GPUs through NVML where one exists), and a small threaded `/metrics` endpoint.

prometheus_client would print counters as `<name>_total`; Triton's dashboards expect the
bare names, so these families are rendered here, not through a CollectorRegistry.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

# The text exposition format, named as Triton's metrics port names it.
_CONTENT_TYPE = "text/plain; charset=utf-8"
log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]
T = TypeVar("T")

# (name, type, HELP) in Triton's order. A family without samples is not rendered, as
# Triton's Prometheus library leaves out an empty family (the GPU ones on a host without).
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
HOST_FAMILIES = frozenset(name for name, _, _ in FAMILIES if name.startswith(("nv_cpu_", "nv_gpu_", "nv_energy")))
# Gauges a fleet sum must not add up across replicas: the largest is the fleet's value.
_MAXIMA = frozenset({"nv_model_load_duration_secs"})
# Kinds whose samples only grow while their process lives.
MONOTONIC_KINDS = frozenset({"counter", "histogram", "summary"})
Sample = tuple[str, str, Labels]  # family, sample name, labels


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


class Exposition:
    """Families and their samples, rendered in the Prometheus text format."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str]] = {name: (kind, text) for name, kind, text in FAMILIES}
        self._samples: dict[str, dict[tuple[str, Labels], float]] = {name: {} for name, _, _ in FAMILIES}

    def declare(self, family: str, kind: str, text: str) -> None:
        if family not in self._families:
            self._families[family] = (kind, text)
            self._samples[family] = {}

    def add(self, family: str, labels: Labels, value: float, sample: str = "") -> None:
        """Add `value` to a sample (`sample` defaults to the family's own name)."""
        samples = self._samples[family]
        key = (sample or family, labels)
        if family in _MAXIMA:
            samples[key] = max(samples.get(key, value), value)
        else:
            samples[key] = samples.get(key, 0.0) + value

    def merge_text(self, text: str, skip: Iterable[str] = ()) -> None:
        """Sum a scrape's samples into these (a fleet's replicas add up)."""
        skipped = frozenset(skip)
        for family in text_string_to_metric_families(text):
            name = family.name
            if name in skipped:
                continue
            if name not in self._families:
                self.declare(name, family.type, family.documentation)
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                # The parser names counter samples `<name>_total`; Triton's are bare.
                sample_name = name if family.type == "counter" and sample.name == f"{name}_total" else sample.name
                self.add(name, labels, sample.value, sample_name)

    def merge(self, other: Exposition) -> None:
        """Sum another exposition's samples into these."""
        for family, (kind, text) in other._families.items():
            self.declare(family, kind, text)
            for (sample, labels), value in other._samples[family].items():
                self.add(family, labels, value, sample)

    def monotonic(self) -> dict[Sample, float]:
        """The samples of counters and histograms, which only grow while their process lives."""
        return {
            (family, sample, labels): value
            for family, (kind, _) in self._families.items()
            if kind in MONOTONIC_KINDS
            for (sample, labels), value in self._samples[family].items()
        }

    def kind(self, family: str) -> tuple[str, str]:
        """A declared family's type and HELP text."""
        return self._families[family]

    def counters(self) -> Exposition:
        """A copy holding only the monotonic samples: what a departed process still counts."""
        copy = Exposition()
        for (family, sample, labels), value in self.monotonic().items():
            copy.declare(family, *self.kind(family))
            copy.add(family, labels, value, sample)
        return copy

    def render(self) -> str:
        lines: list[str] = []
        for family, (kind, text) in self._families.items():
            samples = self._samples[family]
            if not samples:
                continue
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
            for (sample, labels), value in samples.items():
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{sample}{{{rendered}}} {_number(value)}" if rendered else f"{sample} {_number(value)}")
        return "\n".join(lines) + "\n"


def model_labels(model: str, version: str) -> Labels:
    return (("model", model), ("version", version))


def add_statistics(exposition: Exposition, stats: Any) -> None:
    """A ModelStatistics message as Triton's per-model counters (its failures as OTHER:
    the statistics extension does not say why a request failed)."""
    labels = model_labels(stats.name, stats.version)
    s = stats.inference_stats
    add = exposition.add
    add("nv_inference_request_success", labels, s.success.count)
    # Labels in name order, as merge_text keeps a scrape's, so both land on one sample.
    add("nv_inference_request_failure", tuple(sorted((*labels, ("reason", "OTHER")))), s.fail.count)
    add("nv_inference_count", labels, stats.inference_count)
    add("nv_inference_exec_count", labels, stats.execution_count)
    add("nv_inference_request_duration_us", labels, (s.success.ns + s.fail.ns) // 1000)
    add("nv_inference_queue_duration_us", labels, s.queue.ns // 1000)
    add("nv_inference_compute_input_duration_us", labels, s.compute_input.ns // 1000)
    add("nv_inference_compute_infer_duration_us", labels, s.compute_infer.ns // 1000)
    add("nv_inference_compute_output_duration_us", labels, s.compute_output.ns // 1000)


class HostGauges:
    """nv_cpu_* from /proc (utilization over the time since the previous scrape) and
    nv_gpu_* through NVML, only where pynvml imports and finds a GPU."""

    def __init__(self) -> None:
        self._last_cpu: tuple[int, int] | None = _cpu_times()
        self._nvml: Any = _nvml()

    def add_to(self, exposition: Exposition) -> None:
        now = _cpu_times()
        if now is not None and self._last_cpu is not None:
            busy, total = now[0] - self._last_cpu[0], now[1] - self._last_cpu[1]
            exposition.add("nv_cpu_utilization", (), busy / total if total > 0 else 0.0)
        self._last_cpu = now
        memory = _memory()
        if memory is not None:
            exposition.add("nv_cpu_memory_total_bytes", (), memory[0])
            exposition.add("nv_cpu_memory_used_bytes", (), memory[1])
        if self._nvml is not None:
            self._add_gpus(exposition)

    def _add_gpus(self, exposition: Exposition) -> None:
        nvml = self._nvml
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                labels = (("gpu_uuid", uuid.decode() if isinstance(uuid, bytes) else str(uuid)),)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                exposition.add("nv_gpu_utilization", labels, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
                exposition.add("nv_gpu_memory_total_bytes", labels, memory.total)
                exposition.add("nv_gpu_memory_used_bytes", labels, memory.used)
                exposition.add("nv_gpu_power_usage", labels, nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
                exposition.add("nv_gpu_power_limit", labels, nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
                energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000
                exposition.add("nv_energy_consumption", labels, energy)
        except Exception:  # a GPU that stops answering must not fail the scrape
            log.debug("NVML query failed", exc_info=True)


def _nvml() -> Any:
    try:
        import pynvml  # optional: installed with the GPU extras only
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
    except Exception:  # no driver, no device: no GPU metrics
        return None
    return pynvml


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, from the first line of /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _memory() -> tuple[int, int] | None:
    """(total, used) bytes of RAM, used = MemTotal - MemAvailable as Triton reports it."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


class _Handler(BaseHTTPRequestHandler):
    """A scrape, answered as Triton's metrics server answers: HTTP/1.1, its type and length,
    and no `Server` or `Date` header (Python's `Server` would name its version)."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._reply(*self.server.endpoint.answer(self.path.partition("?")[0]))

    def _not_allowed(self) -> None:
        self._reply(405, "text/plain", b'{"error":"Method Not Allowed"}', "Not Allowed")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

    def _reply(self, status: int, content_type: str, body: bytes, reason: str | None = None) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":  # Triton writes one even then; a client keeping the connection would misread it
            self.wfile.write(body)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.send_response_only(code, message)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        super().__init__((host, port), _Handler)


def on_loop(
    render: Callable[[], Coroutine[Any, Any, T]], loop: asyncio.AbstractEventLoop, timeout: float = 5.0
) -> Callable[[], T]:
    """A scrape that runs the coroutine `render` on `loop`, where the counters live, so
    nothing it reads changes under it."""

    def scrape() -> T:
        return asyncio.run_coroutine_threadsafe(render(), loop).result(timeout)

    return scrape


class MetricsEndpoint:
    """Serves `/metrics` (and `/metrics/`) on its own thread; each scrape calls `render`.
    `others` serves more paths the same way."""

    def __init__(
        self, host: str, port: int, render: Callable[[], bytes], others: Mapping[str, Callable[[], bytes]] | None = None
    ) -> None:
        self._renders = {"/metrics": render, "/metrics/": render, **(others or {})}
        self._server = _Server(host, port, self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """The status, type and body of a scrape of `path` (run on the server's thread)."""
        render = self._renders.get(path)
        if render is None:  # as Triton's: any other path answers, empty
            return 200, _CONTENT_TYPE, b""
        try:
            return 200, _CONTENT_TYPE, render()
        except Exception:
            log.warning("metrics could not be rendered for this scrape", exc_info=True)
            return 503, "text/plain", b"metrics unavailable"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
