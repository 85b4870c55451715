"""A gang made of groups preempts against the real kube-scheduler: the fewest, only in its racks.

Racks of two 1-CPU fake nodes (tests/cluster/test_subgroups.py), full of
low-priority pods, each pinned to its node. A high-priority Kueue gang of 4
in slices of 2 by rack (1 CPU a member) must evict; a flat plan would take
the one free node of rack r0 and evict 3 pods across racks, and a slice
would straddle two racks. The tree's plan (app/core/preemption/tree_plan.py)
evicts only in the racks its slices take, the fewest there are for that.
"""

from __future__ import annotations

import pytest

from app.core.groups import KUEUE_GROUP_LABEL, KUEUE_TOTAL_COUNT_ANNOTATION
from app.core.topology.sources import KUEUE_POD_INDEX, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE
from hack.clusterkit import wait_for
from tests.cluster.kube import HIGH, Kube
from tests.cluster.racks import RACK, filled_racks, slice_racks

pytestmark = pytest.mark.usefixtures("priorities")

# Per rack, per node: the low-priority pods on it (millicpu each); nodes have 1 CPU.
LAYOUT: dict[str, list[list[int]]] = {
    "r0": [[], [500, 500]],  # one free node; the other: two small pods
    "r1": [[1000], [1000]],
    "r2": [[1000], [1000]],
    "r3": [[500, 500], [500, 500]],  # a slice here costs 4
}


def test_a_high_priority_gang_of_slices_evicts_the_fewest_only_in_the_racks_it_takes(
    kube: Kube, namespace: str
) -> None:
    with filled_racks(kube, namespace, LAYOUT) as (rack_of, before):
        for i in range(4):
            kube.create_pod(
                namespace,
                f"train-{i}",
                cpu="1",
                priority_class=HIGH,
                labels={KUEUE_GROUP_LABEL: "train", KUEUE_POD_INDEX: str(i)},
                annotations={
                    KUEUE_TOTAL_COUNT_ANNOTATION: "4",
                    KUEUE_SLICE_REQUIRED: RACK,
                    KUEUE_SLICE_SIZE: "2",
                },
            )
        after = wait_for(
            lambda: (
                {f"train-{i}" for i in range(4)} <= set(kube.bound(namespace))
                and kube.bound(namespace)
            ),
            90,
            "the whole high-priority gang bound",
        )
        gang = {f"train-{i}": after[f"train-{i}"] for i in range(4)}
        taken = slice_racks(gang, rack_of, "train-", 2)  # each slice whole in one rack
        evicted = set(before) - set(after)
        # Only in the racks the slices took, and never rack r3 (4 evictions for a slice).
        assert {rack_of[before[v]] for v in evicted} <= set(taken), (evicted, before, gang)
        assert "r3" not in taken
        # The fewest: a slice in r0 costs 2 (the free node, two small pods), in r1 or r2 2
        # (two pods): 4 in all. A flat plan would evict 3 and split a slice over two racks.
        assert len(evicted) == 4, (evicted, before, gang)
        assert "r0" in taken, taken  # fewer nodes disturbed than r1 or r2
        # What is left stays: the pods of the racks not taken are all still there.
        assert set(after) - set(gang) == set(before) - evicted
        planned = wait_for(
            lambda: [e for e in kube.events(namespace) if e.startswith("PreemptionPlanned")],
            20,
            "the PreemptionPlanned event",
        )
        assert "4 eviction(s) for 4 member(s)" in planned[0], planned
        # The plan names each slice's rack: the racks the gang then took. (Which slice goes
        # to which of them is the admission's choice, fullest first, once the room is free.)
        named = planned[0].split("sub-groups: ", 1)[1]
        assert sorted(part.rsplit(" ", 1)[1] for part in named.split(", ")) == sorted(taken), (
            planned
        )
