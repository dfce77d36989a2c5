"""Model control across a fleet: repository loads and unloads made on every replica of
the owning framework, and the replicas' indexes combined into one answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from gateway.upstream import SidecarClient
from protos import grpc_service_pb2 as pb

logger = logging.getLogger(__name__)

_RESPONSES: dict[str, Any] = {
    "RepositoryModelLoad": pb.RepositoryModelLoadResponse,
    "RepositoryModelUnload": pb.RepositoryModelUnloadResponse,
}


async def on_replicas(replicas: Sequence[SidecarClient], method: str, request: Any) -> None:
    """Make a repository call on every replica at once; once all have answered, the
    first failure (in replica order) is raised."""
    response_type = _RESPONSES[method]
    results = await asyncio.gather(*(r.call(method, request, response_type) for r in replicas), return_exceptions=True)
    for replica, result in zip(replicas, results, strict=True):
        if isinstance(result, BaseException):
            if len(replicas) > 1:
                logger.warning("%s on replica %s failed: %s", method, replica.address, result)
            raise result


def combine_indexes(
    answers: list[tuple[str, Any]],
) -> list[pb.RepositoryIndexResponse.ModelIndex]:
    """`answers`: (framework, index entries) per replica. One entry per framework, model
    and version: READY only when every replica that lists it has it READY, else the first
    other state, its reason prefixed with how many replicas are READY. Sidecars of
    different frameworks are not replicas: a name both list shows twice, as before,
    except entries without a version (a folder not loaded or refused before its
    versions), which every sidecar that reports unassigned folders lists alike."""
    order: list[tuple[str, str, str]] = []
    seen: dict[tuple[str, str, str], list[Any]] = {}
    for framework, models in answers:
        for entry in models:
            key = (framework if entry.version else "", entry.name, entry.version)
            if key not in seen:
                order.append(key)
                seen[key] = []
            seen[key].append(entry)
    combined = []
    for key in order:
        entries = seen[key]
        laggard = next((e for e in entries if e.state != entries[0].state), None)
        if laggard is None:
            combined.append(entries[0])
            continue
        ready = sum(1 for e in entries if e.state == "READY")
        worst = next(e for e in entries if e.state != "READY")
        reason = f"{ready} of {len(entries)} replicas READY" + (f": {worst.reason}" if worst.reason else "")
        combined.append(
            pb.RepositoryIndexResponse.ModelIndex(
                name=worst.name, version=worst.version, state=worst.state, reason=reason
            )
        )
    return combined


def _add_duration(target: Any, source: Any) -> None:
    target.count += source.count
    target.ns += source.ns


_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")


def combine_statistics(answers: Sequence[pb.ModelStatisticsResponse]) -> pb.ModelStatisticsResponse:
    """Replicas' statistics summed per model version, in first-seen order: counts and
    durations add up, batch statistics add up per batch size, last_inference is the latest."""
    combined = pb.ModelStatisticsResponse()
    by_version: dict[tuple[str, str], Any] = {}
    for answer in answers:
        for stats in answer.model_stats:
            key = (stats.name, stats.version)
            target = by_version.get(key)
            if target is None:
                by_version[key] = combined.model_stats.add()
                by_version[key].CopyFrom(stats)
                continue
            target.last_inference = max(target.last_inference, stats.last_inference)
            target.inference_count += stats.inference_count
            target.execution_count += stats.execution_count
            for name in _DURATIONS:
                _add_duration(getattr(target.inference_stats, name), getattr(stats.inference_stats, name))
            batches = {b.batch_size: b for b in target.batch_stats}
            for batch in stats.batch_stats:
                existing = batches.get(batch.batch_size)
                if existing is None:
                    target.batch_stats.add().CopyFrom(batch)
                    continue
                for name in _BATCH_DURATIONS:
                    _add_duration(getattr(existing, name), getattr(batch, name))
    for target in combined.model_stats:
        ordered = sorted(target.batch_stats, key=lambda b: b.batch_size)
        copies = [pb.InferBatchStatistics() for _ in ordered]
        for copy, batch in zip(copies, ordered, strict=True):
            copy.CopyFrom(batch)
        del target.batch_stats[:]
        target.batch_stats.extend(copies)
    return combined
