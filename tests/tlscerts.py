"""Test certificates made with the openssl CLI: a CA, and leaves it signs.

A leaf serves and authenticates clients alike (server auth + client auth, SANs
127.0.0.1 and localhost): tests/cluster/test_tls.py's chart Secret, and the
API server and client certificates of tests/unit/test_kube_http.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
"""


def openssl(*args: str | Path, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(map(str, args))}:\n{result.stderr}"


def make_ca(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_leaf(directory: Path, ca: str, name: str) -> None:
    (directory / "leaf.ext").write_text(LEAF_EXTENSIONS)
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "1", "-extfile", "leaf.ext", "-out", f"{name}.crt",
        cwd=directory,
    )  # fmt: skip
