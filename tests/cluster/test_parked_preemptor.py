"""A pod kube-scheduler nominated and left parked on a node with room for it is placed.

kube-scheduler retries a parked pod only on an event its plugins' queueing
hints accept (or after five minutes). Two events that free room are not
accepted in v1.37.2: the delete of a victim its informer last saw unbound
(a delete missed while a watch was broken: the soak's seed 4, issue 49;
kubernetes issue 122444), and a pod of higher priority nominated on the node
being bound elsewhere by another binder (kubernetes issue 134859). The first
needs a watch broken at the right instant; the second is made here on
purpose, and leaves the pod behind it the same way: parked with its
nomination on a node that has room for it. The extender removes that
nomination after PARKED_SECONDS (app/runtime/preemption/parked.py), which
kube-scheduler counts as room given back on the node: it retries the pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.runtime.preemption.parked import PARKED_SECONDS
from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, TOP, Kube
from tests.cluster.session import Extender
from tests.cluster.test_preemption import session_nodes

pytestmark = pytest.mark.usefixtures("priorities")

HOSTNAME = "kubernetes.io/hostname"


def pinned(kube: Kube, name: str, node: str, cpu: str, priority: str) -> dict[str, Any]:
    body = kube.pod_body(name, cpu=cpu, memory="1Mi", priority_class=priority)
    body["spec"]["nodeSelector"] = {HOSTNAME: node}
    return body


def reported_unschedulable(kube: Kube, namespace: str, name: str) -> bool:
    pod = kube.core.read_namespaced_pod(name, namespace)
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or ()
    )


def nominate(kube: Kube, namespace: str, name: str, node: str) -> None:
    """Write status.nominatedNodeName as kube-scheduler does after preempting for the pod."""
    kube.core.patch_namespaced_pod_status(name, namespace, {"status": {"nominatedNodeName": node}})


def nomination(kube: Kube, namespace: str, name: str) -> str:
    return kube.core.read_namespaced_pod(name, namespace).status.nominated_node_name or ""


def test_a_pod_left_parked_on_a_node_with_room_for_it_is_placed(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    node, elsewhere = session_nodes(kube)[:2]
    # A pod of the top priority nominated on the node that no node can take:
    # kube-scheduler counts its 3 CPUs there for every pod of lower priority.
    kube.core.create_namespaced_pod(namespace, pinned(kube, "ahead", "no-such-node", "3", TOP))
    wait_for(lambda: reported_unschedulable(kube, namespace, "ahead"), 30, "ahead parked")
    nominate(kube, namespace, "ahead", node)
    # The pod behind it: 2 CPUs on that node of 4, parked for want of room, nominated there.
    kube.core.create_namespaced_pod(namespace, pinned(kube, "behind", node, "2", HIGH))
    wait_for(lambda: reported_unschedulable(kube, namespace, "behind"), 30, "behind parked")
    nominate(kube, namespace, "behind", node)
    assert nomination(kube, namespace, "ahead") == node

    # Another binder places the pod ahead elsewhere: the node's room is free, and
    # kube-scheduler moves no parked pod for it.
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "ahead"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": elsewhere},
    }
    kube.core.create_namespaced_pod_binding("ahead", namespace, binding, _preload_content=False)

    def placed() -> bool:
        return bool(kube.core.read_namespaced_pod("behind", namespace).spec.node_name == node)

    # Well inside kube-scheduler's five-minute flush of parked pods.
    wait_for(placed, PARKED_SECONDS + 30, "the parked pod placed on the node with room")
    assert f'"pod": "{namespace}/behind"' in extender.log()
    assert "kube-scheduler left this pod parked" in extender.log()
