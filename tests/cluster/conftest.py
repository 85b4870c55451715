"""Fixtures for tests against the real control plane.

One local cluster (hack/local-cluster: etcd, kube-apiserver,
kube-controller-manager, two kube-schedulers) and one extender process per
test session. The cluster is recreated at the start of the session so that
node capacity is exactly what the tests assume; each test gets its own
namespace, emptied afterwards.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.kube import Kube, stop_process, wait_for
from tests.packaging.helm import kube_bin

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER = REPO / "hack" / "local-cluster"


def _port_busy(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _claim_slot() -> tuple[int, IO[str]]:
    """A private cluster per concurrent test session (ports and state dir of its own).

    Ports are the machine's, so the locks are too (in the temp dir, shared
    by every clone); the lock is held for the life of the pytest process. A
    slot whose ports another process holds (a cluster some other clone left
    running) is skipped.
    """
    locks = Path(tempfile.gettempdir()) / "gang-extender-test-slots"
    locks.mkdir(exist_ok=True)
    for slot in range(8):
        handle = (locks / f"slot-{slot}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        cluster_dir = REPO / ".local-cluster-tests" / f"slot-{slot}"
        env = {
            **os.environ,
            "LOCAL_CLUSTER_DIR": str(cluster_dir),
            "LOCAL_CLUSTER_PORT_OFFSET": str(1000 * (slot + 1)),
        }
        # Our own clone's leftover cluster in this slot is ours to stop.
        subprocess.run([str(LOCAL_CLUSTER), "down"], env=env, capture_output=True, check=False)
        if _port_busy(16443 + 1000 * (slot + 1)) or _port_busy(22379 + 1000 * (slot + 1)):
            handle.close()
            continue
        return slot, handle
    raise RuntimeError("no free test slot: 8 local clusters already run on this machine")


SLOT, _SLOT_LOCK = _claim_slot()
PORT_OFFSET = 1000 * (SLOT + 1)
CLUSTER_DIR = REPO / ".local-cluster-tests" / f"slot-{SLOT}"
os.environ["LOCAL_CLUSTER_DIR"] = str(CLUSTER_DIR)
os.environ["LOCAL_CLUSTER_PORT_OFFSET"] = str(PORT_OFFSET)
EXTENDER_PORT = 18888 + PORT_OFFSET
EXTENDER_URL = f"http://127.0.0.1:{EXTENDER_PORT}"
NODES = 3
NODE_CPU = "4"
NODE_MEMORY = "8Gi"
# Kubernetes' native PodGroups (scheduling.k8s.io/v1beta1) are served only with this gate.
FEATURE_GATES = "GenericWorkload=true"
# CRDs the tests need but the chart does not ship (Volcano's PodGroup).
TEST_CRDS = REPO / "tests" / "cluster" / "crds"
# Short waits keep the suite fast; the tests reason in these units.
PERMIT_WAIT_SECONDS = 6
DENIED_SECONDS = 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def local_cluster(*args: str) -> str:
    result = subprocess.run(
        [str(LOCAL_CLUSTER), *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"hack/local-cluster {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )
    return result.stdout


# The session cluster's `up` arguments: `up` again with them restarts whatever
# a fault test killed (tests/cluster/test_faults.py).
UP_ARGS = (
    "--nodes",
    str(NODES),
    "--node-cpu",
    NODE_CPU,
    "--node-memory",
    NODE_MEMORY,
    "--extender-url",
    f"{EXTENDER_URL}/scheduler",
    "--with-nodelist-scheduler",
    "--feature-gates",
    FEATURE_GATES,
)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    local_cluster("down")
    out = local_cluster("up", *UP_ARGS)
    match = re.search(r"^export KUBECONFIG=(\S+)$", out, re.MULTILINE)
    assert match, f"hack/local-cluster up printed no KUBECONFIG line:\n{out}"
    _apply_test_crds(match.group(1))
    yield match.group(1)
    # Free the slot's ports for the next session (logs stay in CLUSTER_DIR).
    local_cluster("down")


def _apply_test_crds(kubeconfig: str) -> None:
    """Before the extender starts: it discovers its group sources once, at start-up."""
    kubectl = [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig]
    for args in (
        ["apply", "--server-side", "-f", str(TEST_CRDS)],
        ["wait", "--for=condition=Established", "--timeout=60s", "-f", str(TEST_CRDS)],
    ):
        result = subprocess.run([*kubectl, *args], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Kube:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    return Kube(k8s.ApiClient(configuration))


class Extender:
    """The real extender process under test (python -m app serve), restartable with flags."""

    BASE_ARGS = (
        "--permit-waiting-time-seconds",
        str(PERMIT_WAIT_SECONDS),
        "--denied-pg-expiration-seconds",
        str(DENIED_SECONDS),
        "--log-level",
        "debug",
    )

    def __init__(self, kubeconfig: str, log_path: Path) -> None:
        self.url = EXTENDER_URL
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_args: tuple[str, ...] = ()

    def start(self, *extra_args: str) -> None:
        self.extra_args = extra_args
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app",
                    "serve",
                    "--kubeconfig",
                    self.kubeconfig,
                    "--port",
                    str(EXTENDER_PORT),
                    *self.BASE_ARGS,
                    *extra_args,
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, 30, "the extender to become ready")

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash, an OOM kill)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def restart(self, *extra_args: str) -> None:
        """Run with other flags (e.g. --gang-victim-policy whole-gang); counters restart at 0."""
        self.stop()
        self.start(*extra_args)

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(
                f"extender exited ({self.process.returncode}):\n{self.log()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, parsed by the Prometheus text parser."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def extender(kubeconfig: str) -> Iterator[Extender]:
    log_path = CLUSTER_DIR / "logs" / "extender-test.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    handle = Extender(kubeconfig, log_path)
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def namespace(kube: Kube, extender: Extender, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    kube.core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: any(
            sa.metadata.name == "default"
            for sa in kube.core.list_namespaced_service_account(name).items
        ),
        30,
        f"the default ServiceAccount in {name}",
    )
    yield name
    for deployment in kube.apps.list_namespaced_deployment(name).items:
        kube.apps.delete_namespaced_deployment(deployment.metadata.name, name)
    deadline = time.monotonic() + 20
    while kube.pods(name) and time.monotonic() < deadline:
        kube.delete_pods_now(name)
        time.sleep(0.5)
    kube.core.delete_namespace(name)
