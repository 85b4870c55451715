"""The test session's cluster: its slot, ports and sizes, and the extender process under test.

Imported by conftest.py (the fixtures) and by the tests that restart the
cluster or the extender with other flags. Claiming the slot happens once, at
import: the lock is held for the life of the pytest process, and
hack/local-cluster reads the slot's state dir and ports from the environment.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from kubernetes import client as k8s

from hack.clusterkit import (
    LOCAL_CLUSTER,
    REPO,
    Samples,
    api_client,
    sample,
    scrape,
    start_extender,
    stop_process,
    wait_webhook_marks,
    webhook_args,
)
from tests.packaging.helm import kube_bin


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
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true,CompositePodGroup=true"
# CRDs the tests need but the chart does not ship (Volcano's PodGroup).
TEST_CRDS = REPO / "tests" / "cluster" / "crds"
# Short waits keep the suite fast; the tests reason in these units.
PERMIT_WAIT_SECONDS = 6
DENIED_SECONDS = 3

# The extender mode of the session's cluster (README "Deployment modes"):
# gang-only by default, as hack/local-cluster starts it; `make test` runs the
# cluster suite a second time with GANG_EXTENDER_TEST_MODE=every-verb, where
# tests/cluster/test_gang_only.py is skipped.
MODE = os.environ.get("GANG_EXTENDER_TEST_MODE", "gang-only")
if MODE not in ("gang-only", "every-verb"):
    raise RuntimeError(f"GANG_EXTENDER_TEST_MODE={MODE!r}: use gang-only or every-verb")
GANG_ONLY = MODE == "gang-only"

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
    "--extender-mode",
    MODE,
)


def apply_test_crds(kubeconfig: str) -> None:
    """Before the extender starts: it discovers its group sources once, at start-up."""
    kubectl = [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig]
    for args in (
        ["apply", "--server-side", "-f", str(TEST_CRDS)],
        ["wait", "--for=condition=Established", "--timeout=60s", "-f", str(TEST_CRDS)],
    ):
        result = subprocess.run([*kubectl, *args], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"


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

    def start(self, *extra_args: str, webhook: bool = GANG_ONLY) -> None:
        """Start it; with `webhook` (the cluster's gang-only mode) once it marks gang members."""
        self.extra_args = extra_args
        self.process = start_extender(
            self.kubeconfig,
            EXTENDER_PORT,
            self.log_path,
            (*self.BASE_ARGS, *(webhook_args(EXTENDER_PORT) if webhook else ()), *extra_args),
            # Ready means every watch listed: on a machine as busy as the soak's (burners,
            # other suites) that took over 30 s; a wait, not a bound the product promises.
            timeout=90,
        )
        if webhook:
            wait_webhook_marks(k8s.CoreV1Api(api_client(self.kubeconfig)))

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

    def metrics(self) -> Samples:
        """Every sample of /metrics, parsed by the Prometheus text parser."""
        return scrape(self.url)

    def sample(self, name: str, **labels: str) -> float:
        return sample(self.metrics(), name, **labels)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
