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

import time
from typing import Any

import pytest

from app.runtime.preemption.parked import PARKED_SECONDS
from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, LOW, TOP, Kube
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


def park_behind_a_nomination(kube: Kube, namespace: str, node: str, *, nominated: bool) -> None:
    """Pod `behind` (2 CPUs of the node's 4, HIGH) parked for want of room on `node`,
    whose room a pod of the top priority nominated there holds; with `nominated`,
    `behind` is nominated there too, as after a preemption for it."""
    # No node can take `ahead`: kube-scheduler counts its 3 CPUs on the node it is
    # nominated for, for every pod of lower priority.
    kube.core.create_namespaced_pod(namespace, pinned(kube, "ahead", "no-such-node", "3", TOP))
    wait_for(lambda: reported_unschedulable(kube, namespace, "ahead"), 30, "ahead parked")
    nominate(kube, namespace, "ahead", node)
    kube.core.create_namespaced_pod(namespace, pinned(kube, "behind", node, "2", HIGH))
    wait_for(lambda: reported_unschedulable(kube, namespace, "behind"), 30, "behind parked")
    if nominated:
        nominate(kube, namespace, "behind", node)
    assert nomination(kube, namespace, "ahead") == node


def bind_elsewhere(kube: Kube, namespace: str, name: str, node: str) -> None:
    """Another binder places the pod: kube-scheduler moves no parked pod for the room
    its nomination held (kubernetes issue 134859)."""
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    kube.core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)


def placed_on(kube: Kube, namespace: str, name: str, node: str) -> bool:
    return bool(kube.core.read_namespaced_pod(name, namespace).spec.node_name == node)


def test_a_pod_left_parked_on_a_node_with_room_for_it_is_placed(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    node, elsewhere = session_nodes(kube)[:2]
    park_behind_a_nomination(kube, namespace, node, nominated=True)
    bind_elsewhere(kube, namespace, "ahead", elsewhere)
    # Well inside kube-scheduler's five-minute flush of parked pods.
    wait_for(
        lambda: placed_on(kube, namespace, "behind", node),
        PARKED_SECONDS + 30,
        "the parked pod placed on the node with room",
    )
    assert f'"pod": "{namespace}/behind"' in extender.log()
    assert "kube-scheduler left this pod parked" in extender.log()


def test_a_nomination_set_and_removed_requeues_a_parked_pod(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """kube-scheduler's half of app/runtime/preemption/kept_waiters.py: a parked pod with
    no nomination is given one and has it removed (the two writes the extender makes for
    a preemptor refused for a plan's room, once the plan ends), and is tried again."""
    node, elsewhere = session_nodes(kube)[:2]
    park_behind_a_nomination(kube, namespace, node, nominated=False)
    bind_elsewhere(kube, namespace, "ahead", elsewhere)
    time.sleep(3)
    assert not placed_on(kube, namespace, "behind", node), "kube-scheduler retried it itself"
    nominate(kube, namespace, "behind", node)
    kube.core.patch_namespaced_pod_status(
        "behind", namespace, {"status": {"nominatedNodeName": None}}
    )
    # Sooner than the extender's own check of parked nominated pods would act.
    wait_for(
        lambda: placed_on(kube, namespace, "behind", node),
        PARKED_SECONDS - 5,
        "the requeued pod placed",
    )


def test_a_preemptor_whose_preempt_call_found_the_extender_down_is_placed_once_it_is_back(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """The soak's extender kills (issue 49): kube-scheduler's preempt call found the extender
    down, and it parked the pod as if nothing could be evicted. No event it retries that
    pod on comes in a quiet cluster (five minutes); the extender, back, requeues it."""
    node = session_nodes(kube)[0]
    kube.core.create_namespaced_pod(namespace, pinned(kube, "victim", node, "3", LOW))
    wait_for(lambda: placed_on(kube, namespace, "victim", node), 30, "the victim placed")
    extender.kill()
    try:
        kube.core.create_namespaced_pod(namespace, pinned(kube, "vip", node, "2", HIGH))

        def unanswered() -> str:
            pod = kube.core.read_namespaced_pod("vip", namespace)
            return next(
                (
                    c.message
                    for c in pod.status.conditions or ()
                    if c.type == "PodScheduled" and '/preempt": ' in (c.message or "")
                ),
                "",
            )

        message = wait_for(unanswered, 30, "kube-scheduler's preempt call refused")
        assert "preemption: Post" in message, message
    finally:
        extender.start(*extender.extra_args)
    wait_for(
        lambda: placed_on(kube, namespace, "vip", node),
        30,
        "the preemptor placed once the extender was back",
    )
    assert "its preempt call got no answer" in extender.log()
