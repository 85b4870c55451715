"""Run a real local Kubernetes control plane on loopback for tests and demos.

gang-extender is a kube-scheduler extender, so the only convincing test is the
real kube-scheduler calling it against a real API server. This module starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by
hack/build-kube at the pinned version) as background processes bound to
127.0.0.1, with working certificate authentication and Node,RBAC
authorization, and registers fake Node objects (no kubelet) for the scheduler
to place pods on. A pod simulator plays the kubelet of those nodes, so bound
pods run, finish and go away when deleted.

It is deliberately stdlib-only (plus the openssl CLI for certificates) so that
it runs on a bare CI machine without Docker, kind or a virtualenv.

Entry point: ``main()`` (wrapped by the executable ``hack/local-cluster``).
Everything it creates lives in one state directory (``<repo>/.local-cluster``
or ``$LOCAL_CLUSTER_DIR``), so ``down`` can undo exactly what ``up`` did.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_KUBE = REPO_ROOT / "hack" / "build-kube"
VERSIONS_ENV = REPO_ROOT / "hack" / "kube" / "versions.env"
CRD_DIR = REPO_ROOT / "deploy" / "crds"
SCHEDULER_CONFIG_TEMPLATE = REPO_ROOT / "deploy" / "scheduler-config.yaml"

# Ports are deliberately far from the defaults (2379/2380, 6443, 10257,
# 10259) so the local cluster can run next to a real one on the same machine.
HOST = "127.0.0.1"
# LOCAL_CLUSTER_PORT_OFFSET (with its own LOCAL_CLUSTER_DIR) runs several
# clusters side by side: the test suite gives each concurrent session a slot.
PORT_OFFSET = int(os.environ.get("LOCAL_CLUSTER_PORT_OFFSET", "0"))
ETCD_CLIENT_PORT = 22379 + PORT_OFFSET
ETCD_PEER_PORT = 22380 + PORT_OFFSET
APISERVER_PORT = 16443 + PORT_OFFSET
CONTROLLER_MANAGER_PORT = 20257 + PORT_OFFSET
SCHEDULER_PORT = 20259 + PORT_OFFSET
NODELIST_SCHEDULER_PORT = 20260 + PORT_OFFSET

SERVICE_CIDR = "10.96.0.0/12"
FIRST_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service; must be in the serving cert
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
APISERVER_URL = f"https://{HOST}:{APISERVER_PORT}"

DEFAULT_SCHEDULER_NAME = "default-scheduler"
NODELIST_SCHEDULER_NAME = "gang-scheduler-nodelist"
DEFAULT_EXTENDER_URL = "http://127.0.0.1:8888/scheduler"

# Fake nodes have no kubelet, so nothing renews their heartbeat. The node
# lifecycle controller would mark them NotReady/Unknown after the grace period
# and taint them unreachable; disabling it keeps them Ready for as long as the
# cluster runs, with no background heartbeat process to manage.
DISABLED_CONTROLLERS = ("node-lifecycle-controller",)
# TaintNodesByCondition adds node.kubernetes.io/not-ready:NoSchedule to every
# new Node and relies on the (disabled) node lifecycle controller to lift it.
DISABLED_ADMISSION_PLUGINS = ("TaintNodesByCondition",)

FAKE_NODE_LABEL = ("type", "fake-node")

STOP_GRACE_SECONDS = 15.0
LOG_TAIL_LINES = 30

CORE_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
SCHEDULER_COMPONENTS = ("kube-scheduler", "kube-scheduler-nodelist")
# Plays the kubelet for the fake nodes: a Python process running this very
# script (`simulate-pods`), not a Kubernetes binary.
POD_SIMULATOR = "pod-simulator"
SIMULATE_COMMAND = "simulate-pods"
ALL_COMPONENTS = CORE_COMPONENTS + SCHEDULER_COMPONENTS + (POD_SIMULATOR,)
COMPONENT_BINARY = {
    "etcd": "etcd",
    "kube-apiserver": "kube-apiserver",
    "kube-controller-manager": "kube-controller-manager",
    "kube-scheduler": "kube-scheduler",
    "kube-scheduler-nodelist": "kube-scheduler",
}
COMPONENT_PORTS = {
    "etcd": (ETCD_CLIENT_PORT, ETCD_PEER_PORT),
    "kube-apiserver": (APISERVER_PORT,),
    "kube-controller-manager": (CONTROLLER_MANAGER_PORT,),
    "kube-scheduler": (SCHEDULER_PORT,),
    "kube-scheduler-nodelist": (NODELIST_SCHEDULER_PORT,),
    POD_SIMULATOR: (),
}

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

_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class ClusterError(Exception):
    """A failure to report to the user: which component, and its log if any."""

    def __init__(self, message: str, log_file: Path | None = None) -> None:
        super().__init__(message)
        self.log_file = log_file


def info(message: str) -> None:
    """Progress goes to stderr so stdout carries only the `export` line."""
    print(f"local-cluster: {message}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of a log file, for error messages (empty if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


# --------------------------------------------------------------------------
# Layout of the state directory


@dataclass(frozen=True)
class Layout:
    """Every path the cluster uses, all under one state directory.

    Keeping everything in one place is what makes `down` exact and lets tests
    point LOCAL_CLUSTER_DIR at a temporary directory.
    """

    root: Path

    @classmethod
    def from_env(cls) -> Layout:
        raw = os.environ.get("LOCAL_CLUSTER_DIR")
        root = Path(raw).expanduser() if raw else REPO_ROOT / ".local-cluster"
        return cls(root.resolve())

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def kubectl_cache(self) -> Path:
        return self.root / "kubectl-cache"

    def kubeconfig_for(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.pids / f"{component}.pid"

    def scheduler_config(self, component: str) -> Path:
        return self.root / f"{component}-config.yaml"

    def cert(self, name: str) -> Path:
        return self.certs / name

    def ensure_dirs(self) -> None:
        for d in (self.root, self.certs, self.logs, self.pids):
            d.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Serialize up/down/add-node so parallel test workers cannot race."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with layout.lock_file.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_if_changed(path: Path, content: str, mode: int = 0o644) -> bool:
    """Atomic write that leaves the file alone when the content is the same.

    Readers (tests holding KUBECONFIG) never see a half-written file.
    """
    try:
        if path.read_text() == content:
            return False
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def load_state(layout: Layout) -> dict[str, Any]:
    """The JSON record of what `up` started with which options ({} if none)."""
    try:
        data = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(layout: Layout, state: dict[str, Any]) -> None:
    write_if_changed(layout.state_file, json.dumps(state, indent=2, sort_keys=True) + "\n")


def read_versions() -> dict[str, str]:
    """Parse hack/kube/versions.env (KEY=VALUE lines) - the single version pin."""
    versions: dict[str, str] = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip().strip("\"'")
    return versions


def build_kube() -> Path:
    """Get the bin dir from hack/build-kube (instant when already cached)."""
    proc = subprocess.run([str(BUILD_KUBE)], stdout=subprocess.PIPE, stderr=None, text=True)
    if proc.returncode != 0:
        raise ClusterError(
            f"hack/build-kube failed with exit code {proc.returncode} (see its output above)"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ClusterError("hack/build-kube printed no bin directory")
    bin_dir = Path(lines[-1]).resolve()
    missing = [
        b
        for b in sorted(set(COMPONENT_BINARY.values())) + ["kubectl"]
        if not (bin_dir / b).is_file()
    ]
    if missing:
        raise ClusterError(f"hack/build-kube returned {bin_dir}, but it lacks {', '.join(missing)}")
    return bin_dir


# --------------------------------------------------------------------------
# Certificates


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
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


def write_kubeconfigs(layout: Layout) -> None:
    """Admin, controller-manager and scheduler kubeconfigs with embedded certs.

    Embedded data makes the admin kubeconfig self-contained, so it can be
    copied or handed to a test without the certs directory.
    """
    for stem, cn, _ in CLIENT_CERTS:
        path = layout.admin_kubeconfig if stem == "admin" else layout.kubeconfig_for(stem)
        content = (
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- name: local-cluster\n"
            "  cluster:\n"
            f"    server: {APISERVER_URL}\n"
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


# --------------------------------------------------------------------------
# Scheduler configuration


@dataclass(frozen=True)
class SchedulerSpec:
    """One kube-scheduler process: its component name, profile and extender mode."""

    component: str
    scheduler_name: str
    node_cache_capable: bool
    port: int


def desired_schedulers(
    extender_url: str, node_cache_capable: bool, with_nodelist: bool, scheduler: bool = True
) -> list[SchedulerSpec]:
    if not scheduler:
        # `up --no-scheduler`: the caller runs its own kube-scheduler (bench/e2e.py
        # starts one per run, after the pods exist).
        return []
    specs = [
        SchedulerSpec("kube-scheduler", DEFAULT_SCHEDULER_NAME, node_cache_capable, SCHEDULER_PORT)
    ]
    if with_nodelist:
        # The second scheduler always runs the extender in node-list mode so
        # tests can exercise both nodeCacheCapable modes at once.
        specs.append(
            SchedulerSpec(
                "kube-scheduler-nodelist", NODELIST_SCHEDULER_NAME, False, NODELIST_SCHEDULER_PORT
            )
        )
    return specs


def render_scheduler_config(layout: Layout, spec: SchedulerSpec, extender_url: str) -> str:
    """Fill deploy/scheduler-config.yaml's placeholders for one scheduler.

    The template has no placeholder for the profile name; if it gains
    @SCHEDULER_NAME@ that is used, otherwise the single
    `schedulerName: default-scheduler` line is rewritten.
    """
    text = SCHEDULER_CONFIG_TEMPLATE.read_text()
    quoted_url = extender_url.replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("@KUBECONFIG@", str(layout.kubeconfig_for("kube-scheduler")))
    text = text.replace("@EXTENDER_URL@", quoted_url)
    text = text.replace("@NODE_CACHE_CAPABLE@", "true" if spec.node_cache_capable else "false")
    if "@SCHEDULER_NAME@" in text:
        text = text.replace("@SCHEDULER_NAME@", spec.scheduler_name)
    elif spec.scheduler_name != DEFAULT_SCHEDULER_NAME:
        pattern = re.compile(
            r"^(\s*-?\s*schedulerName:\s*)\"?default-scheduler\"?[ \t]*$", re.MULTILINE
        )
        text, count = pattern.subn(lambda m: m.group(1) + spec.scheduler_name, text)
        if count != 1:
            raise ClusterError(
                f"{SCHEDULER_CONFIG_TEMPLATE}: expected exactly one `schedulerName: default-scheduler` "
                f"line (or an @SCHEDULER_NAME@ placeholder) to set profile {spec.scheduler_name}, found {count}"
            )
    leftover = [
        m.group(0)
        for line in text.splitlines()
        if not line.lstrip().startswith("#")
        for m in re.finditer(r"@[A-Z_]+@", line)
    ]
    if leftover:
        raise ClusterError(
            f"{SCHEDULER_CONFIG_TEMPLATE}: unknown placeholder(s) {', '.join(sorted(set(leftover)))}"
        )
    return text


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------
# Component command lines


# Alpha/beta APIs that a feature gate needs served, so `up --feature-gates
# GenericWorkload=true` is enough to use Kubernetes' native PodGroups.
FEATURE_RUNTIME_CONFIG = {"GenericWorkload": "scheduling.k8s.io/v1beta1=true"}


def parse_feature_gates(text: str) -> dict[str, bool]:
    """`A=true,B=false` -> {"A": True, "B": False}; ValueError naming the bad item."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
            raise ValueError(f"expected Name=true|false, got {item!r}")
        if value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {key}: expected true or false, got {value!r}")
        gates[key] = value.lower() == "true"
    return gates


def feature_gate_flags(name: str, gates: dict[str, bool]) -> list[str]:
    """The --feature-gates (and, for the apiserver, --runtime-config) flags of a component."""
    if not gates or name not in (*CORE_COMPONENTS, *SCHEDULER_COMPONENTS) or name == "etcd":
        return []
    flags = [
        "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
    ]
    if name == "kube-apiserver":
        apis = [
            FEATURE_RUNTIME_CONFIG[k]
            for k, on in sorted(gates.items())
            if on and k in FEATURE_RUNTIME_CONFIG
        ]
        if apis:
            flags.append("--runtime-config=" + ",".join(apis))
    return flags


def component_args(
    layout: Layout, name: str, feature_gates: dict[str, bool] | None = None
) -> list[str]:
    """Command-line flags of each component (the binary path is added later)."""
    return _base_component_args(layout, name) + feature_gate_flags(name, feature_gates or {})


def _base_component_args(layout: Layout, name: str) -> list[str]:
    c = layout.cert
    if name == "etcd":
        return [
            "--name=local-cluster",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls=http://{HOST}:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://{HOST}:{ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://{HOST}:{ETCD_PEER_PORT}",
            f"--initial-cluster=local-cluster=http://{HOST}:{ETCD_PEER_PORT}",
            # A throwaway test cluster: durability is not worth the fsync
            # latency that slows every write on small CI disks.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={APISERVER_PORT}",
            f"--etcd-servers=http://{HOST}:{ETCD_CLIENT_PORT}",
            # ConfigMaps are watched straight from etcd, compacted every 10s:
            # a watch from an old resourceVersion then really gets 410 Gone,
            # which the reflector tests rely on. Nothing else uses ConfigMaps.
            "--watch-cache-sizes=configmaps#0",
            "--etcd-compaction-interval=10s",
            f"--client-ca-file={c('ca.crt')}",
            f"--tls-cert-file={c('apiserver.crt')}",
            f"--tls-private-key-file={c('apiserver.key')}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={c('sa.pub')}",
            f"--service-account-signing-key-file={c('sa.key')}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--requestheader-client-ca-file={c('front-proxy-ca.crt')}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={c(FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={c(FRONT_PROXY_CLIENT + '.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
            "--allow-privileged=true",
            # No kube-proxy or pods serve the `kubernetes` Service, and
            # endpoints may not point at loopback anyway.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={layout.root / 'apiserver-certs'}",
        ]
    if name == "kube-controller-manager":
        kubeconfig = layout.kubeconfig_for("kube-controller-manager")
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={HOST}",
            f"--secure-port={CONTROLLER_MANAGER_PORT}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={c('sa.key')}",
            f"--root-ca-file={c('ca.crt')}",
            f"--cluster-signing-cert-file={c('ca.crt')}",
            f"--cluster-signing-key-file={c('ca.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*," + ",".join(f"-{ctrl}" for ctrl in DISABLED_CONTROLLERS),
            f"--cert-dir={layout.root / 'kube-controller-manager-certs'}",
            # Default is under /usr/libexec, which it would create.
            f"--flex-volume-plugin-dir={layout.root / 'flexvolume'}",
        ]
    if name in SCHEDULER_COMPONENTS:
        kubeconfig = layout.kubeconfig_for("kube-scheduler")
        port = SCHEDULER_PORT if name == "kube-scheduler" else NODELIST_SCHEDULER_PORT
        return [
            f"--config={layout.scheduler_config(name)}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
            f"--cert-dir={layout.root / (name + '-certs')}",
            # 2 logs why each pod did not fit; raise it (e.g. 5) to see queue moves.
            f"--v={os.environ.get('LOCAL_CLUSTER_SCHEDULER_VERBOSITY', '2')}",
        ]
    raise ValueError(name)


def component_argv(
    layout: Layout, bin_dir: Path, name: str, feature_gates: dict[str, bool] | None = None
) -> list[str]:
    """The full command line of a component."""
    if name == POD_SIMULATOR:
        # -B: keep hack/ free of __pycache__, as the wrapper does.
        return [
            sys.executable,
            "-B",
            str(Path(__file__).resolve()),
            SIMULATE_COMMAND,
            f"--state-dir={layout.root}",
        ]
    return [
        str(bin_dir / COMPONENT_BINARY[name]),
        *component_args(layout, name, feature_gates),
    ]


# --------------------------------------------------------------------------
# Processes


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def read_pid(layout: Layout, name: str) -> int | None:
    try:
        return int(layout.pid_file(name).read_text().strip())
    except (OSError, ValueError):
        return None


def is_ours(layout: Layout, name: str, pid: int) -> bool:
    """True if pid is alive and really is this component of this cluster.

    argv[0] must be the expected binary and the command line must mention our
    state directory (every component's flags do), so a recycled pid or the
    same binary run by someone else is never mistaken for ours.
    """
    argv = _cmdline(pid)  # empty for dead and zombie processes
    if name == POD_SIMULATOR:
        # python3 -B <this script> simulate-pods --state-dir=<root>
        return (
            bool(argv)
            and str(Path(__file__).resolve()) in argv[1:]
            and SIMULATE_COMMAND in argv[1:]
            and f"--state-dir={layout.root}" in argv[1:]
        )
    if not argv or Path(argv[0]).name != COMPONENT_BINARY[name]:
        return False
    if not any(str(layout.root) in arg for arg in argv[1:]):
        return False
    if name in SCHEDULER_COMPONENTS:
        return f"--config={layout.scheduler_config(name)}" in argv[1:]
    return True


def running_pid(layout: Layout, name: str) -> int | None:
    pid = read_pid(layout, name)
    return pid if pid is not None and is_ours(layout, name, pid) else None


def _reap(pid: int) -> None:
    """Collect a child we started in this invocation so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class Launcher:
    """Starts components in the background and remembers them for error reports."""

    layout: Layout
    bin_dir: Path
    feature_gates: dict[str, bool] = field(default_factory=dict)
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str) -> int:
        busy = [p for p in COMPONENT_PORTS[name] if not port_free(p)]
        if busy:
            raise ClusterError(
                f"cannot start {name}: port(s) {', '.join(map(str, busy))} on {HOST} already in use "
                f"by another process (not started by this cluster; see `ss -ltnp`)"
            )
        argv = component_argv(self.layout, self.bin_dir, name, self.feature_gates)
        log_path = self.layout.log(name)
        with log_path.open("wb") as log:
            stamp = dt.datetime.now().isoformat(timespec="seconds")
            log.write(f"# {stamp} local-cluster started: {shlex.join(argv)}\n".encode())
            log.flush()
            # A new session detaches the process from our terminal/process
            # group, so it survives this script and Ctrl-C in the shell.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.layout.root,
                start_new_session=True,
                close_fds=True,
            )
        self.started[name] = proc
        self.layout.pid_file(name).write_text(f"{proc.pid}\n")
        # Popen returns as soon as exec begins; for a few ms the kernel still
        # shows an empty /proc/<pid>/cmdline (large binaries widen the gap),
        # which is_ours() would read as "not running". Wait it out.
        deadline = time.monotonic() + 5
        while not _cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        info(f"started {name} (pid {proc.pid}, log {log_path})")
        return proc.pid

    def check_alive(self, name: str, waiting_for: str) -> None:
        """Fail fast, with the log, if a component died while we wait on it."""
        pid = read_pid(self.layout, name)
        if pid is not None and is_ours(self.layout, name, pid):
            return
        proc = self.started.get(name)
        code = proc.poll() if proc is not None else None
        how = f"exited with code {code}" if code is not None else "is not running"
        raise ClusterError(f"{name} {how} while waiting for {waiting_for}", self.layout.log(name))


def stop_components(layout: Layout, names: Sequence[str]) -> None:
    """SIGTERM the given components (only if really ours), SIGKILL stragglers."""
    targets: dict[str, int] = {}
    for name in names:
        pid = read_pid(layout, name)
        if pid is None:
            layout.pid_file(name).unlink(missing_ok=True)
            continue
        if is_ours(layout, name, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            targets[name] = pid
        else:
            _reap(pid)
            layout.pid_file(name).unlink(missing_ok=True)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while targets and time.monotonic() < deadline:
        for name, pid in list(targets.items()):
            _reap(pid)
            if not is_ours(layout, name, pid):
                info(f"stopped {name} (pid {pid})")
                del targets[name]
                layout.pid_file(name).unlink(missing_ok=True)
        if targets:
            time.sleep(0.2)
    for name, pid in targets.items():
        info(f"{name} (pid {pid}) ignored SIGTERM for {STOP_GRACE_SECONDS:.0f}s; sending SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            _reap(pid)
            if not is_ours(layout, name, pid):
                break
            time.sleep(0.1)
        else:
            raise ClusterError(f"{name} (pid {pid}) survived SIGKILL")
        layout.pid_file(name).unlink(missing_ok=True)


def stop_all(layout: Layout) -> None:
    """Stop clients before servers so shutdown logs stay free of noise."""
    stop_components(layout, (POD_SIMULATOR, *SCHEDULER_COMPONENTS, "kube-controller-manager"))
    stop_components(layout, ("kube-apiserver",))
    stop_components(layout, ("etcd",))


# --------------------------------------------------------------------------
# HTTP / API access


_NO_PROXY_HANDLER = urllib.request.ProxyHandler({})  # loopback must never go via $HTTPS_PROXY


def _insecure_context() -> ssl.SSLContext:
    """For /healthz of controller-manager and scheduler, whose serving certs
    are self-signed at startup; fine for a loopback liveness probe."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_get(
    url: str, context: ssl.SSLContext | None = None, timeout: float = 3.0
) -> tuple[int, str]:
    handlers: list[urllib.request.BaseHandler] = [_NO_PROXY_HANDLER]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", errors="replace")


class Api:
    """Minimal Kubernetes API client authenticated with the admin client cert."""

    def __init__(self, layout: Layout) -> None:
        ctx = ssl.create_default_context(cafile=str(layout.cert("ca.crt")))
        ctx.load_cert_chain(str(layout.cert("admin.crt")), str(layout.cert("admin.key")))
        self._opener = urllib.request.build_opener(
            _NO_PROXY_HANDLER, urllib.request.HTTPSHandler(context=ctx)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(APISERVER_URL + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", errors="replace")

    def readyz(self, timeout: float = 3.0) -> bool:
        try:
            status, _ = self.request("GET", "/readyz", timeout=timeout)
        except (OSError, ssl.SSLError):
            return False
        return status == 200

    def stream(self, path: str, timeout: float) -> Iterator[dict[str, Any]]:
        """GET a watch and yield its events (one JSON object per line) as they arrive.

        `timeout` bounds each socket read, so it must exceed the watch's
        timeoutSeconds (bookmarks arrive about once a minute in between).
        """
        req = urllib.request.Request(APISERVER_URL + path, method="GET")
        req.add_header("Accept", "application/json")
        try:
            resp = self._opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise ClusterError(f"GET {path}: HTTP {err.code}: {err.read()[:300]!r}") from None
        with resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    launcher: Launcher | None = None,
    watch: Sequence[str] = (),
    log_of: str | None = None,
) -> None:
    """Poll check() until true; fail early if a watched component dies."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if launcher is not None:
            for name in watch:
                launcher.check_alive(name, what)
        try:
            if check():
                return
        except (OSError, ssl.SSLError, ValueError) as err:
            last_error = f" (last error: {err})"
        if time.monotonic() >= deadline:
            log_file = launcher.layout.log(log_of) if launcher is not None and log_of else None
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for {what}{last_error}", log_file
            )
        time.sleep(0.5)


def _healthz_ok(port: int) -> Callable[[], bool]:
    """Probe for controller-manager/scheduler; /healthz needs no credentials."""

    def check() -> bool:
        status, body = http_get(f"https://{HOST}:{port}/healthz", _insecure_context())
        return status == 200 and body.strip() == "ok"

    return check


def _etcd_healthy() -> bool:
    status, body = http_get(f"http://{HOST}:{ETCD_CLIENT_PORT}/health")
    return status == 200 and json.loads(body).get("health") == "true"


# --------------------------------------------------------------------------
# kubectl, CRDs, fake nodes


def kubectl(layout: Layout, bin_dir: Path, *args: str, timeout: float = 120.0) -> str:
    """Run the built kubectl (never the system one) with the admin kubeconfig."""
    argv = [
        str(bin_dir / "kubectl"),
        f"--kubeconfig={layout.admin_kubeconfig}",
        f"--cache-dir={layout.kubectl_cache}",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ClusterError(
            f"kubectl {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def install_crds(layout: Layout, bin_dir: Path) -> None:
    """kubectl apply deploy/crds/ and wait until the API serves them."""
    if not any(CRD_DIR.glob("*.yaml")):
        return
    kubectl(layout, bin_dir, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    kubectl(
        layout, bin_dir, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD_DIR)
    )
    info(f"CRDs from {CRD_DIR.relative_to(REPO_ROOT)} applied and Established")


@dataclass(frozen=True)
class NodeShape:
    """Resources and extra labels of a fake node."""

    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)


def _go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def create_fake_node(api: Api, name: str, shape: NodeShape, kube_version: str) -> None:
    """Register a Node object that looks like a healthy kubelet-managed node.

    Status is written through the status subresource, as a kubelet does,
    so the scheduler sees the same fields a real node reports.
    """
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        FAKE_NODE_LABEL[0]: FAKE_NODE_LABEL[1],
    }
    labels.update(shape.labels)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }
    status, body = api.request("POST", "/api/v1/nodes", node)
    if status == 409:
        raise ClusterError(f"node {name} already exists")
    if status != 201:
        raise ClusterError(f"creating node {name} failed: HTTP {status}: {_message(body)}")
    if (body or {}).get("spec", {}).get("taints"):
        # Defensive: an admission plugin tainted the node; nothing would lift it.
        status, body = api.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": None}},
            "application/merge-patch+json",
        )
        if status != 200:
            raise ClusterError(
                f"removing taints from node {name} failed: HTTP {status}: {_message(body)}"
            )
    set_fake_node_status(api, name, shape, kube_version)


def set_fake_node_status(api: Api, name: str, shape: NodeShape, kube_version: str) -> None:
    """Capacity/allocatable from the shape, Ready=True, no pressure conditions."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": str(shape.pods)}

    def condition(ctype: str, value: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": ctype,
            "status": value,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    node_status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "fake node"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "fake node"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "fake node"),
                condition(
                    "Ready", "True", "KubeletReady", "fake node registered by hack/local-cluster"
                ),
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "fake",
                "containerRuntimeVersion": "fake://0",
                "kubeletVersion": kube_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": _go_arch(),
            },
        }
    }
    status, body = api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", node_status, "application/merge-patch+json"
    )
    if status != 200:
        raise ClusterError(f"setting status of node {name} failed: HTTP {status}: {_message(body)}")


def _message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message", body))
    return str(body)[:500]


def node_counts(api: Api) -> tuple[int, int]:
    """(Ready nodes, all nodes)."""
    status, body = api.request("GET", "/api/v1/nodes")
    if status != 200:
        raise ClusterError(f"listing nodes failed: HTTP {status}: {_message(body)}")
    items = body.get("items", [])
    return sum(1 for n in items if _is_ready(n)), len(items)


def _is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ensure_nodes(api: Api, count: int, shape: NodeShape, kube_version: str) -> None:
    """Create node-1..node-N if missing; existing (or extra) nodes are left as they are.

    The one repair: a fake node whose status was never written (an `up`
    interrupted between create and status) gets its status now.
    """
    created = []
    for i in range(1, count + 1):
        name = f"node-{i}"
        status, body = api.request("GET", f"/api/v1/nodes/{name}")
        if status == 200:
            labels = body.get("metadata", {}).get("labels") or {}
            if labels.get(FAKE_NODE_LABEL[0]) == FAKE_NODE_LABEL[1] and not _is_ready(body):
                set_fake_node_status(api, name, shape, kube_version)
                info(f"repaired status of fake node {name}")
            continue
        if status != 404:
            raise ClusterError(f"reading node {name} failed: HTTP {status}: {_message(body)}")
        create_fake_node(api, name, shape, kube_version)
        created.append(name)
    if created:
        info(
            f"created fake node(s) {', '.join(created)} (cpu={shape.cpu}, memory={shape.memory}, pods={shape.pods})"
        )


# --------------------------------------------------------------------------
# Pod simulator: the kubelet of the fake nodes
#
# Without a kubelet, a bound pod stays Pending and a pod deleted with a grace
# period stays Terminating forever, so nothing downstream of binding (pod
# phases, preemption victims leaving, jobs finishing) could be tested. This
# loop does the few things a kubelet does that the control plane can see.

EXIT_AFTER_ANNOTATION = "local-cluster.dev/exit-after-seconds"
EXIT_PHASE_ANNOTATION = "local-cluster.dev/exit-phase"
EXIT_PHASES = ("Succeeded", "Failed")
SIMULATOR_WATCH_SECONDS = 300
SIMULATOR_READY_LINE = "watching pods"

# What the simulator does next to a pod (see next_pod_action).
RUN, DELETE, EXIT = "run", "delete", "exit"


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _fake_ip(prefix: str, key: str) -> str:
    """A stable made-up address under 10.0.0.0/8 (fake nodes have no network)."""
    h = hashlib.sha256(key.encode()).digest()
    return f"{prefix}.{h[0]}.{h[1] % 254 + 1}"


def exit_plan(pod: dict[str, Any]) -> tuple[float, str] | None:
    """(seconds after Running, final phase) from the exit annotations, None if absent or invalid."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(EXIT_AFTER_ANNOTATION)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    phase = annotations.get(EXIT_PHASE_ANNOTATION) or "Succeeded"
    if seconds < 0 or phase not in EXIT_PHASES:
        return None
    return seconds, phase


def next_pod_action(pod: dict[str, Any], is_fake_node: Callable[[str], bool]) -> str | None:
    """What a kubelet on the pod's node would do next: RUN, DELETE, EXIT or nothing."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or not is_fake_node(node):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        # The kubelet's final delete after the containers stopped.
        return DELETE
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase == "Pending":
        return RUN
    if phase == "Running" and exit_plan(pod) is not None:
        return EXIT
    return None


def running_status_patch(pod: dict[str, Any], now: float) -> dict[str, Any]:
    """Status a kubelet reports once every container started and is ready."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ts = _rfc3339(now)
    host_ip = _fake_ip("10.0", spec.get("nodeName") or "")
    pod_ip = _fake_ip("10.244", meta.get("uid") or "")
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": ts}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    ]
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": ts,
        "containerStatuses": [
            _container_status(meta, c, {"running": {"startedAt": ts}}, ready=True)
            for c in spec.get("containers") or ()
        ],
    }
    init = [
        _container_status(meta, c, _terminated(0, ts, ts), ready=True)
        for c in spec.get("initContainers") or ()
    ]
    if init:
        status["initContainerStatuses"] = init
    # metadata.uid is a precondition: a recreated pod of the same name is left alone.
    return {"metadata": {"uid": meta.get("uid")}, "status": status}


def terminal_status_patch(
    pod: dict[str, Any], phase: str, started: float, now: float
) -> dict[str, Any]:
    """Status after every container exited with 0 (Succeeded) or 1 (Failed)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ts = _rfc3339(now)
    code = 0 if phase == "Succeeded" else 1
    reason = "PodCompleted" if code == 0 else "PodFailed"
    return {
        "metadata": {"uid": meta.get("uid")},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "False", "reason": reason, "lastTransitionTime": ts}
                for t in ("Ready", "ContainersReady")
            ],
            "containerStatuses": [
                _container_status(meta, c, _terminated(code, _rfc3339(started), ts), ready=False)
                for c in spec.get("containers") or ()
            ],
        },
    }


def _terminated(code: int, started: str, finished: str) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
    }


def _container_status(
    meta: dict[str, Any], container: dict[str, Any], state: dict[str, Any], *, ready: bool
) -> dict[str, Any]:
    name = container.get("name") or ""
    return {
        "name": name,
        "image": container.get("image") or "",
        "imageID": "",
        "containerID": f"fake://{meta.get('uid')}/{name}",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


class WatchExpired(Exception):
    """410 Gone: list again."""


class PodSimulator:
    """List + watch every pod and act as the kubelet of fake nodes.

    Each action is sent once per pod (remembered by uid) and forgotten if the
    API call fails, so the next event about that pod retries it.
    """

    def __init__(self, api: Api, log: Callable[[str], None]) -> None:
        self._api = api
        self._log = log
        self._fake_nodes: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._sent: dict[str, str] = {}  # uid -> action already sent
        self._timers: dict[str, threading.Timer] = {}  # uid -> pending exit

    def run(self, stop: threading.Event) -> None:
        resource_version = ""
        backoff = 0.5
        while not stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list()
                resource_version = self._watch(resource_version, stop)
                backoff = 0.5
            except WatchExpired:
                self._log("watch expired (410 Gone); listing again")
                resource_version = ""
            except (OSError, ssl.SSLError, ValueError, ClusterError) as err:
                # List again rather than resume: after `down` + `up` the new
                # etcd's resourceVersions restart, and a watch from our old,
                # now future, version would hang silently.
                self._log(f"watch failed, listing again in {backoff:.1f}s: {err}")
                resource_version = ""
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        status, body = self._api.request("GET", "/api/v1/pods", timeout=30)
        if status != 200:
            raise ClusterError(f"listing pods failed: HTTP {status}: {_message(body)}")
        items = body.get("items") or []
        uids = {(p.get("metadata") or {}).get("uid") for p in items}
        with self._lock:
            for uid in [u for u in self._sent if u not in uids]:
                self._forget_locked(uid)
        for pod in items:
            self.handle("ADDED", pod)
        self._log(f"listed {len(items)} pods; {SIMULATOR_READY_LINE}")
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, resource_version: str, stop: threading.Event) -> str:
        query = urllib.parse.urlencode(
            {
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(SIMULATOR_WATCH_SECONDS),
            }
        )
        events = self._api.stream(f"/api/v1/pods?{query}", SIMULATOR_WATCH_SECONDS + 30)
        for event in events:
            if stop.is_set():
                break
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message", ""))
                raise ClusterError(f"watch error: {_message(obj)}")
            resource_version = (obj.get("metadata") or {}).get(
                "resourceVersion"
            ) or resource_version
            if event.get("type") != "BOOKMARK":
                self.handle(str(event.get("type")), obj)
        return resource_version

    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        if event_type == "DELETED":
            with self._lock:
                self._forget_locked(uid)
            return
        action = next_pod_action(pod, self._is_fake_node)
        with self._lock:
            if action is None or self._sent.get(uid) == action:
                return
            if action == EXIT and uid in self._timers:
                return
            if action != EXIT:
                self._sent[uid] = action
        if action == DELETE:
            self._delete(pod)
        elif action == RUN:
            self._run(pod)
        else:
            started = _parse_rfc3339((pod.get("status") or {}).get("startTime")) or time.time()
            self._schedule_exit(pod, started)

    def _forget_locked(self, uid: str) -> None:
        self._sent.pop(uid, None)
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def _key(self, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def _path(self, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"

    def _is_fake_node(self, name: str) -> bool:
        known = self._fake_nodes.get(name)
        if known is not None:
            return known
        status, body = self._api.request("GET", f"/api/v1/nodes/{urllib.parse.quote(name)}")
        if status != 200:
            return False  # not cached: the node may be created later
        labels = (body.get("metadata") or {}).get("labels") or {}
        fake = labels.get(FAKE_NODE_LABEL[0]) == FAKE_NODE_LABEL[1]
        self._fake_nodes[name] = fake
        return fake

    def _failed(self, pod: dict[str, Any], what: str, status: int, body: Any) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self._lock:
            self._sent.pop(uid, None)
        self._log(f"{what} {self._key(pod)} failed: HTTP {status}: {_message(body)}")

    def _delete(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        status, body = self._api.request("DELETE", self._path(pod), options)
        if status in (200, 202, 404, 409):
            self._log(f"deleted {self._key(pod)} (grace period over)")
        else:
            self._failed(pod, "deleting", status, body)

    def _patch_status(self, pod: dict[str, Any], patch: dict[str, Any]) -> tuple[int, Any]:
        return self._api.request(
            "PATCH",
            self._path(pod) + "/status",
            patch,
            "application/strategic-merge-patch+json",
        )

    def _run(self, pod: dict[str, Any]) -> None:
        now = time.time()
        status, body = self._patch_status(pod, running_status_patch(pod, now))
        if status == 200:
            self._log(f"{self._key(pod)} is Running on {pod['spec']['nodeName']}")
            if exit_plan(pod) is not None:
                self._schedule_exit(pod, now)
        elif status in (404, 409):
            self._log(f"{self._key(pod)} is gone or was recreated; not started")
        else:
            self._failed(pod, "starting", status, body)

    def _schedule_exit(self, pod: dict[str, Any], started: float) -> None:
        plan = exit_plan(pod)
        if plan is None:
            return
        seconds, phase = plan
        uid = (pod.get("metadata") or {}).get("uid") or ""
        delay = max(0.0, started + seconds - time.time())
        timer = threading.Timer(delay, self._exit, (pod, phase, started))
        timer.daemon = True
        with self._lock:
            if uid in self._timers:
                return
            self._timers[uid] = timer
        timer.start()

    def _exit(self, pod: dict[str, Any], phase: str, started: float) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self._lock:
            if self._timers.pop(uid, None) is None:
                return  # deleted meanwhile
            self._sent[uid] = EXIT
        patch = terminal_status_patch(pod, phase, started, time.time())
        status, body = self._patch_status(pod, patch)
        if status == 200:
            self._log(f"{self._key(pod)} exited: {phase}")
        elif status not in (404, 409):
            self._failed(pod, f"setting phase {phase} of", status, body)


def cmd_simulate_pods(state_dir: str) -> int:
    """The pod-simulator component's main loop (started by `up`, stopped by `down`)."""
    layout = Layout(Path(state_dir).resolve())

    def log(message: str) -> None:
        stamp = dt.datetime.now().isoformat(timespec="milliseconds")
        print(f"{stamp} pod-simulator: {message}", flush=True)

    if not certs_complete(layout):
        raise ClusterError(f"no certificates in {layout.certs}: run `hack/local-cluster up` first")
    log(f"playing the kubelet for nodes labelled {FAKE_NODE_LABEL[0]}={FAKE_NODE_LABEL[1]}")
    PodSimulator(Api(layout), log).run(threading.Event())
    return 0


# --------------------------------------------------------------------------
# Commands


@dataclass(frozen=True)
class UpOptions:
    """What `up` was asked for (recorded in state.json)."""

    nodes: int
    shape: NodeShape
    extender_url: str
    node_cache_capable: bool
    with_nodelist: bool
    pod_simulator: bool = True
    feature_gates: dict[str, bool] = field(default_factory=dict)
    scheduler: bool = True


def core_health(
    layout: Layout, state: dict[str, Any], bin_dir: Path, feature_gates: dict[str, bool]
) -> str | None:
    """None if etcd, apiserver and controller-manager can be kept, else why not."""
    if not state:
        return "no state file"
    if state.get("bin_dir") != str(bin_dir):
        return f"binaries changed ({state.get('bin_dir')} -> {bin_dir})"
    recorded = state.get("options", {}).get("feature_gates", {})
    if recorded != feature_gates:
        return f"feature gates changed ({recorded} -> {feature_gates})"
    if not certs_complete(layout):
        return "certificates are missing or incomplete"
    for name in CORE_COMPONENTS:
        if running_pid(layout, name) is None:
            return f"{name} is not running"
    api = Api(layout)
    for _ in range(10):
        if api.readyz():
            return None
        time.sleep(0.5)
    return "kube-apiserver /readyz is not ok"


def cmd_up(opts: UpOptions) -> int:
    """Bring the cluster to the requested shape, touching only what differs.

    Tests call `up` from every session fixture, so a healthy cluster must be
    reused as-is (seconds matter) while a half-dead one is rebuilt.
    """
    started_at = time.monotonic()
    layout = Layout.from_env()
    layout.ensure_dirs()
    with locked(layout):
        bin_dir = build_kube()
        kube_version = read_versions()["KUBE_VERSION"]
        state = load_state(layout)
        launcher = Launcher(layout, bin_dir, dict(opts.feature_gates))
        components: dict[str, Any] = dict(state.get("components", {})) if state else {}

        why = core_health(layout, state, bin_dir, opts.feature_gates)
        if why is None:
            info(
                "control plane already running and healthy; keeping etcd, kube-apiserver, kube-controller-manager"
            )
        else:
            running = [n for n in ALL_COMPONENTS if running_pid(layout, n) is not None]
            if running:
                info(f"restarting the cluster cleanly: {why}")
                for name in CORE_COMPONENTS:
                    if name not in running and layout.log(name).exists():
                        info(f"last lines of {layout.log(name)}:\n{tail(layout.log(name), 10)}")
            stop_all(layout)
            components = {}
            try:
                _start_core(layout, launcher, bin_dir)
            except BaseException:
                info("start-up failed; stopping what was started (logs are kept)")
                stop_all(layout)
                raise
            components.update({n: {"pid": read_pid(layout, n)} for n in CORE_COMPONENTS})

        try:
            sched_changes = _reconcile_schedulers(layout, launcher, opts, components)
            simulator_started = _reconcile_simulator(layout, launcher, opts, components)
        except BaseException:
            stop_components(layout, list(launcher.started))
            raise

        api = Api(layout)
        state = {
            "bin_dir": str(bin_dir),
            "kube_version": kube_version,
            "state_dir": str(layout.root),
            "kubeconfig": str(layout.admin_kubeconfig),
            "ports": {n: list(p) for n, p in COMPONENT_PORTS.items()},
            "options": {
                "nodes": opts.nodes,
                "node_cpu": opts.shape.cpu,
                "node_memory": opts.shape.memory,
                "node_pods": opts.shape.pods,
                "extender_url": opts.extender_url,
                "node_cache_capable": opts.node_cache_capable,
                "with_nodelist_scheduler": opts.with_nodelist,
                "pod_simulator": opts.pod_simulator,
                "feature_gates": opts.feature_gates,
                "scheduler": opts.scheduler,
            },
            "components": components,
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
        }
        save_state(layout, state)

        wait_until(
            "the `default` ServiceAccount in namespace default (created by kube-controller-manager)",
            lambda: (
                api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
            ),
            90,
            launcher,
            CORE_COMPONENTS,
            "kube-controller-manager",
        )
        for spec in desired_schedulers(
            opts.extender_url, opts.node_cache_capable, opts.with_nodelist, opts.scheduler
        ):
            wait_until(
                f"{spec.component} /healthz on port {spec.port}",
                _healthz_ok(spec.port),
                60,
                launcher,
                (spec.component,),
                spec.component,
            )
        if sched_changes:
            info("scheduler(s) ready: " + ", ".join(sched_changes))

        install_crds(layout, bin_dir)
        ensure_nodes(api, opts.nodes, opts.shape, kube_version)
        if simulator_started:
            wait_until(
                "the pod simulator to list pods",
                lambda: SIMULATOR_READY_LINE in tail(layout.log(POD_SIMULATOR)),
                30,
                launcher,
                (POD_SIMULATOR,),
                POD_SIMULATOR,
            )
        ready, total = node_counts(api)
        info(
            f"cluster up in {time.monotonic() - started_at:.1f}s: {ready}/{total} nodes Ready, "
            + (
                f"extender {opts.extender_url} (nodeCacheCapable={str(opts.node_cache_capable).lower()})"
                if opts.scheduler
                else "no kube-scheduler (--no-scheduler)"
            )
            + (
                f", plus scheduler {NODELIST_SCHEDULER_NAME} (nodeCacheCapable=false)"
                if opts.with_nodelist
                else ""
            )
        )
        print(f"export KUBECONFIG={shlex.quote(str(layout.admin_kubeconfig))}", flush=True)
    return 0


def _start_core(layout: Layout, launcher: Launcher, bin_dir: Path) -> None:
    """etcd -> kube-apiserver -> kube-controller-manager, each waited on in turn."""
    ensure_certs(layout)
    write_kubeconfigs(layout)
    launcher.start("etcd")
    wait_until(
        f"etcd /health on port {ETCD_CLIENT_PORT}", _etcd_healthy, 60, launcher, ("etcd",), "etcd"
    )
    launcher.start("kube-apiserver")
    api = Api(layout)
    wait_until(
        f"kube-apiserver /readyz on port {APISERVER_PORT}",
        api.readyz,
        180,
        launcher,
        ("etcd", "kube-apiserver"),
        "kube-apiserver",
    )
    info("kube-apiserver is ready")
    launcher.start("kube-controller-manager")
    wait_until(
        f"kube-controller-manager /healthz on port {CONTROLLER_MANAGER_PORT}",
        _healthz_ok(CONTROLLER_MANAGER_PORT),
        60,
        launcher,
        CORE_COMPONENTS,
        "kube-controller-manager",
    )


def _reconcile_schedulers(
    layout: Layout, launcher: Launcher, opts: UpOptions, components: dict[str, Any]
) -> list[str]:
    """Start, restart or stop schedulers so exactly the requested ones run.

    A running scheduler is kept only if its rendered config is byte-for-byte
    what this `up` would render (extender URL, nodeCacheCapable, profile).
    """
    changes: list[str] = []
    specs = desired_schedulers(
        opts.extender_url, opts.node_cache_capable, opts.with_nodelist, opts.scheduler
    )
    wanted = {spec.component: spec for spec in specs}
    write_kubeconfigs(layout)
    for name in SCHEDULER_COMPONENTS:
        spec = wanted.get(name)
        pid = running_pid(layout, name)
        rendered = render_scheduler_config(layout, spec, opts.extender_url) if spec else None
        recorded = components.get(name, {}).get("config_sha256")
        if spec is None:
            if pid is not None:
                why = (
                    "--no-scheduler was given"
                    if not opts.scheduler
                    else ("--with-nodelist-scheduler was not given")
                )
                info(f"stopping {name}: {why}")
                stop_components(layout, (name,))
                changes.append(f"{name} stopped")
            components.pop(name, None)
            continue
        assert rendered is not None
        if pid is not None and recorded == digest(rendered):
            continue
        if pid is not None:
            info(f"restarting {name}: its configuration changed")
            stop_components(layout, (name,))
        write_if_changed(layout.scheduler_config(name), rendered)
        new_pid = launcher.start(name)
        components[name] = {
            "pid": new_pid,
            "scheduler_name": spec.scheduler_name,
            "node_cache_capable": spec.node_cache_capable,
            "extender_url": opts.extender_url,
            "config": str(layout.scheduler_config(name)),
            "config_sha256": digest(rendered),
        }
        changes.append(f"{name} ({spec.scheduler_name})")
    return changes


def _reconcile_simulator(
    layout: Layout, launcher: Launcher, opts: UpOptions, components: dict[str, Any]
) -> bool:
    """Run the pod simulator exactly when wanted; True if it was (re)started now.

    A running simulator is kept only if it runs the current version of this
    script, so an edit takes effect on the next `up`.
    """
    pid = running_pid(layout, POD_SIMULATOR)
    if not opts.pod_simulator:
        if pid is not None:
            info(f"stopping {POD_SIMULATOR}: --no-pod-simulator was given")
            stop_components(layout, (POD_SIMULATOR,))
        components.pop(POD_SIMULATOR, None)
        return False
    script = digest(Path(__file__).resolve().read_text())
    if pid is not None and components.get(POD_SIMULATOR, {}).get("script_sha256") == script:
        return False
    if pid is not None:
        info(f"restarting {POD_SIMULATOR}: {Path(__file__).name} changed")
        stop_components(layout, (POD_SIMULATOR,))
    components[POD_SIMULATOR] = {
        "pid": launcher.start(POD_SIMULATOR),
        "script_sha256": script,
    }
    return True


def cmd_down() -> int:
    """Stop what `up` started and drop the etcd data, so the next `up` is empty.

    Certificates stay, so kubeconfigs handed out before remain valid.
    """
    layout = Layout.from_env()
    if not layout.root.exists():
        info(f"nothing to stop ({layout.root} does not exist)")
        return 0
    with locked(layout):
        running = [n for n in ALL_COMPONENTS if running_pid(layout, n) is not None]
        if not running:
            info("no component is running")
        stop_all(layout)
        if layout.etcd_data.exists():
            shutil.rmtree(layout.etcd_data)
            info(f"removed etcd data {layout.etcd_data} (certificates kept)")
        state = load_state(layout)
        if state:
            state["components"] = {}
            state["updated"] = dt.datetime.now().isoformat(timespec="seconds")
            save_state(layout, state)
    return 0


def cmd_status() -> int:
    """Print component state; the exit code lets scripts branch (0 up, 1 degraded, 3 down)."""
    layout = Layout.from_env()
    state = load_state(layout)
    expected = list(CORE_COMPONENTS) + [
        n
        for n in (*SCHEDULER_COMPONENTS, POD_SIMULATOR)
        if n in state.get("components", {}) or layout.pid_file(n).exists()
    ]
    if "kube-scheduler" not in expected and state.get("options", {}).get("scheduler", True):
        expected.insert(3, "kube-scheduler")
    running = 0
    for name in expected:
        pid = read_pid(layout, name)
        alive = pid is not None and is_ours(layout, name, pid)
        running += alive
        pid_text = str(pid) if pid is not None else "-"
        print(f"{name:<26} {'running' if alive else 'stopped':<8} pid {pid_text}")
    ready_text, nodes_text, api_ok = "unreachable", "unknown", False
    if certs_complete(layout):
        api = Api(layout)
        api_ok = api.readyz()
        if api_ok:
            ready_text = "ok"
            try:
                ready, total = node_counts(api)
                nodes_text = f"{ready} Ready / {total} total"
            except (ClusterError, OSError) as err:
                nodes_text = f"error: {err}"
    print(f"{'apiserver readyz':<26} {ready_text}")
    print(f"{'nodes':<26} {nodes_text}")
    if running:
        print(f"{'kubeconfig':<26} {layout.admin_kubeconfig}")
    if running == len(expected) and api_ok:
        return 0
    if running == 0:
        return 3
    return 1


def cmd_add_node(name: str, shape: NodeShape) -> int:
    """Add one fake node, e.g. with a zone label for topology tests."""
    layout = Layout.from_env()
    if not certs_complete(layout) or running_pid(layout, "kube-apiserver") is None:
        raise ClusterError("the cluster is not running; start it with `hack/local-cluster up`")
    api = Api(layout)
    if not api.readyz():
        raise ClusterError("kube-apiserver is not ready", layout.log("kube-apiserver"))
    create_fake_node(api, name, shape, read_versions()["KUBE_VERSION"])
    extra = "".join(f", {k}={v}" for k, v in shape.labels.items())
    info(
        f"added fake node {name} (cpu={shape.cpu}, memory={shape.memory}, pods={shape.pods}{extra})"
    )
    return 0


# --------------------------------------------------------------------------
# CLI


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _quantity(value: str) -> str:
    if not _QUANTITY_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"not a Kubernetes quantity: {value!r} (e.g. 4, 500m, 8Gi)"
        )
    return value


def _http_url(value: str) -> str:
    """kube-scheduler accepts any string as urlPrefix and only fails per pod."""
    parsed = urllib.parse.urlsplit(value)
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or any(c.isspace() for c in value)
    ):
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL such as {DEFAULT_EXTENDER_URL}, got {value!r}"
        )
    return value.rstrip("/")


def _feature_gates(value: str) -> dict[str, bool]:
    try:
        return parse_feature_gates(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def _non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not _LABEL_KEY_RE.match(key) or len(val) > 63 or not _LABEL_VALUE_RE.match(val):
        raise argparse.ArgumentTypeError(f"expected a label key=value, got {value!r}")
    return key, val


def _node_name(value: str) -> str:
    if not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", value):
        raise argparse.ArgumentTypeError(
            f"not a valid node name: {value!r} (lowercase DNS subdomain)"
        )
    return value


DESCRIPTION = """\
Run a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; built by hack/build-kube at the
version pinned in hack/kube/versions.env) on 127.0.0.1 for tests and demos,
with fake nodes (Node objects, no kubelet) for the scheduler to place pods on.
kube-scheduler calls the gang-extender at --extender-url for every pod.
"""

EPILOG = f"""\
commands:
  up        start (or reconcile) the cluster; last stdout line is
            `export KUBECONFIG=<path>`, progress goes to stderr
  down      stop exactly the processes `up` started and delete the etcd data
            (certificates are kept); the next `up` starts an empty cluster
  status    components, pids, apiserver readyz, Ready nodes;
            exit 0 all running, 1 degraded, 3 down
  add-node  add one more fake node to the running cluster (fails if a node
            of that name exists)

`up` is idempotent: a healthy control plane is kept as it is (unless
--feature-gates differ from what runs); scheduler(s)
are restarted only if --extender-url, --node-cache-capable or
--with-nodelist-scheduler differ from what runs; missing node-1..node-N are
created (extra nodes are never deleted); the CRDs in deploy/crds/ are
re-applied. If etcd, kube-apiserver or kube-controller-manager died, all
components are stopped and started again (the etcd data is kept; use `down`
for an empty cluster); a scheduler that died is simply started again.
`up` returns once the `default` ServiceAccount exists, so pods can be created
in namespace default at once; in a namespace you create yourself, wait for
its `default` ServiceAccount (kube-controller-manager adds it within ~1s).

fake nodes: labels kubernetes.io/hostname=<name>, kubernetes.io/os=linux,
type=fake-node; Ready=True, no taints. They stay Ready because the
controller-manager runs with --controllers=*,-{",-".join(DISABLED_CONTROLLERS)}.

pod simulator (on unless --no-pod-simulator; log logs/{POD_SIMULATOR}.log):
plays the kubelet of the fake nodes. A pod bound to one goes Running (Ready,
containers running, made-up 10.x IPs); a pod deleted with a grace period is
deleted for good (grace 0), as a kubelet does once its containers stopped.
Annotations {EXIT_AFTER_ANNOTATION}: "N" and optionally
{EXIT_PHASE_ANNOTATION}: Succeeded|Failed (default Succeeded) make the pod
reach that phase N seconds after it started running (exit code 0 or 1).
Without the simulator bound pods stay Pending and deleted ones Terminating.

ports (127.0.0.1 only): etcd {ETCD_CLIENT_PORT} (peer {ETCD_PEER_PORT}), kube-apiserver {APISERVER_PORT},
kube-controller-manager {CONTROLLER_MANAGER_PORT}, kube-scheduler {SCHEDULER_PORT},
kube-scheduler-nodelist {NODELIST_SCHEDULER_PORT}; the pod simulator listens on none.

state dir: <repo>/.local-cluster (or $LOCAL_CLUSTER_DIR): certs/, etcd/,
kubeconfig (admin, system:masters), *.kubeconfig, *-config.yaml (rendered
scheduler configs), logs/<component>.log, pids/<component>.pid, state.json.

examples:
  eval "$(hack/local-cluster up --nodes 3 --with-nodelist-scheduler)"
  hack/local-cluster up --feature-gates GenericWorkload=true   # native PodGroups
  hack/local-cluster add-node node-4 --label topology.kubernetes.io/zone=b
  hack/local-cluster status; hack/local-cluster down
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hack/local-cluster",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{up,down,status,add-node}")
    sub.required = True

    up = sub.add_parser(
        "up",
        help="start the cluster (idempotent)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument(
        "--nodes", type=_non_negative_int, default=3, help="fake nodes node-1..node-N (default 3)"
    )
    up.add_argument(
        "--node-cpu", type=_quantity, default="4", help="cpu capacity per node (default 4)"
    )
    up.add_argument(
        "--node-memory", type=_quantity, default="8Gi", help="memory per node (default 8Gi)"
    )
    up.add_argument(
        "--node-pods", type=_positive_int, default=110, help="max pods per node (default 110)"
    )
    up.add_argument(
        "--extender-url",
        type=_http_url,
        default=DEFAULT_EXTENDER_URL,
        help=f"extender urlPrefix in the scheduler config (default {DEFAULT_EXTENDER_URL})",
    )
    up.add_argument(
        "--node-cache-capable",
        type=_bool,
        default=True,
        metavar="true|false",
        help="extender nodeCacheCapable of the default-scheduler profile (default true)",
    )
    up.add_argument(
        "--with-nodelist-scheduler",
        action="store_true",
        help=f"also run a second kube-scheduler, profile {NODELIST_SCHEDULER_NAME}, "
        "nodeCacheCapable=false, same extender (log logs/kube-scheduler-nodelist.log)",
    )
    up.add_argument(
        "--feature-gates",
        type=_feature_gates,
        default={},
        metavar="Name=true|false,...",
        help="Kubernetes feature gates for kube-apiserver, kube-controller-manager and the "
        "schedulers; APIs a gate needs are served too (GenericWorkload=true serves "
        "scheduling.k8s.io/v1beta1). A change restarts the control plane (etcd data is kept)",
    )
    up.add_argument(
        "--no-scheduler",
        dest="scheduler",
        action="store_false",
        help="run no kube-scheduler (the caller starts its own, e.g. bench/e2e.py)",
    )
    up.add_argument(
        "--no-pod-simulator",
        dest="pod_simulator",
        action="store_false",
        help="do not run the pod simulator: bound pods stay Pending, deleted ones Terminating",
    )

    sub.add_parser("down", help="stop the cluster and delete its etcd data")
    sub.add_parser("status", help="show components and health (exit 0 up, 1 degraded, 3 down)")

    add = sub.add_parser("add-node", help="add a fake node to the running cluster")
    add.add_argument("name", type=_node_name, help="node name, e.g. node-4")
    add.add_argument("--cpu", type=_quantity, default="4", help="cpu capacity (default 4)")
    add.add_argument(
        "--memory", type=_quantity, default="8Gi", help="memory capacity (default 8Gi)"
    )
    add.add_argument("--pods", type=_positive_int, default=110, help="max pods (default 110)")
    add.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra label, repeatable (e.g. topology.kubernetes.io/zone=a)",
    )

    # Hidden (no help): the pod-simulator component that `up` starts in the background.
    simulate = sub.add_parser(SIMULATE_COMMAND)
    simulate.add_argument("--state-dir", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit code (errors -> 1 with the failing component's log)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            shape = NodeShape(cpu=args.node_cpu, memory=args.node_memory, pods=args.node_pods)
            return cmd_up(
                UpOptions(
                    args.nodes,
                    shape,
                    args.extender_url,
                    args.node_cache_capable,
                    args.with_nodelist_scheduler,
                    args.pod_simulator,
                    args.feature_gates,
                    args.scheduler,
                )
            )
        if args.command == "down":
            return cmd_down()
        if args.command == "status":
            return cmd_status()
        if args.command == SIMULATE_COMMAND:
            return cmd_simulate_pods(args.state_dir)
        if args.command == "add-node":
            shape = NodeShape(
                cpu=args.cpu, memory=args.memory, pods=args.pods, labels=dict(args.label)
            )
            return cmd_add_node(args.name, shape)
    except ClusterError as err:
        info(f"error: {err}")
        if err.log_file is not None:
            text = tail(err.log_file)
            if text:
                info(f"last {LOG_TAIL_LINES} lines of {err.log_file}:\n{text}")
        return 1
    except KeyboardInterrupt:
        info("interrupted")
        return 130
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
