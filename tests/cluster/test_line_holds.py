"""Gangs held in line (--hold-waiting-gangs), end to end in the gang-only mode.

The webhook gives members the scheduling gate gang-extender.dev/line; the extender removes
it once the gang can be admitted as a whole, in line order. While a gang waits,
kube-scheduler never tries its members (their PodScheduled reason stays SchedulingGated,
no FailedScheduling is written): the cost a deep line put on kube-scheduler (issue 46).
The story is test_backfill's on four nodes: one big gang runs, two more wait and age,
small gangs run in the room no big member can use, and the waiting big gangs start whole
in line order as the running ones end. Then holding is turned off with a gang held:
its members are released to kube-scheduler, whose filter call says why they wait.
Gangs that may preempt are held too: the extender starts their preemption (kube-scheduler
never tries a gated pod), and one that cannot fit even with evictions stays held, so
lower-priority pods created after it are tried and placed (issue 49's soak).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from app.core.marking import LINE_GATE
from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, LOW, Kube
from tests.cluster.racks import node_pool
from tests.cluster.session import GANG_ONLY, Extender
from tests.cluster.test_backfill import bound_within
from tests.cluster.test_backfill import gang as backfill_gang

pytestmark = pytest.mark.skipif(not GANG_ONLY, reason="holding needs the gang-only webhook")

NODES = 4
AGING_SECONDS = 2


@pytest.fixture
def hold_pool(kube: Kube, extender: Extender) -> Iterator[list[str]]:
    """NODES nodes of 8 CPUs labelled pool=holds, and the extender holding, with short aging."""
    flags = ("--gang-aging-seconds", str(AGING_SECONDS), "--hold-waiting-gangs", "true")
    with node_pool(kube, extender, "holds", (NODES, "8", "64Gi"), *flags):
        yield [f"holds-{i}" for i in range(NODES)]


def gang(kube: Kube, namespace: str, name: str, members: int, cpu: str) -> list[str]:
    return backfill_gang(kube, namespace, name, members, cpu, pool="holds")


def pool_pod(
    kube: Kube, namespace: str, name: str, cpu: str, priority: str, group: str | None = None
) -> str:
    body = kube.pod_body(name, group=group, cpu=cpu, priority_class=priority)
    body["spec"]["nodeSelector"] = {"pool": "holds"}
    kube.core.create_namespaced_pod(namespace, body)
    return name


def gates(kube: Kube, namespace: str, pod: str) -> list[str]:
    raw = kube.core.read_namespaced_pod(pod, namespace)
    return [g.name for g in raw.spec.scheduling_gates or ()]


def never_tried(kube: Kube, namespace: str, pods: list[str]) -> None:
    """Held: the line's gate on, kube-scheduler's only word 'SchedulingGated' (and its one
    Event saying so), no filter call."""
    for pod in pods:
        raw = kube.core.read_namespaced_pod(pod, namespace)
        assert [g.name for g in raw.spec.scheduling_gates or ()] == [LINE_GATE], pod
        reasons = {c.reason for c in raw.status.conditions or () if c.type == "PodScheduled"}
        assert reasons <= {"SchedulingGated"}, (pod, reasons)
        tried = [
            e
            for e in kube.events(namespace, pod)
            if e.startswith("FailedScheduling") and "scheduling gates" not in e
        ]
        assert not tried, tried


def test_waiting_gangs_are_held_out_of_kube_schedulers_queue_and_start_in_line_order(
    kube: Kube, namespace: str, hold_pool: list[str]
) -> None:
    running = gang(kube, namespace, "running", NODES - 1, "6")
    wait_for(
        lambda: set(running) <= set(kube.bound(namespace)), 30, "the first big gang bound whole"
    )
    first = gang(kube, namespace, "first", NODES, "6")
    time.sleep(1.1)  # created a second apart: the line's order is their creation order
    second = gang(kube, namespace, "second", NODES, "6")
    big = {"first": first, "second": second}
    for name in big:
        kube.wait_for_event(namespace, name, "GangHeldInLine", LINE_GATE, what=f"{name} held")
    time.sleep(AGING_SECONDS + 1)
    never_tried(kube, namespace, first + second)

    # Small gangs are released at once and run in the 2 CPUs per node no big member can use.
    smalls = [p for i in range(4) for p in gang(kube, namespace, f"small{i}", 2, "100m")]
    elapsed = bound_within(kube, namespace, smalls, 30, "the small gangs", big)
    never_tried(kube, namespace, first + second)

    # The running gang ends: the first waiting gang is released and starts whole, the
    # second stays held.
    for pod in running:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, first, 40, "the first big gang", big, overtaken_by=second)
    never_tried(kube, namespace, second)
    for pod in first:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, second, 40, "the second big gang", big)
    print(f"\nfour small gangs bound {elapsed:.1f} s after creation, beside two held big gangs")


def test_turning_holding_off_releases_the_held_gangs_to_the_filter(
    kube: Kube, namespace: str, extender: Extender, hold_pool: list[str]
) -> None:
    # Two gangs that cannot fit at once: the second is held behind the first.
    first = gang(kube, namespace, "first", NODES, "6")
    bound_within(kube, namespace, first, 30, "the first gang", {})
    second = gang(kube, namespace, "second", NODES, "6")
    kube.wait_for_event(namespace, "second", "GangHeldInLine", what="second held")
    never_tried(kube, namespace, second)

    extender.restart(*extender.extra_args[:-2], "--hold-waiting-gangs", "false")
    wait_for(
        lambda: all(not gates(kube, namespace, pod) for pod in second),
        30,
        "the held members released once holding is off",
    )
    # kube-scheduler tries them now, and says why they wait (its own filters: every node of
    # the pool is full).
    kube.wait_for_event(
        namespace, second[0], "FailedScheduling", "Insufficient cpu", what="a member tried"
    )
    assert not set(second) & set(kube.bound(namespace))


@pytest.mark.usefixtures("priorities")
def test_a_held_gang_that_may_preempt_evicts_only_what_it_needs_and_starts_whole(
    kube: Kube, namespace: str, hold_pool: list[str]
) -> None:
    big = [pool_pod(kube, namespace, f"low-big-{i}", "6", LOW) for i in range(NODES)]
    wait_for(lambda: set(big) <= set(kube.bound(namespace)), 30, "the low-priority pods bound")
    small = [pool_pod(kube, namespace, f"low-small-{i}", "1", LOW) for i in range(NODES)]
    wait_for(lambda: set(small) <= set(kube.bound(namespace)), 30, "the small ones bound")

    # Hopeless: no node has 9 CPUs. Held, never tried, nothing evicted for it.
    kube.create_podgroup(namespace, "hopeless", 2)
    hopeless = [
        pool_pod(kube, namespace, f"hopeless-{i}", "9", HIGH, group="hopeless") for i in range(2)
    ]
    kube.create_podgroup(namespace, "urgent", 2)
    urgent = [pool_pod(kube, namespace, f"urgent-{i}", "6", HIGH, group="urgent") for i in range(2)]
    assert all(gates(kube, namespace, p) == [LINE_GATE] for p in hopeless + urgent)

    # urgent needs two of the 6-CPU pods gone, and nothing else.
    wait_for(lambda: set(urgent) <= set(kube.bound(namespace)), 60, "the urgent gang bound whole")
    left = {p.metadata.name for p in kube.pods(namespace) if not p.metadata.deletion_timestamp}
    assert set(small) <= left, f"a bystander was evicted: {set(small) - left}"
    assert len(set(big) - left) == 2, f"evicted {sorted(set(big) - left)}, the fewest is 2"

    # A low-priority pod created after the hopeless gang is tried and placed: the hopeless
    # gang is not in kube-scheduler's queue ahead of it.
    late = pool_pod(kube, namespace, "late", "1", LOW)
    wait_for(lambda: late in kube.bound(namespace), 30, "the late low-priority pod bound")
    never_tried(kube, namespace, hopeless)
    assert not set(hopeless) & set(kube.bound(namespace))


@pytest.mark.usefixtures("priorities")
def test_a_held_gang_is_not_released_onto_room_kube_scheduler_keeps_for_a_preemptor(
    kube: Kube, namespace: str, hold_pool: list[str]
) -> None:
    """A gate cannot be put back: a held gang goes only once it fits in what kube-scheduler
    sees free. Here a plain pod of high priority preempts through kube-scheduler's own
    preemption: its victim leaves, and kube-scheduler keeps the room for the pod it
    nominated. The extender's line alone would count that room free; released there, the
    gang's members were turned away and retried on every cluster event, ahead of every pod
    of lower priority (issue 49's soak)."""
    low = [pool_pod(kube, namespace, f"low-{i}", "7", LOW) for i in range(NODES)]
    wait_for(lambda: set(low) <= set(kube.bound(namespace)), 30, "the low-priority pods bound")
    waiting = gang(kube, namespace, "waiting", 2, "3")  # no node has 3 CPUs free
    kube.wait_for_event(namespace, "waiting", "GangHeldInLine", what="the gang held")

    urgent = pool_pod(kube, namespace, "urgent", "8", HIGH)
    wait_for(lambda: urgent in kube.bound(namespace), 60, "the preempting pod bound")
    evicted = set(low) - {p.metadata.name for p in kube.pods(namespace)}
    assert len(evicted) == 1, f"evicted {sorted(evicted)}; one node's pod is the fewest"
    time.sleep(2)  # a release on the victim's room would have come by now
    never_tried(kube, namespace, waiting)

    # The preemptor ends: its node is free for kube-scheduler too, and the gang goes.
    kube.core.delete_namespaced_pod(urgent, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, waiting, 30, "the held gang", {"waiting": waiting})
