"""compose/ read as data: the compose file's services, and a check of each turnout
service's command and TURNOUT_* environment against the real click commands."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from sidecars.__main__ import main as sidecar_main
from tests.harness import ROOT
from turnout.cli import cli

COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"


def load_compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE_FILE.read_text()))


def turnout_commands() -> dict[str, tuple[click.Command, str]]:
    """`turnout <name>` -> (the click command that parses its flags, its env prefix).
    `turnout sidecar` execs `python -m sidecars`, so its flags are that command's."""
    assert isinstance(cli, click.Group)
    commands = {name: (command, f"TURNOUT_{name.upper()}") for name, command in cli.commands.items()}
    commands["sidecar"] = (sidecar_main, "TURNOUT_SIDECAR")
    return commands


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and p.name not in ("help", "version")]


def envvars(command: click.Command, prefix: str) -> dict[str, click.Option]:
    """Every environment variable `command` reads, as click resolves them: an option's own
    `envvar`, else <prefix>_<PARAMETER NAME>."""
    found: dict[str, click.Option] = {}
    for option in options(command):
        if option.envvar:
            names = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar)
        elif option.allow_from_autoenv and option.name:
            names = [f"{prefix}_{option.name.upper()}"]
        else:
            names = []
        for name in names:
            found[name] = option
    return found


def flag_envvar(prefix: str, option: click.Option) -> str:
    """The variable documented for an option: TURNOUT_<COMMAND>_<FIRST LONG FLAG>."""
    flag = next(o for o in option.opts if o.startswith("--"))
    return f"{prefix}_{flag[2:].replace('-', '_').upper()}"


@dataclass
class Mounts:
    """A service's bind mounts: container path -> host path (resolved against compose/)."""

    by_target: dict[str, Path]

    @classmethod
    def of(cls, service: Mapping[str, Any]) -> Mounts:
        found = {}
        for volume in service.get("volumes", []):
            volume = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", volume)  # ${VAR:-default} -> default
            source, target, *_ = volume.split(":")
            if source.startswith((".", "/")):
                found[target] = (COMPOSE_DIR / source).resolve()
        return cls(found)

    def host_path(self, value: str) -> str:
        for target, source in self.by_target.items():
            if value == target or value.startswith(target.rstrip("/") + "/"):
                return str(source) + value[len(target.rstrip("/")) :]
        return value


def service_environment(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {str(k): str(v) for k, v in environment.items()}


def service_argv(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


@contextlib.contextmanager
def only_environment(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with every TURNOUT_* variable replaced by `values`, for click to read."""
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith("TURNOUT_")]:
            del os.environ[key]
        os.environ.update(values)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse(
    name: str, service: Mapping[str, Any], commands: Mapping[str, tuple[click.Command, str]] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Parse a turnout service's command line and environment with the real click command.
    Returns the parsed parameters and every problem found (empty when it all matches)."""
    commands = commands if commands is not None else turnout_commands()
    argv = service_argv(service)
    problems: list[str] = []
    if argv[:1] != ["turnout"] or len(argv) < 2 or argv[1] not in commands:
        return {}, [f"{name}: command {argv} is not `turnout <{'|'.join(commands)}> ...`"]
    command, prefix = commands[argv[1]]
    flags = {opt for option in options(command) for opt in option.opts + option.secondary_opts}
    for token in argv[2:]:
        if token.startswith("--") and token.split("=", 1)[0] not in flags:
            problems.append(f"{name}: flag {token.split('=', 1)[0]} is not an option of `turnout {argv[1]}`")
    known = envvars(command, prefix)
    environment = service_environment(service)
    for variable in environment:
        if variable.startswith("TURNOUT_") and variable not in known:
            problems.append(f"{name}: {variable} is read by no option of `turnout {argv[1]}`")
    mounts = Mounts.of(service)
    values = {k: mounts.host_path(v) for k, v in environment.items() if k.startswith("TURNOUT_")}
    try:
        with only_environment(values):
            context = command.make_context(f"turnout {argv[1]}", argv[2:], auto_envvar_prefix=prefix)
    except click.ClickException as exc:
        problems.append(f"{name}: `turnout {argv[1]}` refuses its command and environment: {exc.format_message()}")
        return {}, problems
    return dict(context.params), problems


def dockerfile_env(path: Path) -> dict[str, str]:
    """The ENV values a Dockerfile sets (KEY=VALUE form, continued lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().startswith("ENV "):
            for pair in shlex.split(line.strip()[4:]):
                key, _, value = pair.partition("=")
                found[key] = value
    return found
