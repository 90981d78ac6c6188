"""Certificates and keys made by the tests (cryptography): a CA, a server certificate for
127.0.0.1/localhost, client certificates signed by the CA, and a self-signed impostor."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


def new_key() -> Key:
    # EC keys are generated in microseconds (RSA takes tenths of a second each).
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "starlight-py tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(subject: x509.Name, issuer: x509.Name, key: Key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class Issued:
    cert: x509.Certificate
    key: Key
    cert_file: Path
    key_file: Path


class TestPKI:
    """Writes everything under `directory`; file paths are what the proxy's conf takes."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, ca_name: str = "starlight test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = new_key()
        self.ca_cert = (
            _builder(_name(ca_name), _name(ca_name), self.ca_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca_file = directory / f"{ca_name.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(pem(self.ca_cert))

    def _write(self, stem: str, cert: x509.Certificate, key: Key) -> Issued:
        cert_file = self.directory / f"{stem}.pem"
        key_file = self.directory / f"{stem}.key"
        cert_file.write_bytes(pem(cert))
        key_file.write_bytes(key_pem(key))
        return Issued(cert, key, cert_file, key_file)

    def server(self, stem: str = "server", common_name: str = "localhost") -> Issued:
        key = new_key()
        cert = (
            _builder(_name(common_name), self.ca_cert.subject, key)
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(self.ca_key, hashes.SHA256())
        )
        return self._write(stem, cert, key)

    def client(
        self,
        common_name: str,
        *,
        dns_names: tuple[str, ...] = (),
        emails: tuple[str, ...] = (),
        stem: str | None = None,
    ) -> Issued:
        key = new_key()
        builder = _builder(_name(common_name), self.ca_cert.subject, key).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False
        )
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.RFC822Name(e) for e in emails]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return self._write(stem or f"client-{common_name}", cert, key)

    def self_signed_client(self, common_name: str) -> Issued:
        key = new_key()
        cert = (
            _builder(_name(common_name), _name(common_name), key)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(key, hashes.SHA256())
        )
        return self._write(f"self-signed-{common_name}", cert, key)

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """What an application would build: trust our CA, check the host name, and present
        `client` when given."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client is not None:
            context.load_cert_chain(str(client.cert_file), str(client.key_file))
        return context


def tls_overrides(pki: TestPKI, server: Issued, *, mutual: bool = False) -> dict[str, str]:
    """Conf keys for an amqps:// listener on a free port with these files."""
    overrides = {
        "amqpListeners": "amqps://127.0.0.1:0",
        "tlsCertificateFilePath": str(server.cert_file),
        "tlsKeyFilePath": str(server.key_file),
        "tlsTrustCertsFilePath": str(pki.ca_file),
    }
    if mutual:
        overrides["tlsRequireTrustedClientCertOnConnect"] = "true"
    return overrides
