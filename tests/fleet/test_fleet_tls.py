"""TLS between gateway and sidecars: a sidecar started with --grpc-use-ssl[-mutual] serves
gRPC and its infer lane over TLS only; a gateway given --sidecar-ssl-* reaches it over
both, and a gateway without a client certificate, with another CA, or with no TLS at all
fails at once with a line that says why. Consul's meta tells a gateway which sidecars
speak TLS. Certificates are made for each run (tests/pki.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protos.ready import GATEWAY_READY, SIDECAR_READY
from tests.fleet.fleet_harness import Consul, Process, gateway, running, sidecar, spawn, wait_until
from tests.pki import Pki

# A gateway that cannot reach its sidecar answers at once; it never waits on a handshake.
PROMPT_SECS = 10.0


def _inputs(module: Any) -> list[Any]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def _check(result: Any) -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + data)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data - data)


def _tls_sidecar(repository: Path, pki: Pki, *flags: str) -> Process:
    command = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={repository}"]
    command += [f"--grpc-server-cert={pki.server_cert}", f"--grpc-server-key={pki.server_key}"]
    command += [f"--grpc-root-cert={pki.ca}", "--exit-timeout-secs=3", *flags]
    return spawn(command, SIDECAR_READY)


@pytest.fixture(scope="module", params=["tcp", "unix"])
def mutual_sidecar(request: pytest.FixtureRequest, fleet_repository: Path, pki: Pki) -> Iterator[Process]:
    """A sidecar that wants a client certificate signed by `pki`, with its lane on TCP or a Unix socket."""
    one = _tls_sidecar(fleet_repository, pki, "--grpc-use-ssl-mutual=true", f"--lane={request.param}")
    with running(one):
        yield one


def _static_gateway(one: Process, *flags: str, lane: bool = True) -> Process:
    """A gateway routing to `one` alone: over its lane, or (lane=False) over gRPC only."""
    fields = one.fields
    spec = f"onnxruntime={fields['grpc']},{fields['lane'] if lane else ''}"
    command = [sys.executable, "-m", "turnout", "gateway", f"--sidecar={spec}", "--host=127.0.0.1"]
    command += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--exit-timeout-secs=3", *flags]
    return spawn(command, GATEWAY_READY)


def _client_flags(pki: Pki) -> list[str]:
    return [
        f"--sidecar-ssl-root-cert={pki.ca}",
        f"--sidecar-ssl-cert={pki.client_cert}",
        f"--sidecar-ssl-key={pki.client_key}",
    ]


def _refused(front: Process) -> None:
    """Inference through `front` fails promptly."""
    started = time.monotonic()
    with grpcclient.InferenceServerClient(front.fields["grpc"]) as client, pytest.raises(InferenceServerException):
        client.infer("simple", _inputs(grpcclient), client_timeout=30)
    assert time.monotonic() - started < PROMPT_SECS


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
def test_infer_through_a_mutual_tls_sidecar(mutual_sidecar: Process, pki: Pki, lane: bool) -> None:
    front = _static_gateway(mutual_sidecar, *_client_flags(pki), lane=lane)
    with running(front):
        with grpcclient.InferenceServerClient(front.fields["grpc"]) as client:
            _check(client.infer("simple", _inputs(grpcclient)))
        with httpclient.InferenceServerClient(front.fields["http"]) as client:
            _check(client.infer("simple", _inputs(httpclient)))
    # The sidecar itself speaks TLS only.
    plain = grpcclient.InferenceServerClient(mutual_sidecar.fields["grpc"])
    with plain, pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=5)


def test_mutual_tls_refuses_a_gateway_without_a_client_certificate(mutual_sidecar: Process, pki: Pki) -> None:
    front = _static_gateway(mutual_sidecar, f"--sidecar-ssl-root-cert={pki.ca}")
    with running(front):
        _refused(front)
    assert "may want a client certificate (--sidecar-ssl-cert)" in front.output()


def test_a_gateway_trusting_another_ca_fails_the_handshake(mutual_sidecar: Process, other_pki: Pki) -> None:
    front = _static_gateway(mutual_sidecar, *_client_flags(other_pki))
    with running(front):
        _refused(front)
    assert "handshake failed" in front.output().lower()


def test_a_plain_gateway_cannot_talk_to_a_tls_sidecar(mutual_sidecar: Process) -> None:
    front = _static_gateway(mutual_sidecar)
    with running(front):
        _refused(front)
    assert "the sidecar may serve TLS only: give the gateway --sidecar-ssl-root-cert" in front.output()


def test_sidecar_tls_flags_are_checked(fleet_repository: Path, pki: Pki) -> None:
    command = [sys.executable, "-m", "sidecars", "--framework=onnxruntime", f"--model-repository={fleet_repository}"]
    for flags, expected in (
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert"),
        (["--grpc-use-ssl-mutual=true", f"--grpc-server-cert={pki.server_cert}"], "needs --grpc-root-cert"),
    ):
        refused = spawn([*command, *flags], None)
        assert refused.process.wait(timeout=60) == 2
        refused.stop()
        assert expected in refused.output()


def test_consul_meta_says_tls_and_the_gateway_follows_it(consul: Consul, fleet_repository: Path, pki: Pki) -> None:
    service = "tls-meta"
    # Mutual TLS would need the Consul agent to hold a certificate our CA signed; server TLS does not.
    one = sidecar(
        consul.http,
        fleet_repository,
        f"--consul-service={service}",
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={pki.server_key}",
    )
    with running(one):
        (entry,) = wait_until(lambda: consul.services(service), 15, "the sidecar's registration").values()
        assert entry["Meta"]["tls"] == "true"
        wait_until(lambda: consul.passing(service), 15, "a passing TLS health check")
        front = gateway(consul.http, f"--consul-service={service}", f"--sidecar-ssl-root-cert={pki.ca}")
        with running(front), grpcclient.InferenceServerClient(front.fields["grpc"]) as client:
            wait_until(lambda: client.is_model_ready("simple"), 15, "the gateway to see the TLS replica")
            _check(client.infer("simple", _inputs(grpcclient)))


def test_a_tls_gateway_refuses_a_plain_replica(consul: Consul, fleet_repository: Path, pki: Pki) -> None:
    service = "tls-downgrade"
    one = sidecar(consul.http, fleet_repository, f"--consul-service={service}")
    with running(one):
        wait_until(lambda: consul.passing(service), 15, "the plain sidecar's registration")
        front = gateway(consul.http, f"--consul-service={service}", f"--sidecar-ssl-root-cert={pki.ca}")
        with running(front):
            wait_until(lambda: "does not serve TLS" in front.output(), 15, "the refusal line")
            with grpcclient.InferenceServerClient(front.fields["grpc"]) as client:
                assert not client.is_model_ready("simple")


def test_the_container_health_check_speaks_the_sidecars_tls(mutual_sidecar: Process, pki: Pki) -> None:
    """`python -m sidecars.healthcheck` reads the sidecar's own TURNOUT_SIDECAR_* TLS settings."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TURNOUT_")}
    plain = {**clean, "TURNOUT_SIDECAR_PORT": mutual_sidecar.fields["grpc"].rsplit(":", 1)[1]}
    tls = {
        **plain,
        "TURNOUT_SIDECAR_GRPC_USE_SSL_MUTUAL": "true",
        "TURNOUT_SIDECAR_GRPC_SERVER_CERT": pki.server_cert,
        "TURNOUT_SIDECAR_GRPC_SERVER_KEY": pki.server_key,
        "TURNOUT_SIDECAR_GRPC_ROOT_CERT": pki.ca,
    }

    def health(environment: dict[str, str]) -> int:
        command = [sys.executable, "-m", "sidecars.healthcheck"]
        return subprocess.run(command, env=environment, timeout=30, check=False).returncode

    assert health(plain) == 1
    assert health(tls) == 0
