"""What `turnout bench` prints and writes: a table, CSV, JSON, and a PNG of latency
against throughput (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from bench.loadgen.load import Point

COLUMNS = (
    ("concurrency", "Conc", "{:d}"),
    ("request_rate", "Rate/s", "{:.0f}"),
    ("throughput", "Infer/s", "{:.1f}"),
    ("p50_us", "p50 us", "{:.0f}"),
    ("p90_us", "p90 us", "{:.0f}"),
    ("p95_us", "p95 us", "{:.0f}"),
    ("p99_us", "p99 us", "{:.0f}"),
    ("client_cpu", "Client CPU", "{:.0%}"),
    ("server_cpu", "Server CPU", "{:.0%}"),
    ("server_queue_us", "Queue us", "{:.0f}"),
    ("server_compute_us", "Compute us", "{:.0f}"),
    ("stable", "Stable", "{}"),
    ("errors", "Errors", "{:d}"),
)


def table(points: Sequence[Point]) -> str:
    rows = [[title for _, title, _ in COLUMNS]]
    for point in points:
        row = []
        for key, _, form in COLUMNS:
            value = getattr(point, key)
            row.append(_cell(point, key, value, form))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines) + "\n"


def _cell(point: Point, key: str, value: object, form: str) -> str:
    # A closed loop has no request rate and an open loop no concurrency: say which ran.
    if key == "request_rate" and point.request_rate <= 0:
        return "closed"
    if key == "concurrency" and point.request_rate > 0:
        return "open"
    if key == "server_cpu" and isinstance(value, float) and value < 0:
        return "n/a"
    return form.format(value)


def to_csv(points: Sequence[Point]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in fields(Point)])
    writer.writeheader()
    for point in points:
        writer.writerow(asdict(point))
    return buffer.getvalue()


def to_json(points: Sequence[Point], model: str, protocol: str) -> str:
    return json.dumps({"model": model, "protocol": protocol, "points": [asdict(p) for p in points]}, indent=2)


def plot(points: Sequence[Point], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    throughput = [p.throughput for p in points]
    for key, label in (("p50_us", "p50"), ("p90_us", "p90"), ("p99_us", "p99")):
        axes.plot(throughput, [getattr(p, key) / 1000 for p in points], marker="o", label=label)
    axes.set_xlabel("throughput (inferences/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
