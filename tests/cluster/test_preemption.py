"""Gang-aware preemption and placement scoring, driven by the real kube-scheduler.

Victims really go away: the local cluster's pod simulator plays the kubelet
and finishes the deletion kube-scheduler starts. Nodes: 3 x 4 CPUs.
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, LOW, TOP, Kube
from tests.cluster.session import Extender

ZONE = "topology.kubernetes.io/zone"


pytestmark = pytest.mark.usefixtures("priorities")


def names(kube: Kube, namespace: str) -> set[str]:
    """Pods that exist and are not being deleted."""
    return {p.metadata.name for p in kube.pods(namespace) if not p.metadata.deletion_timestamp}


def assert_stays(kube: Kube, namespace: str, expected: set[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        present = names(kube, namespace)
        assert expected <= present, f"evicted: {expected - present}"
        time.sleep(0.3)


@pytest.fixture(params=["gang-feasibility", "members-one-by-one"])
def feasibility(extender: Extender, request: pytest.FixtureRequest) -> Iterator[None]:
    """Both ways members reach preemption: turned away until the whole gang fits, then
    failing (and preempting) within milliseconds of each other; or one by one."""
    if request.param == "gang-feasibility":
        yield
        return
    extender.restart(*extender.extra_args, "--gang-feasibility", "false")
    try:
        yield
    finally:
        extender.restart(*extender.extra_args[:-2])


@pytest.mark.usefixtures("feasibility")
def test_high_priority_gang_evicts_only_what_it_needs(kube: Kube, namespace: str) -> None:
    for i in range(3):
        kube.create_pod(namespace, f"low-big-{i}", cpu="3", priority_class=LOW)
        kube.create_pod(namespace, f"low-small-{i}", cpu="500m", priority_class=LOW)
    before = wait_for(
        lambda: len(kube.bound(namespace)) == 6 and kube.bound(namespace),
        30,
        "the low-priority pods bound",
    )
    kube.create_podgroup(namespace, "urgent", 3, timeout=40)
    for i in range(3):
        kube.create_pod(namespace, f"urgent-{i}", group="urgent", cpu="2", priority_class=HIGH)
    after = wait_for(
        lambda: (
            {f"urgent-{i}" for i in range(3)} <= set(kube.bound(namespace))
            and kube.bound(namespace)
        ),
        90,
        "the whole high-priority gang bound",
    )
    evicted = set(before) - set(after)
    assert evicted, "the gang cannot fit without evictions, yet nothing was evicted"
    # No eviction on a node the gang did not end up using.
    gang_nodes = {after[f"urgent-{i}"] for i in range(3)}
    assert {before[name] for name in evicted} <= gang_nodes, (evicted, before, after)
    # No extra eviction: on every node, putting back any one victim would not fit.
    # The members preempt within milliseconds of each other, before our watch
    # reports a victim's deletion or a sibling's nomination; deciding member
    # by member, a third node lost a pod for nothing. One plan for the gang
    # (app/runtime/preemption/plans.py) makes that impossible.
    millicpu = {"low-big": 3000, "low-small": 500, "urgent": 2000}

    def cpu(name: str) -> int:
        return millicpu[name.rsplit("-", 1)[0]]

    for node in gang_nodes:
        used = sum(cpu(n) for n, at in after.items() if at == node)
        for victim in (v for v in evicted if before[v] == node):
            assert used + cpu(victim) > 4000, f"{victim} was evicted from {node} for nothing"
    # The gang's users see the plan: one Event on the PodGroup naming its nodes and victims.
    planned = wait_for(
        lambda: [e for e in kube.events(namespace, "urgent") if e.startswith("PreemptionPlanned")],
        20,
        "the PreemptionPlanned event",
    )
    assert f"{len(evicted)} eviction(s) for 3 member(s)" in planned[0], planned
    assert all(v in planned[0] for v in evicted), planned


def fill_node3_and_start_low_gang(kube: Kube, namespace: str, group: str) -> None:
    """node-3 is taken by an unevictable pod; a 4-member gang fills node-1 and node-2."""
    kube.create_pod(namespace, f"blocker-{group}", cpu="3500m", priority_class=TOP)
    wait_for(lambda: kube.bound(namespace).get(f"blocker-{group}"), 30, "the blocker bound")
    kube.create_podgroup(namespace, group, 3, timeout=30)
    for i in range(4):
        kube.create_pod(namespace, f"{group}-{i}", group=group, cpu="2", priority_class=LOW)
    wait_for(
        lambda: sum(1 for n in kube.bound(namespace) if n.startswith(f"{group}-")) == 4,
        60,
        "the low-priority gang of 4 bound",
    )


def test_protect_lets_only_the_extra_member_go(kube: Kube, namespace: str) -> None:
    fill_node3_and_start_low_gang(kube, namespace, "batch")
    kube.create_pod(namespace, "vip-1", cpu="2", priority_class=HIGH)
    wait_for(lambda: kube.bound(namespace).get("vip-1"), 60, "vip-1 bound by preemption")
    members = {n for n in names(kube, namespace) if n.startswith("batch-")}
    assert len(members) == 3, f"protect evicted more than the extra member: {members}"

    kube.create_pod(namespace, "vip-2", cpu="2", priority_class=HIGH)
    # A second eviction would leave the gang below minMember: it must not happen.
    assert_stays(kube, namespace, members, 15)
    assert "vip-2" not in kube.bound(namespace)


def test_a_pod_in_no_gang_goes_where_kube_scheduler_named_a_gang_member(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """node-1 runs gang full (3 x 1 CPU, minMember 3, priority 0) and mid (1 CPU, LOW);
    node-2 and node-3 are full at TOP. kube-scheduler's dry run for urgent (1 CPU, HIGH)
    keeps the more important mid and names a member of full: protect refuses that, and
    the extender offers node-1 again with mid as the victim (the soak's seed 2, where a
    plain pod waited 13 minutes). The gang stays whole."""
    node1, node2, node3 = session_nodes(kube)
    kube.create_podgroup(namespace, "full", 3, timeout=60)
    for i in range(3):
        body = kube.pod_body(f"full-{i}", group="full", cpu="1", memory="1Mi")
        body["spec"]["nodeName"] = node1
        kube.core.create_namespaced_pod(namespace, body)
    pinned = [("mid", node1, "1", LOW), ("top-2", node2, "4", TOP), ("top-3", node3, "4", TOP)]
    pin(kube, namespace, pinned)
    ours = {
        f"{namespace}/{name}" for name in ("full-0", "full-1", "full-2", "mid", "top-2", "top-3")
    }
    wait_for(lambda: on_nodes(extender, {node1, node2, node3}) == ours, 30, "the extender's cache")
    kube.create_pod(namespace, "urgent", cpu="1", priority_class=HIGH)
    placed = kube.wait_bound(namespace, "urgent", 1)
    assert placed == {"urgent": node1}, placed
    assert names(kube, namespace) == {"full-0", "full-1", "full-2", "top-2", "top-3", "urgent"}


@pytest.fixture
def whole_gang(extender: Extender) -> Iterator[None]:
    extender.restart("--gang-victim-policy", "whole-gang")
    yield
    extender.restart()


def test_whole_gang_evicts_all_members_or_none(
    kube: Kube, namespace: str, whole_gang: None
) -> None:
    fill_node3_and_start_low_gang(kube, namespace, "sim")
    kube.create_pod(namespace, "vip", cpu="2", priority_class=HIGH)
    wait_for(lambda: kube.bound(namespace).get("vip"), 60, "vip bound by preemption")
    wait_for(
        lambda: not any(n.startswith("sim-") for n in names(kube, namespace)),
        30,
        "every member of the victim gang evicted",
    )


def test_gang_missing_siblings_evicts_nothing(kube: Kube, namespace: str) -> None:
    for i in range(3):
        kube.create_pod(namespace, f"low-{i}", cpu="3", priority_class=LOW)
    wait_for(lambda: len(kube.bound(namespace)) == 3, 30, "the low-priority pods bound")
    kube.create_podgroup(namespace, "partial", 3, timeout=5)
    for i in range(2):
        kube.create_pod(namespace, f"partial-{i}", group="partial", cpu="2", priority_class=HIGH)
    assert_stays(kube, namespace, {f"low-{i}" for i in range(3)}, 15)
    assert not any(n.startswith("partial") for n in kube.bound(namespace))


def test_member_is_never_a_victim_for_its_own_gang(kube: Kube, namespace: str) -> None:
    kube.create_podgroup(namespace, "mixed", 3, timeout=30)
    for i in range(3):
        kube.create_pod(namespace, f"mixed-{i}", group="mixed", cpu="4", priority_class=LOW)
    wait_for(lambda: len(kube.bound(namespace)) == 3, 60, "the gang's first 3 members bound")
    kube.create_pod(namespace, "mixed-3", group="mixed", cpu="4", priority_class=HIGH)
    assert_stays(kube, namespace, {f"mixed-{i}" for i in range(3)}, 15)
    assert "mixed-3" not in kube.bound(namespace)


@pytest.fixture
def zones(kube: Kube, extender: Extender) -> Iterator[dict[str, str]]:
    layout = {"node-1": "zone-a", "node-2": "zone-b", "node-3": "zone-b"}
    for node, zone in layout.items():
        kube.label_node(node, {ZONE: zone})
    extender.restart("--topology-key", ZONE)
    yield layout
    for node in layout:
        kube.label_node(node, {ZONE: None})
    extender.restart()


def test_gang_lands_in_one_zone(kube: Kube, namespace: str, zones: dict[str, str]) -> None:
    kube.create_podgroup(namespace, "ring", 3, timeout=30)
    for i in range(3):
        kube.create_pod(namespace, f"ring-{i}", group="ring", cpu="1")
    bound = wait_for(
        lambda: len(kube.bound(namespace)) == 3 and kube.bound(namespace), 60, "the gang bound"
    )
    assert len({zones[node] for node in bound.values()}) == 1, bound


def node_of(kube: Kube, namespace: str, name: str) -> str | None:
    return kube.bound(namespace).get(name)


def test_binpack_fills_one_node_before_the_next(kube: Kube, namespace: str) -> None:
    nodes = []
    for i in range(3):
        name = f"web-{i}"
        kube.create_pod(namespace, name, cpu="1", memory="2Gi")
        nodes.append(wait_for(functools.partial(node_of, kube, namespace, name), 30, name))
    assert len(set(nodes)) == 1, nodes


def test_gang_that_cannot_fit_even_with_preemption_evicts_nothing(
    kube: Kube, namespace: str
) -> None:
    """Members preempt one by one; a gang that cannot complete must not evict in a loop.

    4 members x 3 CPUs need 12 CPUs; an unevictable pod holds 1 of the
    cluster's 12. Without the gang check each of the first 3 members would
    evict a low-priority pod, wait in the gate, time out, and start over.
    """
    kube.create_pod(namespace, "anchor", cpu="1", priority_class=TOP)
    for i in range(3):
        kube.create_pod(namespace, f"low-{i}", cpu="2", priority_class=LOW)
    wait_for(lambda: len(kube.bound(namespace)) == 4, 30, "the existing pods bound")
    kube.create_podgroup(namespace, "hopeless", 4, timeout=4)
    for i in range(4):
        kube.create_pod(namespace, f"hopeless-{i}", group="hopeless", cpu="3", priority_class=HIGH)
    # Two whole gate timeouts and a denial: nothing may be evicted meanwhile.
    assert_stays(kube, namespace, {"anchor", "low-0", "low-1", "low-2"}, 4 * 2 + 3 + 2)
    assert not any(n.startswith("hopeless") for n in kube.bound(namespace))


def test_a_gang_whose_members_each_fit_alone_still_preempts_for_the_whole(
    kube: Kube, namespace: str
) -> None:
    """The soak's stall (issue 49): every member fits alone on some node without evicting
    anyone, so kube-scheduler's own preemption dry run finds no victims anywhere and never
    calls the extender's preempt verb; only the whole gang needs evictions.

    3 nodes x 4 CPUs, one low-priority pod of 1500m on each: 2500m free per node. A gang
    of 5 x 2000m fits one member per node as it is, and two per node once the pod there
    is gone: it needs exactly 2 evictions.
    """
    schedulable = session_nodes(kube)
    for i, node in enumerate(schedulable):
        body = kube.pod_body(f"low-{i}", cpu="1500m", priority_class=LOW)
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        kube.core.create_namespaced_pod(namespace, body)
    before = kube.wait_bound(namespace, "low-", 3)
    kube.create_podgroup(namespace, "whole", 5, timeout=40)
    for i in range(5):
        kube.create_pod(namespace, f"whole-{i}", group="whole", cpu="2", priority_class=HIGH)
    after = kube.wait_bound(namespace, "whole-", 5)
    left = {n for n in names(kube, namespace) if n.startswith("low-")}
    assert len(left) == 1, f"evicted {set(before) - left}, exactly 2 were needed"
    assert list(after.values()).count(before[left.pop()]) == 1, after


HOLD = "gang-extender.dev/test-hold"


def test_planned_room_is_kept_from_a_lower_priority_pod_while_victims_leave(
    kube: Kube, extender: Extender, namespace: str
) -> None:
    """Every member a plan places is nominated for its node, not only the one kube-scheduler
    acted on (issue 49's soak): room freed by a victim that left must not go to a
    lower-priority pod while another victim of the plan is still leaving.

    node-2 and node-3 are full; node-1 runs two low-priority pods of 2 CPUs, the first
    kept Terminating by a finalizer once evicted. The gang's 3 members of 1 CPU need both
    gone. Once the second is gone, 2 CPUs are free: kube-scheduler's own nomination keeps
    1 for the member it nominated, the extender's keep the other for the others.
    """
    schedulable = session_nodes(kube)
    node1, node2, node3 = schedulable
    pinned = [
        ("top-3", node3, "4", TOP),
        ("top-2", node2, "4", TOP),
        ("low-0", node1, "2", LOW),
        ("low-1", node1, "2", LOW),
    ]
    pin(kube, namespace, pinned, held="low-0")
    # The gang comes once the extender's cache holds these four pods on the nodes and
    # nothing else. Its watch may still show the last test's pods a moment after the API
    # server dropped them; a preempt call then finds no room and is refused, and is asked
    # again only once the view catches up (test_preemption_lag.py), by which time this
    # test's moment (both victims leaving) may be over.
    ours = {f"{namespace}/{name}" for name, *_ in pinned}
    wait_for(
        lambda: on_nodes(extender, set(schedulable)) == ours, 30, "the extender's cache settled"
    )
    members = [f"urgent-{i}" for i in range(3)]
    try:
        kube.create_podgroup(namespace, "urgent", 3, timeout=60)
        for name in members:
            kube.create_pod(namespace, name, group="urgent", cpu="1", priority_class=HIGH)

        def nominated() -> dict[str, str] | None:
            pods = {p.metadata.name: p for p in kube.pods(namespace)}
            shown = {n: pods[n].status.nominated_node_name or "" for n in members}
            held = "low-1" not in pods and pods["low-0"].metadata.deletion_timestamp
            return shown if held and all(shown.values()) else None

        shown = wait_for(nominated, 60, "both victims evicted and every member nominated")
        assert set(shown.values()) == {node1}, shown
        # One victim gone, one leaving: a low-priority pod that fits the room freed.
        kube.create_pod(namespace, "thief", cpu="1", memory="1Mi", priority_class=LOW)
        wait_for(
            lambda: kube.event_on(namespace, "thief", "FailedScheduling"), 30, "thief unplaced"
        )
        # Had kube-scheduler forgotten the members' nominations (it clears one when its own
        # dry run finds no victim left), the extender's filter still keeps node-1's room.
        thief = kube.client.sanitize_for_serialization(  # type: ignore[no-untyped-call]
            kube.core.read_namespaced_pod("thief", namespace)
        )
        answer = ask_filter(extender, thief, schedulable)
        assert f"kept for gang {namespace}/urgent" in answer["FailedAndUnresolvableNodes"].get(
            node1, ""
        ), answer
        # An update of a pending pod makes kube-scheduler try it again: it has seen the
        # first victim gone by then.
        for attempt in range(3):
            time.sleep(2)
            patch = {"metadata": {"labels": {"attempt": str(attempt)}}}
            kube.core.patch_namespaced_pod("thief", namespace, patch)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                assert "thief" not in kube.bound(namespace), "the thief took a member's room"
                time.sleep(0.3)
    finally:
        kube.core.patch_namespaced_pod("low-0", namespace, {"metadata": {"finalizers": None}})
    # Once both victims are gone node-1 holds the gang and, beside it, the thief.
    placed = kube.wait_bound(namespace, "urgent-", 3)
    assert set(placed.values()) == {node1}, placed


def ask_filter(extender: Extender, pod: dict[str, object], nodes: list[str]) -> dict[str, Any]:
    """The extender's filter verb, asked as kube-scheduler asks it (NodeNames)."""
    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
    request = urllib.request.Request(
        f"{extender.url}/scheduler/filter", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def session_nodes(kube: Kube) -> list[str]:
    """The session's 3 schedulable nodes (4 CPUs each), by name."""
    schedulable = sorted(
        n.metadata.name for n in kube.core.list_node().items if not n.spec.unschedulable
    )
    assert len(schedulable) == 3, schedulable
    return schedulable


def pin(
    kube: Kube, namespace: str, pinned: list[tuple[str, str, str, str]], held: str = ""
) -> None:
    """Create each (name, node, cpu, priority class) pod bound to its node; `held` kept
    Terminating by a finalizer once deleted."""
    for name, node, cpu, priority in pinned:
        body = kube.pod_body(name, cpu=cpu, memory="1Mi", priority_class=priority)
        body["spec"]["nodeName"] = node
        if name == held:
            body["metadata"]["finalizers"] = [HOLD]
        kube.core.create_namespaced_pod(namespace, body)


def pinned_then_urgent(
    kube: Kube,
    extender: Extender,
    namespace: str,
    pinned: list[tuple[str, str, str, str]],
    cpu: str,
) -> list[str]:
    """Pin `pinned` (see pin); once the extender's cache holds them on their nodes, gang
    urgent of 2 members of `cpu` at priority HIGH: the members' names."""
    pin(kube, namespace, pinned)
    ours = {f"{namespace}/{name}" for name, *_ in pinned}
    nodes = {node for _name, node, *_ in pinned}
    wait_for(lambda: on_nodes(extender, nodes) == ours, 30, "the extender's cache")
    kube.create_podgroup(namespace, "urgent", 2, timeout=120)
    members = [f"urgent-{i}" for i in range(2)]
    for name in members:
        kube.create_pod(namespace, name, group="urgent", cpu=cpu, priority_class=HIGH)
    return members


def on_nodes(extender: Extender, nodes: set[str]) -> set[str]:
    """The pods the extender's cache (/debug/caches) places on `nodes`."""
    with urllib.request.urlopen(f"{extender.url}/debug/caches", timeout=10) as response:
        pods = json.loads(response.read())["pods"]
    return {key for key, pod in pods.items() if pod["nodeName"] in nodes}
