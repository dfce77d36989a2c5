"""Consul in production form, against a real agent: ACLs on with default deny and
least-privilege tokens (the policies docs/deploy.md prints), and the HTTP API over
HTTPS, with the agent's CA and, where the agent requires one, a client certificate."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.fleet.fleet_harness import Consul, consul_agent, gateway, gateway_command, running, sidecar, wait_until
from tests.pki import Pki

# The policies of docs/deploy.md: sidecars write their own services, gateways read
# services, nodes (health answers carry the node) and the routing policies.
SIDECAR_RULES = 'service_prefix "turnout-" { policy = "write" }'
GATEWAY_RULES = """
service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }
key_prefix "turnout/routing/" { policy = "read" }
"""
SERVICE = "turnout-acl"


def _infer(address: str) -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    with grpcclient.InferenceServerClient(address) as client:
        result = client.infer("simple", inputs)
    assert (result.as_numpy("OUTPUT0") == data + data).all()


@pytest.fixture(scope="module")
def acl_consul(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consul]:
    with consul_agent(config_dir=tmp_path_factory.mktemp("consul_acl"), acl_master=secrets.token_hex(16)) as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(acl_consul: Consul) -> dict[str, str]:
    return {
        "sidecar": acl_consul.token("turnout-sidecar", SIDECAR_RULES),
        "gateway": acl_consul.token("turnout-gateway", GATEWAY_RULES),
    }


def test_least_privilege_tokens_register_discover_and_route(
    acl_consul: Consul, tokens: dict[str, str], fleet_repository: Path, tmp_path: Path
) -> None:
    # The sidecar takes Consul's own variable, the gateway a token file.
    token_file = tmp_path / "gateway.token"
    token_file.write_text(tokens["gateway"] + "\n")
    acl_consul.put("/v1/kv/turnout/routing/simple", json.dumps({"weights": {"1": 100}}).encode())
    one = sidecar(
        acl_consul.http, fleet_repository, f"--consul-service={SERVICE}", env={"CONSUL_HTTP_TOKEN": tokens["sidecar"]}
    )
    with running(one):
        wait_until(lambda: acl_consul.passing(SERVICE), 15, "the sidecar's passing registration")
        gw = gateway(
            acl_consul.http,
            f"--consul-service={SERVICE}",
            f"--consul-token-file={token_file}",
            "--consul-datacenter=dc1",
        )
        with running(gw):
            wait_until(lambda: "from consul key turnout/routing/simple" in gw.output(), 10, "the KV policy")
            _infer(gw.fields["grpc"])
        assert one.stop() == 0
    assert acl_consul.services(SERVICE) == {}, one.output()  # the token may deregister too
    for process in (one, gw):
        assert tokens["sidecar"] not in process.output() and tokens["gateway"] not in process.output()


def test_gateway_without_token_exits_naming_what_was_refused(acl_consul: Consul) -> None:
    # Health answers leave out what the anonymous token may not read; the KV key is refused.
    gw = subprocess.run(
        gateway_command(acl_consul.http, f"--consul-service={SERVICE}"), capture_output=True, text=True, timeout=60
    )
    assert gw.returncode == 1, gw.stdout + gw.stderr
    line = f"consul at {acl_consul.http} refused reading key 'turnout/routing/' (ACL: permission denied"
    assert line in gw.stderr and "check --consul-token" in gw.stderr


def test_gateway_with_an_unknown_token_exits_naming_what_was_refused(acl_consul: Consul) -> None:
    command = gateway_command(acl_consul.http, f"--consul-service={SERVICE}", "--consul-token=not-a-token")
    gw = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert gw.returncode == 1, gw.stdout + gw.stderr
    assert f"consul at {acl_consul.http} refused reading service '{SERVICE}'" in gw.stderr
    assert "ACL not found" in gw.stderr and "not-a-token" not in gw.stderr


def test_sidecar_refused_says_so_on_every_attempt(
    acl_consul: Consul, tokens: dict[str, str], fleet_repository: Path
) -> None:
    # The sidecar's token writes only turnout-* services.
    one = sidecar(acl_consul.http, fleet_repository, "--consul-service=other", f"--consul-token={tokens['sidecar']}")
    with running(one):
        wait_until(lambda: "(attempt 2;" in one.output(), 15, "a second refused attempt")
        line = f"consul at {acl_consul.http} refused registering service 'other' (ACL: permission denied"
        assert one.output().count(line) >= 2, one.output()
        assert "unreachable" not in one.output() and tokens["sidecar"] not in one.output()


@pytest.mark.parametrize("verify_incoming", [False, True], ids=["ca", "client-cert"])
def test_registration_and_discovery_over_https(
    verify_incoming: bool, pki: Pki, fleet_repository: Path, tmp_path: Path
) -> None:
    with consul_agent(config_dir=tmp_path, pki=pki, verify_incoming=verify_incoming) as agent:
        client = [f"--consul-client-cert={pki.client_cert}", f"--consul-client-key={pki.client_key}"]
        flags = [f"--consul-service={SERVICE}", f"--consul-ca-cert={pki.ca}", *(client if verify_incoming else [])]
        one = sidecar(f"https://{agent.https}", fleet_repository, *flags)
        with running(one):
            wait_until(lambda: agent.passing(SERVICE), 15, f"registration over https:\n{one.output()}")
            # Consul's own variables, as the `consul` CLI reads them.
            env = {"CONSUL_HTTP_SSL": "true", "CONSUL_CACERT": pki.ca}
            if verify_incoming:
                env.update(CONSUL_CLIENT_CERT=pki.client_cert, CONSUL_CLIENT_KEY=pki.client_key)
            with running(gateway(agent.https, f"--consul-service={SERVICE}", env=env)) as (gw,):
                _infer(gw.fields["grpc"])
        if verify_incoming:
            # Without a client certificate the agent does not answer: the gateway says so,
            # and why, and stays unready (live, so the fix is a restart away, not a crash loop).
            flags = (f"--consul-service={SERVICE}", "--consul-scheme=https", f"--consul-ca-cert={pki.ca}")
            with running(gateway(agent.https, *flags)) as (refused,):
                assert "cannot reach the Consul agent" in refused.output(), refused.output()
                assert "BAD_CERTIFICATE" in refused.output()  # the watch's line says why
                http = httpclient.InferenceServerClient(refused.fields["http"])
                assert http.is_server_live() and not http.is_server_ready()
