"""Gang admission end to end: the real kube-scheduler calls the extender over HTTP.

Every assertion is on what the API server shows (spec.nodeName, events) or
on the extender's public /metrics, never on internal state.
"""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime

from hack.clusterkit import local_cluster, wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import DENIED_SECONDS, NODE_CPU, NODES, Extender

SIBLINGS = "cannot find enough sibling pods, current pods number: 2, minMember of group: 3"


def assert_never_bound(kube: Kube, namespace: str, seconds: float) -> None:
    """Watch the whole window: a gang short of minMember must have no pod on a node, ever."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        bound = kube.bound(namespace)
        assert not bound, f"gang partly bound: {bound}"
        time.sleep(0.2)


def test_seed_story_deployment_waits_for_its_third_replica(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "nginx", 3)
    kube.create_deployment(namespace, "nginx", 2, group="nginx")
    pods = wait_for(lambda: len(kube.pods(namespace)) == 2 and kube.pods(namespace), 30, "2 pods")

    def sibling_message_on(name: str) -> bool:
        return any(SIBLINGS in e for e in kube.events(namespace, name))

    for name in [p.metadata.name for p in pods]:
        wait_for(functools.partial(sibling_message_on, name), 30, f"the sibling message on {name}")
    assert kube.bound(namespace) == {}

    kube.scale_deployment(namespace, "nginx", 3)
    third = wait_for(
        lambda: [
            p
            for p in kube.pods(namespace)
            if p.metadata.name not in {q.metadata.name for q in pods}
        ],
        30,
        "the third replica",
    )[0]
    bound = wait_for(
        lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace),
        30,
        "all 3 replicas bound",
    )
    elapsed = (datetime.now(UTC) - third.metadata.creation_timestamp).total_seconds()
    assert elapsed <= 15 + 1, f"gang bound {elapsed:.1f}s after the third pod was created"
    assert set(bound) == {p.metadata.name for p in kube.pods(namespace)}


def test_gang_larger_than_the_cluster_binds_nothing_until_a_node_arrives(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    # Each member needs 3 of a node's 4 CPUs: the 3 nodes hold 3 of the 4 members.
    assert NODE_CPU == "4" and len(kube.node_names()) == NODES
    timeouts_before = extender.sample("gang_extender_gang_admissions_total", result="timeout")
    kube.create_podgroup(namespace, "big", 4, timeout=4)
    for i in range(4):
        kube.create_pod(namespace, f"big-{i}", group="big", cpu="3")
    # Cover at least two whole gate timeouts' worth of time.
    assert_never_bound(kube, namespace, 4 * 2 + DENIED_SECONDS + 2)
    # --gang-feasibility: the whole gang was checked before anything was reserved,
    # so no member ever waited in the gate for a sibling that could not come.
    assert any(
        "needs 4 more member(s) placed at once" in e and "only 3 fit" in e
        for e in kube.events(namespace, "big-0")
    )
    assert extender.sample("gang_extender_gang_admissions_total", result="timeout") == (
        timeouts_before
    )

    local_cluster("add-node", "node-extra", "--cpu", NODE_CPU, "--memory", "8Gi")
    try:
        bound = wait_for(
            lambda: len(kube.bound(namespace)) == 4 and kube.bound(namespace),
            60,
            "all 4 members bound after the node was added",
        )
        assert len(set(bound.values())) == 4  # one per node: 3 CPUs each
    finally:
        kube.delete_pods_now(namespace)
        kube.delete_node("node-extra")


def test_min_resources_beyond_the_cluster_names_the_gap(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "huge", 2, min_resources={"cpu": "100", "memory": "1Gi"})
    for i in range(2):
        kube.create_pod(namespace, f"huge-{i}", group="huge")
    wait_for(
        lambda: any(
            "needs minResources" in e and "short by cpu 88" in e
            for e in kube.events(namespace, "huge-0")
        ),
        30,
        "an event naming the resource gap",
    )
    assert_never_bound(kube, namespace, 3)


def test_timeout_releases_the_gang_denies_it_then_retries(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    kube.create_podgroup(namespace, "stuck", 3, timeout=3)
    kube.create_pod(namespace, "stuck-0", group="stuck")
    kube.create_pod(namespace, "stuck-1", group="stuck")
    # Served by no scheduler: never placed, so the other two wait in the gate until
    # the timeout (a member that fits nowhere would be caught before any reservation).
    kube.create_pod(namespace, "stuck-2", group="stuck", scheduler="no-such-scheduler")

    def messages() -> list[str]:
        return kube.events(namespace, "stuck-0")

    wait_for(
        lambda: any(
            "gang " + namespace + "/stuck timed out after waiting 3s" in e for e in messages()
        ),
        40,
        "a timeout event",
    )
    # The timeout says why the missing member was not placed.
    assert any("not placed: stuck-2: not tried by the scheduler yet" in e for e in messages())
    wait_for(
        lambda: any(
            f"pgName: {namespace}/stuck last failed in {DENIED_SECONDS}s, deny" in e
            for e in messages()
        ),
        30,
        "the denied message",
    )
    first = extender.sample("gang_extender_gang_admissions_total", result="timeout")
    # After the denial expires the group is tried again: members wait in the gate anew.
    wait_for(
        lambda: extender.sample("gang_extender_gang_admissions_total", result="timeout") > first,
        40,
        "a second gate attempt after the denial expired",
    )
    assert kube.bound(namespace) == {}


def test_plain_pods_schedule_normally_beside_waiting_gangs(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "waiting", 3)
    kube.create_pod(namespace, "member-0", group="waiting")
    for i in range(5):
        kube.create_pod(namespace, f"plain-{i}")
    bound = wait_for(
        lambda: (
            {f"plain-{i}" for i in range(5)} <= set(kube.bound(namespace)) and kube.bound(namespace)
        ),
        30,
        "the plain pods bound",
    )
    assert "member-0" not in bound


def test_both_node_cache_modes_through_the_real_scheduler(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    """default-scheduler sends NodeNames (nodeCacheCapable: true); the second
    scheduler, gang-scheduler-nodelist, sends full Nodes (nodeCacheCapable: false)."""

    def calls(mode: str) -> float:
        return extender.sample("gang_extender_filter_requests_total", mode=mode)

    names_before, nodes_before = calls("node-names"), calls("nodes")
    kube.create_podgroup(namespace, "cached", 2)
    kube.create_podgroup(namespace, "listed", 2)
    for i in range(2):
        kube.create_pod(namespace, f"cached-{i}", group="cached")
        kube.create_pod(
            namespace, f"listed-{i}", group="listed", scheduler="gang-scheduler-nodelist"
        )
    bound = wait_for(
        lambda: len(kube.bound(namespace)) == 4 and kube.bound(namespace), 30, "both gangs bound"
    )
    assert set(bound) == {"cached-0", "cached-1", "listed-0", "listed-1"}
    assert calls("node-names") >= names_before + 2
    assert calls("nodes") >= nodes_before + 2


def test_the_filter_names_a_members_node_unless_the_pod_states_a_preference(
    kube: Kube, namespace: str, extender: Extender
) -> None:
    """--member-node-choice=extender: one node in the filter's answer, so kube-scheduler
    neither scores nor calls prioritize for the member; a preferred node affinity, or
    an owner kube-scheduler spreads by default, leaves the ranking to kube-scheduler."""

    def prioritize_calls() -> float:
        return sum(
            value
            for (name, labels), value in extender.metrics().items()
            if name == "gang_extender_requests_total" and dict(labels).get("verb") == "prioritize"
        )

    # A plain pod makes one node the fullest: binpack then ranks it first for the gang.
    kube.create_pod(namespace, "anchor", cpu="1")
    fullest = wait_for(lambda: kube.bound(namespace).get("anchor"), 30, "the anchor bound")
    before = prioritize_calls()
    named = extender.sample("gang_extender_member_node_choices_total", by="extender")
    kube.create_podgroup(namespace, "packed", 2)
    for i in range(2):
        kube.create_pod(namespace, f"packed-{i}", group="packed", cpu="1")
    bound = wait_for(lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace), 30, "gang")
    assert bound["packed-0"] == bound["packed-1"] == fullest, bound
    time.sleep(1)  # a late call, if any, is counted
    assert prioritize_calls() == before
    assert extender.sample("gang_extender_member_node_choices_total", by="extender") >= named + 2

    elsewhere = next(name for name in kube.node_names() if name != fullest)
    kube.create_podgroup(namespace, "picky", 2)
    for i in range(2):
        body = kube.pod_body(f"picky-{i}", group="picky")
        body["spec"]["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [elsewhere]}
                            ]
                        },
                    }
                ]
            }
        }
        kube.core.create_namespaced_pod(namespace, body)
    bound = wait_for(lambda: len(kube.bound(namespace)) == 5 and kube.bound(namespace), 30, "picky")
    assert bound["picky-0"] == bound["picky-1"] == elsewhere, bound
    assert prioritize_calls() >= before + 2

    # A Deployment's pods: kube-scheduler spreads them by default, so it ranks them too.
    before = prioritize_calls()
    kube.create_podgroup(namespace, "web", 2)
    kube.create_deployment(namespace, "web", 2, group="web")
    wait_for(lambda: len(kube.bound(namespace)) == 7, 30, "the Deployment's gang bound")
    assert prioritize_calls() >= before + 2
