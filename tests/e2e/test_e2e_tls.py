"""TLS: gRPC with a server certificate and optional mutual TLS (Triton's --grpc-use-ssl,
--grpc-use-ssl-mutual, --grpc-server-cert, --grpc-server-key, --grpc-root-cert), and
HTTPS on the HTTP front. Certificates are made for each run with `cryptography`."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from harness import ROOT, Server, turnout_up, write_repository
from simple_requests import check_simple, grpc_inputs, simple_arrays
from tritonclient.utils import InferenceServerException


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None, signer: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


class Pki:
    """A throwaway CA, a server certificate for 127.0.0.1, and a client certificate."""

    def __init__(self, folder: Path) -> None:
        ca_key = _key()
        ca = _certificate("turnout test CA", ca_key, None, ca_key)
        _, self.ca = _write(folder / "ca", ca_key, ca)
        server_key = _key()
        self.server_key, self.server_cert = _write(
            folder / "server", server_key, _certificate("127.0.0.1", server_key, ca, ca_key)
        )
        client_key = _key()
        self.client_key, self.client_cert = _write(
            folder / "client", client_key, _certificate("client", client_key, ca, ca_key)
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


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


def test_tls_flags_are_checked(tmp_path: Path) -> None:
    for flags in (
        ["--grpc-use-ssl=true"],
        ["--grpc-use-ssl-mutual=true", "--grpc-server-cert=x", "--grpc-server-key=y"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "gateway", "--sidecar=onnxruntime=127.0.0.1:1", *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert "--grpc" in result.stderr
