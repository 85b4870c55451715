"""Kubernetes' own PodGroups and CompositePodGroup trees preempt against the real kube-scheduler.

kube-scheduler sends a native PodGroup's pods (and a tree's) through its
pod-group cycle, whose preemption (DefaultPreemption's PodGroupPostFilter)
asks no extender; and with GangScheduling disabled that cycle ends, when the
extender's filter leaves no node in any of several topology domains, in an
error of its PodGroupPodsCount placement scorer, before any preemption. The
extender starts such a gang's preemption itself (app/runtime/preemption/
unasked.py, docs/preemption.md).

Racks of two 1-CPU fake nodes full of low-priority pods, each pinned to its
node; every high-priority member asks for 1 CPU. Each layout has a cheaper
plan that breaks the gang's topology (a flat plan), which must not be taken.
"""

from __future__ import annotations

import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, Kube
from tests.cluster.racks import RACK, filled_racks, one_rack
from tests.cluster.test_composite import leaf_pods, tree

pytestmark = pytest.mark.usefixtures("priorities")

# Per rack, per node: the low-priority pods on it (millicpu each).
FLAT: dict[str, list[list[int]]] = {
    "r0": [[], [400, 300, 300]],  # a free node, but the rack costs 3
    "r1": [[1000], [1000]],  # 2: the fewest in one rack
    "r2": [[500, 500], [500, 500]],  # 4
}
# No topology key: a free node in r1, and one pod to evict on each node of r0.
ANYWHERE: dict[str, list[list[int]]] = {
    "r0": [[1000], [1000]],
    "r1": [[500, 500], []],
}
# Racks r0, r1 in block b0 (2 + 2), r2 alone in block b1 (1, but no room for the second
# leaf in its block). Only one rack in b1: with a second one, kube-scheduler v1.37.2 could
# not place the tree even on free room (docs/preemption.md, "Kubernetes' own PodGroups").
TREE_BLOCKS = {"r0": "b0", "r1": "b0", "r2": "b1"}
TREE: dict[str, list[list[int]]] = {
    "r0": [[1000], [1000]],
    "r1": [[1000], [1000]],
    "r2": [[], [1000]],  # the cheapest rack, alone in its block
}


def planned(kube: Kube, namespace: str) -> str:
    """The extender's PreemptionPlanned event (20 s)."""
    events: list[str] = wait_for(
        lambda: [e for e in kube.events(namespace) if e.startswith("PreemptionPlanned")],
        20,
        "the PreemptionPlanned event",
    )
    return events[0]


def gang_bound(kube: Kube, namespace: str, members: set[str]) -> dict[str, str]:
    """pod -> node of the namespace once every one of `members` is bound (90 s)."""
    after: dict[str, str] = wait_for(
        lambda: members <= set(kube.bound(namespace)) and kube.bound(namespace),
        90,
        "the whole high-priority gang bound",
    )
    return after


def test_a_native_podgroup_with_a_rack_key_evicts_the_fewest_in_one_rack(
    kube: Kube, namespace: str
) -> None:
    with filled_racks(kube, namespace, FLAT) as (rack_of, before):
        kube.create_native_podgroup(namespace, "train", 2, priority_class=HIGH, topology_key=RACK)
        members = {"train-0", "train-1"}
        for name in sorted(members):
            kube.create_pod(namespace, name, cpu="1", scheduling_group="train", priority_class=HIGH)
        after = gang_bound(kube, namespace, members)
        rack = one_rack(after, rack_of, members)
        evicted = set(before) - set(after)
        # The fewest in one rack: r1's two pods (a flat plan would take r0's free node and
        # one pod of r1, 1 eviction, and split the gang over two racks).
        assert rack == "r1", after
        assert {rack_of[before[v]] for v in evicted} == {"r1"}, (evicted, before)
        assert len(evicted) == 2, (evicted, before, after)
        assert set(after) - members == set(before) - evicted
        assert "2 eviction(s) for 2 member(s)" in planned(kube, namespace)


def test_a_native_podgroup_without_topology_evicts_the_fewest_anywhere(
    kube: Kube, namespace: str
) -> None:
    with filled_racks(kube, namespace, ANYWHERE) as (_, before):
        # kube-scheduler has one placement (the whole cluster): no scorer error, its own
        # pod-group preemption runs and fails; the pods carry the filter's refusal.
        kube.create_native_podgroup(namespace, "train", 2, priority_class=HIGH)
        members = {"train-0", "train-1"}
        for name in sorted(members):
            kube.create_pod(namespace, name, cpu="1", scheduling_group="train", priority_class=HIGH)
        after = gang_bound(kube, namespace, members)
        evicted = set(before) - set(after)
        # The free node and one 1-CPU pod: 1 eviction (r1's first node would cost 2).
        assert len(evicted) == 1, (evicted, before, after)
        assert before[evicted.pop()] in {"sub-r0-n0", "sub-r0-n1"}, (before, after)
        assert "sub-r1-n1" in set(after[m] for m in members), after
        assert "1 eviction(s) for 2 member(s)" in planned(kube, namespace)


def test_a_composite_tree_evicts_the_fewest_in_its_racks_of_one_block(
    kube: Kube, namespace: str
) -> None:
    with filled_racks(kube, namespace, TREE, TREE_BLOCKS) as (rack_of, before):
        tree(kube, namespace, "job", {"job-a": 2, "job-b": 2}, priority_class=HIGH)
        leaf_pods(kube, namespace, "job-a", 2, priority_class=HIGH)
        leaf_pods(kube, namespace, "job-b", 2, priority_class=HIGH)
        members = {f"job-{leaf}-{i}" for leaf in "ab" for i in range(2)}
        after = gang_bound(kube, namespace, members)
        taken = {one_rack(after, rack_of, (f"job-{leaf}-{i}" for i in range(2))) for leaf in "ab"}
        evicted = set(before) - set(after)
        # One block, each leaf in a rack of its own: b0 costs 4 (r0 + r1); a plan blind to
        # the block would take r2 and r0 for 3.
        assert taken == {"r0", "r1"}, after
        assert {rack_of[before[v]] for v in evicted} <= taken, (evicted, before)
        assert len(evicted) == 4, (evicted, before, after)
        assert set(after) - members == set(before) - evicted
        assert "4 eviction(s) for 4 member(s)" in planned(kube, namespace)
