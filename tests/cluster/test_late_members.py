"""An admitted gang's member late to the gate keeps its room from a plain pod (gang-only mode).

In gang-only mode a plain pod never reaches our filter: kube-scheduler alone
decides where it goes, and it keeps room only for the pods it has assumed and the
pods nominated for a node. A gang admitted at one member's filter call promises
its other members their nodes; until kube-scheduler tries them, that room looked
free, and a plain pod created meanwhile took it (issue 49's soak, seed 1). The
extender now nominates the members still short of the gate
(app/runtime/claim_nominees.py).

Here the late member is made late on purpose: it needs a pod affinity to an
"anchor" pod that does not exist yet. kube-scheduler's InterPodAffinity turns it
away before any extender is asked, and tries it again only once such a pod
appears, so it stays untried, whatever the machine's load, while the test sends
a plain pod that fits only in its room.
"""

from __future__ import annotations

from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import Extender
from tests.cluster.test_preemption import on_nodes, session_nodes

ANCHOR = {"gang-test/anchor": "yes"}


def test_a_late_members_room_is_kept_from_a_plain_pod(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    node1, node2, node3 = session_nodes(kube)
    # node2 and node3 full; node1 has 2.1 CPUs free: the gang's 2 x 1 CPU, and 100m.
    for name, node, cpu in (
        ("fill-1", node1, "1900m"),
        ("fill-2", node2, "4"),
        ("fill-3", node3, "4"),
    ):
        body = kube.pod_body(name, cpu=cpu, memory="1Mi")
        body["spec"]["nodeName"] = node
        kube.core.create_namespaced_pod(namespace, body)
    ours = {f"{namespace}/fill-{i}" for i in (1, 2, 3)}
    wait_for(lambda: on_nodes(extender, {node1, node2, node3}) == ours, 30, "the extender's cache")
    kube.create_podgroup(namespace, "late", 2, timeout=120)
    # The late member first: kube-scheduler turns it away for its affinity (no extender
    # is asked), so its "no node" is seen before the gang is admitted, not after.
    late = kube.pod_body("late-1", group="late", cpu="1", memory="1Mi")
    late["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": ANCHOR},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    kube.core.create_namespaced_pod(namespace, late)
    wait_for(
        lambda: kube.event_on(namespace, "late-1", "FailedScheduling", "affinity"),
        30,
        "late-1 turned away for its affinity",
    )
    # The other member is admitted with the whole gang and waits at the gate; late-1,
    # promised node1, is nominated for it.
    kube.create_pod(namespace, "late-0", group="late", cpu="1", memory="1Mi")

    def nominated() -> str:
        pod = kube.core.read_namespaced_pod("late-1", namespace)
        return str(pod.status.nominated_node_name or "")

    wait_for(lambda: nominated() == node1, 30, "late-1 nominated for node1")
    assert kube.bound(namespace).get("late-0") is None, "late-0 bound alone"
    # A plain pod of the gang's priority that fits only in late-1's room: kube-scheduler
    # counts the nominated member there and finds no node for it.
    kube.create_pod(namespace, "thief", cpu="1", memory="1Mi")
    kube.wait_for_event(namespace, "thief", "FailedScheduling", what="the thief turned away")
    assert "thief" not in kube.bound(namespace)
    # The anchor comes: late-1 is tried, fits in its room, and the gang is bound whole.
    anchor = kube.pod_body("anchor", labels=ANCHOR, cpu="100m", memory="1Mi")
    anchor["spec"]["nodeName"] = node1
    kube.core.create_namespaced_pod(namespace, anchor)
    placed = kube.wait_bound(namespace, "late-", 2)
    assert set(placed.values()) == {node1}, placed
    assert "thief" not in kube.bound(namespace)
