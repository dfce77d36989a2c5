"""Every turnout service in compose/ runs a command, environment and ports that the real
CLI accepts; a renamed flag or variable fails here, not at `docker compose up`."""

from __future__ import annotations

import copy
from typing import Any

import click
import pytest
import yaml

from tests.compose.compose_spec import (
    COMPOSE_DIR,
    dockerfile_env,
    envvars,
    flag_envvar,
    load_compose,
    options,
    parse,
    service_argv,
    turnout_commands,
)

COMPOSE = load_compose()
TURNOUT_SERVICES = sorted(name for name, s in COMPOSE["services"].items() if service_argv(s)[:1] == ["turnout"])


def _build_dockerfile(service: dict[str, Any]) -> str:
    return str(service["build"]["dockerfile"]).removeprefix("compose/")


def test_the_compose_file_runs_the_gateway_and_every_framework() -> None:
    frameworks = {
        service_argv(COMPOSE["services"][name])[3] for name in TURNOUT_SERVICES if name.startswith("sidecar-")
    }
    assert frameworks == {"onnxruntime", "pytorch", "tensorrt", "ensemble", "python"}
    assert "gateway" in TURNOUT_SERVICES


@pytest.mark.parametrize("name", TURNOUT_SERVICES)
def test_command_and_environment_match_the_cli(name: str) -> None:
    params, problems = parse(name, COMPOSE["services"][name])
    assert problems == []
    assert params  # it parsed


@pytest.mark.parametrize("name", TURNOUT_SERVICES)
def test_ports_match_the_parsed_flags(name: str) -> None:
    service = COMPOSE["services"][name]
    params, _ = parse(name, service)
    published = sorted(int(str(port).split(":")[-1]) for port in service.get("ports", []))
    if name == "gateway":
        assert published == sorted([params["http_port"], params["grpc_port"], params["metrics_port"]])
        assert params["host"] == "0.0.0.0"
    else:
        # Scaling needs no host port per replica: the sidecar registers its container address.
        assert published == []
        assert params["host"] == "0.0.0.0"
        assert params["port"] > 0 and params["lane_port"] > 0 and params["lane"] == "tcp"
        assert params["consul"], "a sidecar must register itself in Consul"
        assert params["advertise_address"] == "", "a fixed address would break --scale"


@pytest.mark.parametrize("name", TURNOUT_SERVICES)
def test_gateway_and_sidecars_speak_mutual_tls_under_the_mounted_ca(name: str) -> None:
    service = COMPOSE["services"][name]
    params, _ = parse(name, service)
    certs = str(COMPOSE_DIR / "certs")
    if name == "gateway":
        files = [params["sidecar_ssl_root_cert"], params["sidecar_ssl_cert"], params["sidecar_ssl_key"]]
        # Replicas come and go on container addresses: their certificates name the service instead.
        assert params["sidecar_ssl_server_name"] == "turnout-sidecar"
    else:
        assert params["grpc_use_ssl_mutual"] and not params["allow_unauthenticated_network"]
        files = [params["grpc_root_cert"], params["grpc_server_cert"], params["grpc_server_key"]]
    assert all(path.startswith(certs + "/") for path in files), files
    assert f"{certs}/ca.pem" == files[0]


@pytest.mark.parametrize("name", TURNOUT_SERVICES)
def test_stop_grace_period_covers_the_exit_timeout(name: str) -> None:
    service = COMPOSE["services"][name]
    params, _ = parse(name, service)
    grace = float(str(service["stop_grace_period"]).removesuffix("s"))
    assert service["stop_signal"] == "SIGTERM"
    assert params["exit_timeout_secs"] < grace <= params["exit_timeout_secs"] + 15
    assert service["restart"] == "unless-stopped"
    for dependency in service["depends_on"].values():
        assert dependency["condition"] == "service_healthy"


@pytest.mark.parametrize("name", TURNOUT_SERVICES)
def test_dockerfile_environment_matches_the_cli(name: str) -> None:
    service = COMPOSE["services"][name]
    command, prefix = turnout_commands()[service_argv(service)[1]]
    image_env = dockerfile_env(COMPOSE_DIR / _build_dockerfile(service))
    unknown = [k for k in image_env if k.startswith("TURNOUT_") and k not in envvars(command, prefix)]
    assert unknown == []
    # The image and the compose file agree on the exit timeout the grace period is sized for.
    assert image_env[f"{prefix}_EXIT_TIMEOUT_SECS"] == service["environment"][f"{prefix}_EXIT_TIMEOUT_SECS"]


@pytest.mark.parametrize("command_name", sorted(turnout_commands()))
def test_every_flag_reads_a_turnout_variable_named_after_it(command_name: str) -> None:
    command, prefix = turnout_commands()[command_name]
    readable = envvars(command, prefix)
    missing = [flag_envvar(prefix, o) for o in options(command) if flag_envvar(prefix, o) not in readable]
    assert missing == []


def test_a_renamed_flag_fails_the_check() -> None:
    commands = turnout_commands()
    renamed = copy.deepcopy(commands["sidecar"][0])
    option = next(o for o in renamed.params if o.name == "lane_port")
    assert isinstance(option, click.Option)
    option.opts, option.name = ["--tcp-lane-port"], "tcp_lane_port"
    broken = dict(commands, sidecar=(renamed, "TURNOUT_SIDECAR"))
    service = copy.deepcopy(COMPOSE["services"]["sidecar-onnxruntime"])
    service["command"] = [*service_argv(service), "--lane-port=8101"]
    _, problems = parse("sidecar-onnxruntime", service, broken)
    assert any("TURNOUT_SIDECAR_LANE_PORT" in p for p in problems), problems
    assert any("--lane-port" in p for p in problems), problems


def test_an_unknown_variable_fails_the_check() -> None:
    service = copy.deepcopy(COMPOSE["services"]["gateway"])
    service["environment"]["TURNOUT_GATEWAY_ROUTING_FILE"] = "/etc/turnout/routing.yaml"
    _, problems = parse("gateway", service)
    assert problems == ["gateway: TURNOUT_GATEWAY_ROUTING_FILE is read by no option of `turnout gateway`"]


@pytest.mark.parametrize("name", ["sidecar-onnxruntime", "sidecar-ensemble"])
def test_the_model_host_file_matches_the_cli(name: str) -> None:
    service = yaml.safe_load((COMPOSE_DIR / "model-host.yml").read_text())["services"][name]
    # What `docker compose` substitutes for the two variables the file asks for.
    service["environment"]["TURNOUT_SIDECAR_CONSUL"] = "10.0.0.7:8500"
    service["environment"]["TURNOUT_SIDECAR_ADVERTISE_ADDRESS"] = "10.0.0.7"
    params, problems = parse(name, service)
    assert problems == []
    assert params
