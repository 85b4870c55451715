"""Fixtures for tests against the real control plane.

One local cluster (hack/local-cluster: etcd, kube-apiserver,
kube-controller-manager, two kube-schedulers) and one extender process per
test session. The cluster is recreated at the start of the session so that
node capacity is exactly what the tests assume; each test gets its own
namespace, emptied afterwards. The slot, sizes and the extender's handle
live in tests/cluster/session.py.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest

from hack.clusterkit import (
    api_client,
    kubeconfig_of,
    local_cluster,
    wait_for_default_service_account,
)
from tests.cluster.kube import HIGH, LOW, TOP, Kube
from tests.cluster.session import CLUSTER_DIR, UP_ARGS, Extender, apply_test_crds


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    local_cluster("down")
    path = kubeconfig_of(local_cluster("up", *UP_ARGS))
    apply_test_crds(path)
    yield path
    # Free the slot's ports for the next session (logs stay in CLUSTER_DIR).
    local_cluster("down")


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Kube:
    return Kube(api_client(kubeconfig))


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
def priorities(kube: Kube) -> None:
    """The PriorityClasses LOW (100), HIGH (1000) and TOP (5000)."""
    kube.ensure_priority_class(LOW, 100)
    kube.ensure_priority_class(HIGH, 1000)
    kube.ensure_priority_class(TOP, 5000)


@pytest.fixture
def namespace(kube: Kube, extender: Extender, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    kube.core.create_namespace({"metadata": {"name": name}})
    wait_for_default_service_account(kube.core, name, 30)
    with kube.reporting(name):
        yield name
    for deployment in kube.apps.list_namespaced_deployment(name).items:
        kube.apps.delete_namespaced_deployment(deployment.metadata.name, name)
    deadline = time.monotonic() + 20
    while kube.pods(name) and time.monotonic() < deadline:
        kube.delete_pods_now(name)
        time.sleep(0.5)
    kube.core.delete_namespace(name)
