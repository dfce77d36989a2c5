"""Command-line rules both programs share: Triton's boolean flags, what a
`--model-repository` value may be, and a `--log-file` that can be written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from protos.remote import RemoteError, check_extra, is_remote, parse_location

# Triton spells booleans `--flag=true|false`; a bare `--flag` means true. Pass as
# `click.option("--name", default=..., **TRITON_BOOL)`.
TRITON_BOOL: dict[str, Any] = {"type": click.BOOL, "is_flag": False, "flag_value": True, "show_default": True}
# `-h` as well as `--help`, on every command.
HELP_OPTIONS = ["-h", "--help"]

RepositoryCallback = Callable[[click.Context, click.Parameter, tuple[str, ...]], tuple[str, ...]]


def model_repositories(*, must_exist: bool) -> RepositoryCallback:
    """A click callback for `--model-repository` values: a folder (which must exist when
    `must_exist`; a sidecar reports a missing one itself, as Triton does) or an s3:// or
    gs:// URL that parses and whose filesystem is installed."""
    folder = click.Path(exists=must_exist, file_okay=False)

    def check(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not is_remote(value):
                folder.convert(value, param, ctx)
                continue
            try:
                check_extra(parse_location(value))
            except RemoteError as exc:
                raise click.BadParameter(str(exc), ctx, param) from exc
        return values

    return check


def model_repository_option(envvar: str, *, must_exist: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--model-repository` (Triton's `--model-store` too), repeatable, as both commands
    take it: the values land in `model_repositories`, checked by `model_repositories`."""
    return click.option(
        "--model-repository",
        "--model-store",
        "model_repositories",
        envvar=envvar,
        multiple=True,
        required=True,
        callback=model_repositories(must_exist=must_exist),
        help="Triton model repository: a folder, s3://[host:port/]bucket/path or gs://bucket/path "
        "(repeatable; a model name may appear in only one).",
    )


def _writable(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value:
        try:
            with open(value, "a"):
                pass
        except OSError as exc:
            raise click.BadParameter(f"cannot write to '{value}': {exc.strerror}", ctx, param) from None
    return value


def log_file_option(envvar: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--log-file`, as every command takes it: checked for writing before anything starts."""
    return click.option(
        "--log-file",
        default="",
        envvar=envvar,
        callback=_writable,
        help="write log lines to this file instead of the console",
    )
