"""Certificates (one CA, a front-proxy CA, serving and client certs) and kubeconfigs.

Generated with the openssl CLI so the package stays stdlib-only.
"""

from __future__ import annotations

import base64
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .layout import HOST, Config, Layout
from .report import ClusterError, info
from .state import write_if_changed

FIRST_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service; must be in the serving cert

# Client certificates: (file stem, CN, O). The CNs are the identities the
# bootstrap RBAC policy already grants the right permissions to.
CLIENT_CERTS = (
    ("admin", "kube-admin", "system:masters"),
    ("kube-controller-manager", "system:kube-controller-manager", None),
    ("kube-scheduler", "system:kube-scheduler", None),
)
# The front-proxy (request-header) CA lets controller-manager and scheduler
# read a complete extension-apiserver-authentication ConfigMap (they log
# "missing content for CA bundle" otherwise) and makes API aggregation work.
FRONT_PROXY_CLIENT = "front-proxy-client"
CERT_FILES = (
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    f"{FRONT_PROXY_CLIENT}.crt",
    f"{FRONT_PROXY_CLIENT}.key",
    "apiserver.crt",
    "apiserver.key",
    "sa.key",
    "sa.pub",
    *(f"{stem}.{ext}" for stem, _, _ in CLIENT_CERTS for ext in ("crt", "key")),
)


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _sign_leaf(
    layout: Layout,
    tmp: Path,
    stem: str,
    subject: str,
    usage: str,
    sans: Sequence[str] = (),
    ca: str = "ca",
) -> None:
    """Create <stem>.key and a <ca>-signed <stem>.crt for client or server use."""
    req_cnf = tmp / f"{stem}-req.cnf"
    req_cnf.write_text("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n")
    ext = [
        "[v3]",
        "basicConstraints = critical, CA:FALSE",
        "keyUsage = critical, digitalSignature, keyEncipherment",
        f"extendedKeyUsage = {usage}",
        "authorityKeyIdentifier = keyid",
    ]
    if sans:
        ext.append("subjectAltName = " + ", ".join(sans))
    ext_cnf = tmp / f"{stem}-ext.cnf"
    ext_cnf.write_text("\n".join(ext) + "\n")
    csr = tmp / f"{stem}.csr"
    key = layout.cert(f"{stem}.key")
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-config",
        str(req_cnf),
        "-subj",
        subject,
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    key.chmod(0o600)
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(layout.cert(f"{ca}.crt")),
        "-CAkey",
        str(layout.cert(f"{ca}.key")),
        "-set_serial",
        "0x" + secrets.token_hex(16),
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        str(ext_cnf),
        "-extensions",
        "v3",
        "-out",
        str(layout.cert(f"{stem}.crt")),
    )


def _make_ca(layout: Layout, tmp: Path, stem: str, cn: str) -> None:
    """Self-signed CA <stem>.crt/<stem>.key, with an explicit config so the
    system openssl.cnf (whatever it contains) does not matter."""
    cnf = tmp / f"{stem}.cnf"
    cnf.write_text(
        f"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = {cn}\n"
        "[v3_ca]\nbasicConstraints = critical, CA:TRUE\n"
        "keyUsage = critical, keyCertSign, cRLSign, digitalSignature\n"
        "subjectKeyIdentifier = hash\n"
    )
    key = layout.cert(f"{stem}.key")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-config",
        str(cnf),
        "-extensions",
        "v3_ca",
        "-days",
        "3650",
        "-keyout",
        str(key),
        "-out",
        str(layout.cert(f"{stem}.crt")),
    )
    key.chmod(0o600)


def certs_complete(layout: Layout) -> bool:
    return all(layout.cert(name).is_file() for name in CERT_FILES)


def ensure_certs(layout: Layout) -> None:
    """Generate the CA and all keys/certs once; later `up`s reuse them.

    Reuse keeps kubeconfigs handed out earlier valid across down/up. If any
    file is missing everything is regenerated, so the set is always coherent.
    """
    if certs_complete(layout):
        return
    info("generating certificates (CA, apiserver, service-account key, client certs) with openssl")
    shutil.rmtree(layout.certs, ignore_errors=True)
    layout.certs.mkdir(parents=True)
    layout.certs.chmod(0o700)
    with tempfile.TemporaryDirectory(prefix="local-cluster-certs-") as tmpname:
        tmp = Path(tmpname)
        _make_ca(layout, tmp, "ca", "local-cluster-ca")
        _make_ca(layout, tmp, "front-proxy-ca", "local-cluster-front-proxy-ca")
        _sign_leaf(
            layout,
            tmp,
            FRONT_PROXY_CLIENT,
            f"/CN={FRONT_PROXY_CLIENT}",
            "clientAuth",
            ca="front-proxy-ca",
        )
        sans = [
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
            f"IP:{HOST}",
            f"IP:{FIRST_SERVICE_IP}",
        ]
        _sign_leaf(layout, tmp, "apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        for stem, cn, org in CLIENT_CERTS:
            subject = f"/O={org}/CN={cn}" if org else f"/CN={cn}"
            _sign_leaf(layout, tmp, stem, subject, "clientAuth")
        _openssl(
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            str(layout.cert("sa.key")),
        )
        layout.cert("sa.key").chmod(0o600)
        _openssl(
            "pkey", "-in", str(layout.cert("sa.key")), "-pubout", "-out", str(layout.cert("sa.pub"))
        )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def write_kubeconfigs(config: Config) -> None:
    """Admin, controller-manager and scheduler kubeconfigs with embedded certs.

    Embedded data makes the admin kubeconfig self-contained, so it can be
    copied or handed to a test without the certs directory.
    """
    layout = config.layout
    for stem, cn, _ in CLIENT_CERTS:
        path = layout.admin_kubeconfig if stem == "admin" else layout.kubeconfig_for(stem)
        content = (
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- name: local-cluster\n"
            "  cluster:\n"
            f"    server: {config.ports.apiserver_url}\n"
            f"    certificate-authority-data: {_b64(layout.cert('ca.crt'))}\n"
            "users:\n"
            f"- name: {cn}\n"
            "  user:\n"
            f"    client-certificate-data: {_b64(layout.cert(stem + '.crt'))}\n"
            f"    client-key-data: {_b64(layout.cert(stem + '.key'))}\n"
            "contexts:\n"
            "- name: local-cluster\n"
            "  context:\n"
            "    cluster: local-cluster\n"
            f"    user: {cn}\n"
            "current-context: local-cluster\n"
        )
        write_if_changed(path, content, 0o600)
