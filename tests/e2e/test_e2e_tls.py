"""TLS: gRPC with a server certificate and optional mutual TLS (Triton's --grpc-use-ssl,
--grpc-use-ssl-mutual, --grpc-server-cert, --grpc-server-key, --grpc-root-cert), HTTPS
on the HTTP front, and mutual TLS between `turnout up`'s gateway and its sidecars
(--sidecar-ssl-*). Certificates are made for each run with `cryptography`."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.python_models import write_python_models
from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import ROOT, Server, turnout_up, write_repository
from tests.pki import Pki


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_tls"), ("simple",))
    with turnout_up(
        repo,
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={pki.server_key}",
        f"--grpc-root-cert={pki.ca}",
        f"--http-ssl-certfile={pki.server_cert}",
        f"--http-ssl-keyfile={pki.server_key}",
    ) as running:
        yield running


def test_grpc_mutual_tls(mutual: Server, pki: Pki) -> None:
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(
        mutual.grpc,
        ssl=True,
        root_certificates=pki.ca,
        private_key=pki.client_key,
        certificate_chain=pki.client_cert,
    ) as client:
        check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)
    # Without a client certificate, or in plain text, the handshake fails.
    for kwargs in ({"ssl": True, "root_certificates": pki.ca}, {}):
        with grpcclient.InferenceServerClient(mutual.grpc, **kwargs) as client:  # type: ignore[arg-type]
            with pytest.raises(InferenceServerException) as caught:
                client.is_server_live(client_timeout=5)
            assert caught.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


def test_https_front(mutual: Server, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=pki.ca)
    response = httpx.get(f"https://{mutual.http}/v2/health/ready", verify=context, timeout=10)
    assert response.status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{mutual.http}/v2/health/ready", timeout=5)


def test_grpc_server_tls_without_client_certificates(tmp_path: Path, pki: Pki) -> None:
    repo = write_repository(tmp_path / "repo", ("simple",))
    with (
        turnout_up(
            repo, "--grpc-use-ssl=true", f"--grpc-server-cert={pki.server_cert}", f"--grpc-server-key={pki.server_key}"
        ) as server,
        grpcclient.InferenceServerClient(server.grpc, ssl=True, root_certificates=pki.ca) as client,
    ):
        assert client.is_server_ready()


@pytest.mark.parametrize("mode", ["tls", "mutual"])
def test_bls_reaches_a_gateway_that_serves_grpc_over_tls(tmp_path: Path, pki: Pki, mode: str) -> None:
    # `turnout up` hands its python sidecar what BLS needs: the CA to trust and, under mutual
    # TLS, the gateway's own certificate to present.
    repo = write_python_models(write_repository(tmp_path / "repo", ("simple",)))
    flags = [f"--grpc-server-cert={pki.server_cert}", f"--grpc-server-key={pki.server_key}"]
    flags.append(f"--grpc-root-cert={pki.ca}")
    flags.append("--grpc-use-ssl-mutual=true" if mode == "mutual" else "--grpc-use-ssl=true")
    a, b = simple_arrays()
    with (
        turnout_up(repo, *flags, "--load-model=bls", "--load-model=simple", "--model-control-mode=explicit") as server,
        grpcclient.InferenceServerClient(
            server.grpc,
            ssl=True,
            root_certificates=pki.ca,
            private_key=pki.client_key,
            certificate_chain=pki.client_cert,
        ) as client,
    ):
        check_simple(client.infer("bls", grpc_inputs(a, b), parameters={"target": "simple"}), a, b)


def test_up_with_tls_to_its_sidecars(tmp_path: Path, pki: Pki) -> None:
    # One certificate serves both ends of the hop: the sidecars present it and ask it back.
    repo = write_repository(tmp_path / "repo", ("simple",))
    a, b = simple_arrays()
    with turnout_up(
        repo,
        f"--sidecar-ssl-root-cert={pki.ca}",
        f"--sidecar-ssl-cert={pki.server_cert}",
        f"--sidecar-ssl-key={pki.server_key}",
    ) as server:
        with grpcclient.InferenceServerClient(server.grpc) as client:
            check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)
        with httpclient.InferenceServerClient(server.http) as client:
            check_simple(client.infer("simple", http_inputs(a, b)), a, b)
        found = re.search(r"onnxruntime sidecar ready on (\S+)", server.output())
        assert found is not None, server.output()
        # The sidecar speaks mutual TLS only.
        plain = grpcclient.InferenceServerClient(found.group(1))
        with plain, pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        with grpcclient.InferenceServerClient(
            found.group(1),
            ssl=True,
            root_certificates=pki.ca,
            private_key=pki.client_key,
            certificate_chain=pki.client_cert,
        ) as direct:
            assert direct.is_server_live()


def test_tls_flags_are_checked() -> None:
    for flags, named in (
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs"),
        (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=x", "--grpc-server-key=y"], "--grpc-root-cert"),
        (["--sidecar-ssl-cert=x"], "--sidecar-ssl-cert and --sidecar-ssl-key go together"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "turnout", "gateway", "--sidecar=onnxruntime=127.0.0.1:1", *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert named in result.stderr
