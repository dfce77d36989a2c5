"""The sidecar's `/metrics`: Triton's per-model families from the live counters of every
loaded version, the host's CPU and GPU gauges, and turnout's own batch-size histogram,
queue depth and instance count per model.

Rendered at scrape time on the event loop, so the request path pays nothing for it."""

from __future__ import annotations

from protos.statistics import VersionStatistics
from protos.triton_metrics import FAILURE_REASONS, Exposition, HostGauges, model_labels
from sidecars.models import ModelManager
from sidecars.runtime import MetricsSource

# Powers of two: a dynamic batcher's sizes; the last finite bucket is the usual max_batch_size limit.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class SidecarMetrics:
    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager
        self._host = HostGauges()

    async def render(self) -> bytes:
        exposition = Exposition()
        exposition.declare("turnout_sidecar_batch_size", "histogram", "Rows per model execution, by model")
        exposition.declare("turnout_sidecar_queue_depth", "gauge", "Requests queued for execution, by model")
        exposition.declare("turnout_sidecar_instances", "gauge", "Model instances serving, by model")
        for entry in list(self._manager.models.values()):
            for slot in list(entry.versions.values()):
                loaded = slot.loaded
                if loaded is None:
                    continue
                labels = model_labels(loaded.name, loaded.version_text)
                _add_version(exposition, labels, loaded.stats)
                pending = loaded.batcher.pending
                exposition.add("nv_inference_pending_request_count", labels, pending)
                exposition.add("turnout_sidecar_queue_depth", labels, pending)
                exposition.add("turnout_sidecar_instances", labels, loaded.batcher.instance_count)
                _add_batch_sizes(exposition, labels, loaded.stats)
        runtime = self._manager.runtime
        if isinstance(runtime, MetricsSource):
            runtime.add_metrics(exposition)
        self._host.add_to(exposition)
        return exposition.render().encode()


def _add_version(exposition: Exposition, labels: tuple[tuple[str, str], ...], stats: VersionStatistics) -> None:
    add = exposition.add
    add("nv_inference_request_success", labels, stats.success.count)
    for reason in FAILURE_REASONS:
        add("nv_inference_request_failure", (*labels, ("reason", reason)), stats.failures.get(reason, 0))
    add("nv_inference_count", labels, stats.inference_count)
    add("nv_inference_exec_count", labels, stats.execution_count)
    add("nv_inference_request_duration_us", labels, (stats.success.ns + stats.fail.ns) // 1000)
    add("nv_inference_queue_duration_us", labels, stats.queue.ns // 1000)
    add("nv_inference_compute_input_duration_us", labels, stats.compute_input.ns // 1000)
    add("nv_inference_compute_infer_duration_us", labels, stats.compute_infer.ns // 1000)
    add("nv_inference_compute_output_duration_us", labels, stats.compute_output.ns // 1000)
    add("nv_model_load_duration_secs", labels, round(stats.load_secs, 6))


def _add_batch_sizes(exposition: Exposition, labels: tuple[tuple[str, str], ...], stats: VersionStatistics) -> None:
    # The statistics already count executions per batch size; the histogram is read off them.
    family = "turnout_sidecar_batch_size"
    counts = {size: durations.compute_infer.count for size, durations in stats.batches.items()}
    for bound in BATCH_BUCKETS:
        cumulative = sum(n for size, n in counts.items() if size <= bound)
        exposition.add(family, (*labels, ("le", f"{float(bound)}")), cumulative, f"{family}_bucket")
    exposition.add(family, (*labels, ("le", "+Inf")), sum(counts.values()), f"{family}_bucket")
    exposition.add(family, labels, sum(size * n for size, n in counts.items()), f"{family}_sum")
    exposition.add(family, labels, sum(counts.values()), f"{family}_count")
