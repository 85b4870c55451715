"""A preempt call answered from a view that lags kube-scheduler's (issue 49, found by CI).

The extender's caches follow the API server's watch, kube-scheduler's too,
each at its own pace. When the extender's lags, a preempt call may find
room still held by pods kube-scheduler knows are gone, and be refused.
kube-scheduler then parks the gang's members until an event frees room; the
deletions it would wait for it has seen already, so without the extender
nothing asks again and the gang waits for kube-scheduler's 5-minute flush.
The extender asks again itself once its view catches up
(app/runtime/preemption/refusals.py).

The lag is made, not hoped for: the extender reads the API server through
the soak's relay, which holds everything it carries for a few seconds while
two pods are deleted. Nodes: the session's 3 x 4 CPUs.
"""

from __future__ import annotations

import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import LOW, TOP, Kube
from tests.cluster.session import Extender
from tests.cluster.test_preemption import pinned_then_urgent, session_nodes
from tests.soak.components import APISERVER_PORT, extender_behind
from tests.soak.relay import Delay, slow_relay

pytestmark = pytest.mark.usefixtures("priorities")

# How long the extender's view lags while the two pods are deleted: long enough for
# kube-scheduler (backoff of a few seconds) to retry the gang and ask the preempt verb.
LAG_SECONDS = 12.0


def test_a_refusal_read_on_a_lagging_view_is_asked_again_once_the_view_catches_up(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """node-1 and node-2 each run a 2-CPU pod of low priority and one of top priority;
    node-3 is full. A gang of 2 x 4 CPUs cannot preempt (the top pods stay). Both top
    pods are deleted while the extender's view lags: kube-scheduler's next try finds the
    low pods worth evicting and asks the preempt verb, which, reading the top pods still
    there, refuses. Once the view catches up the gang is placed, exactly the two low
    pods evicted."""
    schedulable = session_nodes(kube)
    node1, node2, node3 = schedulable
    pinned = [
        ("low-1", node1, "2", LOW),
        ("top-1", node1, "2", TOP),
        ("low-2", node2, "2", LOW),
        ("top-2", node2, "2", TOP),
        ("full-3", node3, "4", TOP),
    ]
    with (
        slow_relay(APISERVER_PORT, down=Delay(), up=Delay(), seed=49) as relay,
        extender_behind(extender, relay.port),
    ):
        members = pinned_then_urgent(kube, extender, namespace, pinned, cpu="4")
        for name in members:
            kube.wait_for_event(namespace, name, "FailedScheduling", what=f"{name} tried")

        # From here every chunk the extender reads comes LAG_SECONDS late, in order.
        relay.set_delays(Delay(LAG_SECONDS, LAG_SECONDS), Delay())
        for name in ("top-1", "top-2"):
            kube.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        # kube-scheduler's next try finds victims, and the extender refuses them.
        wait_for(
            lambda: any(
                kube.event_on(namespace, name, "no candidate node for preemption")
                for name in members
            ),
            30,
            "kube-scheduler's preemption refused by the extender while its view lags",
        )
        relay.set_delays(Delay(), Delay())  # what was read meanwhile still comes late
        placed = kube.wait_bound(namespace, "urgent-", 2)
        assert set(placed.values()) == {node1, node2}, placed
        left = {p.metadata.name for p in kube.pods(namespace)}
        assert left == {"full-3", *members}, left
