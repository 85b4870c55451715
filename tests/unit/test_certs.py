"""The webhook's self-made certificates: issued, verified, renewed at the right time."""

from __future__ import annotations

import datetime
import ssl
import tempfile
from pathlib import Path

from cryptography import x509

from app.core import certs

NOW = datetime.datetime(2026, 11, 25, 3, 0, tzinfo=datetime.UTC)
HOSTS = ["gang-extender-webhook.gang-extender.svc", "127.0.0.1"]


def test_a_new_bundle_serves_its_hosts_and_python_ssl_accepts_it() -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    assert certs.renewal_reason(bundle, HOSTS, NOW) is None
    cert = x509.load_pem_x509_certificate(bundle.cert.encode())
    ca = x509.load_pem_x509_certificate(bundle.ca_cert.encode())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert certs.not_after(bundle.cert) == NOW + datetime.timedelta(days=certs.SERVING_DAYS)
    with tempfile.TemporaryDirectory() as tmp:
        cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_file.write_text(bundle.cert)
        key_file.write_text(bundle.key)
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)


def test_the_serving_certificate_is_renewed_with_a_third_of_its_life_left_the_ca_kept() -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    before = NOW + datetime.timedelta(days=certs.SERVING_DAYS * 2 / 3 - 1)
    after = NOW + datetime.timedelta(days=certs.SERVING_DAYS * 2 / 3 + 1)
    assert certs.renewed(bundle, HOSTS, before) is bundle
    assert certs.renewal_reason(bundle, HOSTS, after) == (
        "renew: the serving certificate is close to its end"
    )
    fresh = certs.renewed(bundle, HOSTS, after)
    assert fresh.ca_cert == bundle.ca_cert and fresh.cert != bundle.cert
    assert certs.renewal_reason(fresh, HOSTS, after) is None


def test_a_new_host_renews_the_certificate() -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    reason = certs.renewal_reason(bundle, [*HOSTS, "localhost"], NOW)
    assert reason == "renew: the serving certificate lacks localhost"
    assert certs.renewed(bundle, [*HOSTS, "localhost"], NOW).ca_cert == bundle.ca_cert


def test_a_certificate_of_another_ca_or_garbage_is_replaced() -> None:
    one, other = certs.new_bundle(HOSTS, NOW), certs.new_bundle(HOSTS, NOW)
    mixed = certs.CertBundle(one.ca_cert, one.ca_key, other.cert, other.key)
    assert certs.renewal_reason(mixed, HOSTS, NOW) == (
        "renew: the serving certificate is not signed by the CA"
    )
    broken = certs.CertBundle("garbage", one.ca_key, one.cert, one.key)
    assert certs.renewal_reason(broken, HOSTS, NOW) == "new CA: the CA certificate is unreadable"
    assert certs.renewal_reason(certs.renewed(broken, HOSTS, NOW), HOSTS, NOW) is None


def test_an_ending_ca_is_replaced_as_a_whole() -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    late = NOW + datetime.timedelta(days=certs.CA_DAYS * 2 / 3 + 1)
    assert certs.renewal_reason(bundle, HOSTS, late) == (
        "new CA: the CA certificate is close to its end"
    )
    assert certs.renewed(bundle, HOSTS, late).ca_cert != bundle.ca_cert


def test_secret_data_round_trips_and_missing_keys_mean_none() -> None:
    bundle = certs.new_bundle(HOSTS, NOW)
    assert certs.CertBundle.from_secret_data(bundle.as_secret_data()) == bundle
    assert certs.CertBundle.from_secret_data({"tls.crt": bundle.cert}) is None
