"""The admission webhook's own certificates, when nobody gives it any.

kube-apiserver calls admission webhooks over HTTPS only, and trusts the CA in
the webhook configuration's `caBundle`. Without cert-manager (or a Secret the
operator made), gang-extender makes a CA and a serving certificate itself,
renews the serving certificate before it expires, and registers the CA in
its own MutatingWebhookConfiguration, as Kueue's internal certificate
management does (app/web/webhook.py does the registering and the serving).

The CA lives ten years and is what `caBundle` holds, so renewing the serving
certificate (one year, renewed with a third of its life left) never changes
what kube-apiserver trusts: replicas that reload a little later keep
serving a certificate that is still valid and signed by the same CA.

Pure: the clock is passed in; keys and certificates are PEM text.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVING_DAYS = 365
# Renew when less than this share of the serving certificate's life is left.
RENEW_FRACTION = 1 / 3


@dataclass(frozen=True)
class CertBundle:
    """A CA and a serving certificate it signed, all PEM."""

    ca_cert: str
    ca_key: str
    cert: str
    key: str

    def as_secret_data(self) -> dict[str, str]:
        """The Secret's keys: cert-manager's names, plus the CA's key for renewals."""
        return {
            "ca.crt": self.ca_cert,
            "ca.key": self.ca_key,
            "tls.crt": self.cert,
            "tls.key": self.key,
        }

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> CertBundle | None:
        """The bundle in decoded Secret data; None if a key is missing."""
        try:
            return cls(data["ca.crt"], data["ca.key"], data["tls.crt"], data["tls.key"])
        except KeyError:
            return None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _general_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_ca(
    now: datetime.datetime, common_name: str = "gang-extender-webhook-ca"
) -> tuple[str, str]:
    """A new self-signed CA: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def issue(
    ca_cert: str, ca_key: str, hosts: Sequence[str], now: datetime.datetime
) -> tuple[str, str]:
    """A serving certificate for `hosts` (DNS names or IP addresses), signed by the CA."""
    ca = x509.load_pem_x509_certificate(ca_cert.encode())
    signer = serialization.load_pem_private_key(ca_key.encode(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVING_DAYS))
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(signer, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def new_bundle(hosts: Sequence[str], now: datetime.datetime) -> CertBundle:
    ca_cert, ca_key = make_ca(now)
    cert, key = issue(ca_cert, ca_key, hosts, now)
    return CertBundle(ca_cert, ca_key, cert, key)


def _hosts_of(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
    }


def renewal_reason(bundle: CertBundle, hosts: Sequence[str], now: datetime.datetime) -> str | None:
    """Why the bundle must change (a message for the log), or None while it is good.

    `new CA`: the CA is unreadable or within RENEW_FRACTION of its end (a new
    CA also changes caBundle); `renew`: the serving certificate is close to
    its end, unreadable, not signed by this CA, or lacks one of `hosts`.
    """
    try:
        ca = x509.load_pem_x509_certificate(bundle.ca_cert.encode())
    except ValueError:
        return "new CA: the CA certificate is unreadable"
    if _ending(ca, now):
        return "new CA: the CA certificate is close to its end"
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert.encode())
    except ValueError:
        return "renew: the serving certificate is unreadable"
    if cert.issuer != ca.subject:
        return "renew: the serving certificate is not signed by the CA"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "renew: the serving certificate is not signed by the CA"
    missing = set(hosts) - _hosts_of(cert)
    if missing:
        return f"renew: the serving certificate lacks {', '.join(sorted(missing))}"
    if _ending(cert, now):
        return "renew: the serving certificate is close to its end"
    return None


def _ending(cert: x509.Certificate, now: datetime.datetime) -> bool:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) * RENEW_FRACTION


def renewed(bundle: CertBundle, hosts: Sequence[str], now: datetime.datetime) -> CertBundle:
    """The bundle after what renewal_reason() asked for (the same object if nothing)."""
    reason = renewal_reason(bundle, hosts, now)
    if reason is None:
        return bundle
    if reason.startswith("new CA"):
        return new_bundle(hosts, now)
    cert, key = issue(bundle.ca_cert, bundle.ca_key, hosts, now)
    return CertBundle(bundle.ca_cert, bundle.ca_key, cert, key)


def not_after(cert_pem: str) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem.encode()).not_valid_after_utc
