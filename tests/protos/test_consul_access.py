"""The Consul access flags, read the same by the sidecar and the gateway: a flag beats
its TURNOUT_ variable, which beats Consul's own; and what the client is built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from protos.consul_access import ConsulAccess, refused
from protos.flags import CONSUL_FLAGS, consul_access, shared


def _access(args: list[str], env: dict[str, str]) -> ConsulAccess:
    found: list[ConsulAccess] = []

    @click.command()
    @shared(*CONSUL_FLAGS)
    def command(**flags: Any) -> None:
        found.append(consul_access(flags))

    result = CliRunner().invoke(command, args, env=env, auto_envvar_prefix="TURNOUT_SIDECAR")
    assert result.exit_code == 0, result.output
    return found[0]


def test_a_flag_beats_its_turnout_variable_which_beats_consuls_own() -> None:
    consul_env = {"CONSUL_HTTP_TOKEN": "consul", "CONSUL_HTTP_SSL": "true", "CONSUL_CACERT": ""}
    assert _access([], consul_env).token == "consul"
    assert _access([], consul_env).scheme == "https"
    assert _access([], {**consul_env, "TURNOUT_SIDECAR_CONSUL_TOKEN": "ours"}).token == "ours"
    assert _access(["--consul-token=flag"], {**consul_env, "TURNOUT_SIDECAR_CONSUL_TOKEN": "ours"}).token == "flag"
    assert _access([], {"CONSUL_HTTP_SSL": "0"}).scheme == "http"


def test_the_token_file_is_read_and_the_token_wins_over_it(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert _access([], {"CONSUL_HTTP_TOKEN_FILE": str(path)}).secret() == "from-file"
    assert _access([f"--consul-token-file={path}", "--consul-token=given"], {}).secret() == "given"
    # A file named on the command line beats a token from the environment.
    assert _access([f"--consul-token-file={path}"], {"CONSUL_HTTP_TOKEN": "env"}).secret() == "from-file"
    assert _access([], {"CONSUL_HTTP_TOKEN_FILE": str(path), "CONSUL_HTTP_TOKEN": "env"}).secret() == "env"


def test_a_token_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    @click.command()
    @shared(*CONSUL_FLAGS)
    def command(**flags: Any) -> None:
        consul_access(flags)

    result = CliRunner().invoke(command, [f"--consul-token-file={tmp_path / 'absent'}"])
    assert result.exit_code == 2 and "cannot read the consul token file" in result.output


def test_the_token_stays_out_of_the_repr_and_the_datacenter_goes_in_the_query() -> None:
    access = ConsulAccess(token="s3cret", datacenter="east")
    assert "s3cret" not in repr(access)
    assert access.query({"recurse": "true"}) == {"recurse": "true", "dc": "east"}
    assert ConsulAccess().query() == {}


@pytest.mark.parametrize(
    ("address", "scheme", "url"),
    [
        ("127.0.0.1:8500", "http", "http://127.0.0.1:8500"),
        ("127.0.0.1:8501", "https", "https://127.0.0.1:8501"),
        ("https://consul:8501", "http", "https://consul:8501"),
    ],
)
def test_base_url(address: str, scheme: str, url: str) -> None:
    assert ConsulAccess(scheme=scheme).base_url(address) == url


def test_a_refusal_is_one_line_naming_what_and_the_flag() -> None:
    line = refused("https://127.0.0.1:8501", "reading key 'turnout/routing/'", "Permission denied\n")
    assert line == (
        "consul at 127.0.0.1:8501 refused reading key 'turnout/routing/' "
        "(ACL: permission denied; consul says 'Permission denied'); check --consul-token"
    )
