"""Where everything is: the repository's inputs, the state directory, the ports.

`Config` is built once by the CLI (from LOCAL_CLUSTER_DIR,
LOCAL_CLUSTER_PORT_OFFSET and LOCAL_CLUSTER_SCHEDULER_VERBOSITY) and passed to
whatever needs a path or a port, so importing this package reads no
environment and tests can build any cluster's config by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
HACK_DIR = PACKAGE_DIR.parent
REPO_ROOT = HACK_DIR.parent
# The executable wrapper; the pod simulator runs as `<python> -B <WRAPPER> simulate-pods`.
WRAPPER = HACK_DIR / "local-cluster"
BUILD_KUBE = HACK_DIR / "build-kube"
VERSIONS_ENV = HACK_DIR / "kube" / "versions.env"
CRD_DIR = REPO_ROOT / "deploy" / "crds"
SCHEDULER_CONFIG_TEMPLATE = REPO_ROOT / "deploy" / "scheduler-config.yaml"
# The extender modes (docs/deployment-modes.md) and their scheduler configs.
MODE_GANG_ONLY = "gang-only"
MODE_EVERY_VERB = "every-verb"
SCHEDULER_CONFIG_TEMPLATES = {
    MODE_GANG_ONLY: SCHEDULER_CONFIG_TEMPLATE,
    MODE_EVERY_VERB: REPO_ROOT / "deploy" / "scheduler-config-every-verb.yaml",
}
# gang-only: the webhook that marks gang members, and the policy refusing unmarked ones.
WEBHOOK_TEMPLATE = REPO_ROOT / "deploy" / "webhook.yaml"

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one cluster.

    The bases are deliberately far from the defaults (2379/2380, 6443, 10257,
    10259) so the local cluster can run next to a real one on the same
    machine; `offset` (LOCAL_CLUSTER_PORT_OFFSET, with its own
    LOCAL_CLUSTER_DIR) runs several clusters side by side: the test suite
    gives each concurrent session a slot.
    """

    offset: int = 0

    @property
    def etcd_client(self) -> int:
        return 22379 + self.offset

    @property
    def etcd_peer(self) -> int:
        return 22380 + self.offset

    @property
    def apiserver(self) -> int:
        return 16443 + self.offset

    @property
    def controller_manager(self) -> int:
        return 20257 + self.offset

    @property
    def scheduler(self) -> int:
        return 20259 + self.offset

    @property
    def nodelist_scheduler(self) -> int:
        return 20260 + self.offset

    @property
    def apiserver_url(self) -> str:
        return f"https://{HOST}:{self.apiserver}"


@dataclass(frozen=True)
class Layout:
    """Every path the cluster uses, all under one state directory.

    Keeping everything in one place is what makes `down` exact and lets tests
    point LOCAL_CLUSTER_DIR at a temporary directory.
    """

    root: Path

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


@dataclass(frozen=True)
class Config:
    """One cluster's paths and ports, plus the one knob its components read."""

    layout: Layout
    ports: Ports
    # kube-scheduler --v: 2 logs why each pod did not fit; raise it (e.g. 5) to see queue moves.
    scheduler_verbosity: str = "2"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Config:
        raw = environ.get("LOCAL_CLUSTER_DIR")
        root = Path(raw).expanduser() if raw else REPO_ROOT / ".local-cluster"
        return cls(
            Layout(root.resolve()),
            Ports(int(environ.get("LOCAL_CLUSTER_PORT_OFFSET", "0"))),
            environ.get("LOCAL_CLUSTER_SCHEDULER_VERBOSITY", "2"),
        )
