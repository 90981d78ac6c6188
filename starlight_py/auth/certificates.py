"""Who a client certificate names, for SASL EXTERNAL (pure: DER bytes in, a name out).

The TLS layer has already checked the certificate against the trusted CAs; this only reads
the identity out of it, from the subject's common name (RabbitMQ's `ssl_cert_login_from =
common_name`, Starlight's choice) or from a subject alternative name.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import NameOID

from starlight_py.auth.errors import AuthenticationFailed
from starlight_py.model.text import as_text

PRINCIPAL_SOURCES = ("cn", "san_dns", "san_email")


class CertificateIdentityMissing(AuthenticationFailed):
    """The certificate has no identity of the configured kind."""


def certificate_principal(der: bytes, source: str = "cn") -> str:
    """The principal named by a DER certificate. Raises CertificateIdentityMissing (also for
    bytes that are not a certificate) and ValueError for an unknown `source`."""
    if source not in PRINCIPAL_SOURCES:
        raise ValueError(f"unknown principal source {source!r}")
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as e:
        raise CertificateIdentityMissing(f"client certificate is unreadable: {e}") from e
    if source == "cn":
        names = [as_text(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    else:
        kind: type[x509.DNSName] | type[x509.RFC822Name] = (
            x509.DNSName if source == "san_dns" else x509.RFC822Name
        )
        try:
            extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            names = []
        else:
            names = list(extension.value.get_values_for_type(kind))
    names = [n for n in names if n]
    if not names:
        raise CertificateIdentityMissing(
            f"client certificate '{cert.subject.rfc4514_string()}' has no {source} identity"
        )
    return names[0]
