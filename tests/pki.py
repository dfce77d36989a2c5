"""Throwaway certificates for the TLS tests, made with `cryptography` at test time: a CA,
a server certificate for 127.0.0.1 and localhost, and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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
