"""The `turnout bench` command: flags in perf_analyzer's spelling where it has one."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from tritonclient.utils import InferenceServerException

from bench.loadgen.load import LoadSettings, Point, Target, measure
from bench.loadgen.report import plot, table, to_csv, to_json
from protos.flags import HELP_OPTIONS


def _range(text: str, flag: str) -> list[int]:
    """perf_analyzer's `start:end:step` (end and step optional)."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        raise click.BadParameter(f"expected start:end:step, got {text!r}", param_hint=flag) from None
    start = parts[0]
    end = parts[1] if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else 1
    if start < 1 or end < start or step < 1:
        raise click.BadParameter(f"expected start:end:step with 1 <= start <= end, got {text!r}", param_hint=flag)
    return list(range(start, end + 1, step))


def _shapes(values: tuple[str, ...]) -> dict[str, list[int]]:
    shapes = {}
    for value in values:
        name, sep, dims = value.partition(":")
        if not sep:
            raise click.BadParameter(f"expected NAME:D1,D2,..., got {value!r}", param_hint="--shape")
        shapes[name] = [int(d) for d in dims.split(",")]
    return shapes


class _Progress:
    """A one-line progress bar on stderr, redrawn in place."""

    def __init__(self, enabled: bool, levels: int) -> None:
        self._enabled = enabled
        self._levels = levels
        self.level = 0

    def __call__(self, window: int, windows: int) -> None:
        if not self._enabled:
            return
        done = (self.level + window / windows) / self._levels
        bar = "#" * int(done * 30)
        sys.stderr.write(f"\r[{bar:<30}] level {self.level + 1}/{self._levels} window {window}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self._enabled:
            sys.stderr.write("\n")


@click.command(context_settings={"help_option_names": HELP_OPTIONS})
@click.option("-m", "--model", "model", required=True, help="Model name.")
@click.option("-u", "--url", default="localhost:8001", show_default=True, help="host:port of the server.")
@click.option("-i", "--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option("--concurrency-range", default="1", show_default=True, help="start:end:step of concurrent requests.")
@click.option("--request-rate", "request_rates", default="", help="start:end:step requests/s (open loop) instead.")
@click.option("-b", "--batch-size", default=1, type=click.IntRange(min=1), show_default=True)
@click.option("--input-data", default="random", show_default=True, help="random, or a JSON file of input values.")
@click.option("--shape", "shapes", multiple=True, help="NAME:D1,D2 for inputs with dynamic dims (repeatable).")
@click.option("--shared-memory", type=click.Choice(["none", "system"]), default="none", show_default=True)
@click.option("--warmup-secs", default=1.0, type=click.FloatRange(min=0), show_default=True)
@click.option(
    "--measurement-interval", default=1000, type=click.IntRange(min=50), help="Window, ms.", show_default=True
)
@click.option(
    "--max-trials", default=10, type=click.IntRange(min=1), help="Windows at most per level.", show_default=True
)
@click.option("--stability-percentage", default=10.0, type=click.FloatRange(min=0), show_default=True)
@click.option("--metrics-url", default="", help="host:port of the server's /metrics, for its CPU utilization.")
@click.option("-f", "--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="Write CSV here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot here.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
def bench(
    model: str,
    url: str,
    protocol: str,
    concurrency_range: str,
    request_rates: str,
    batch_size: int,
    input_data: str,
    shapes: tuple[str, ...],
    shared_memory: str,
    warmup_secs: float,
    measurement_interval: int,
    max_trials: int,
    stability_percentage: float,
    metrics_url: str,
    csv_path: Path | None,
    json_path: Path | None,
    plot_path: Path | None,
    progress: bool | None,
) -> None:
    """Measure latency and throughput of MODEL on any v2 server (turnout, Triton, ...)."""
    settings = LoadSettings(
        model=model,
        url=url,
        protocol=protocol,
        batch_size=batch_size,
        input_data=input_data,
        shared_memory=shared_memory,
        warmup_secs=warmup_secs,
        window_secs=measurement_interval / 1000,
        max_windows=max_trials,
        stability=stability_percentage / 100,
        metrics_url=metrics_url,
        shapes=_shapes(shapes),
    )
    levels: list[tuple[int, float]] = (
        [(0, float(r)) for r in _range(request_rates, "'--request-rate'")]
        if request_rates
        else [(c, 0.0) for c in _range(concurrency_range, "'--concurrency-range'")]
    )
    show = sys.stderr.isatty() if progress is None else progress
    try:
        points = asyncio.run(_run(settings, levels, _Progress(show, len(levels))))
    except InferenceServerException as exc:  # the server is not there, or refuses the model
        raise click.ClickException(f"{url}: {exc.message()}") from exc
    click.echo(table(points), nl=False)
    if csv_path is not None:
        csv_path.write_text(to_csv(points))
    if json_path is not None:
        json_path.write_text(to_json(points, model, protocol))
    if plot_path is not None:
        plot(points, plot_path, f"{model} over {protocol}, batch {batch_size}")


async def _run(settings: LoadSettings, levels: list[tuple[int, float]], progress: _Progress) -> list[Point]:
    target = Target(settings)
    try:
        await target.prepare()
        points = []
        for index, (concurrency, rate) in enumerate(levels):
            progress.level = index
            points.append(await measure(target, concurrency, rate, progress))
        progress.finish()
        return points
    finally:
        await target.close()
