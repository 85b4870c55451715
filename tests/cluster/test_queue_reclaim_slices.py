"""Queue reclaim for a gang constrained only on its slices, through the real kube-scheduler.

Four racks of two 1-CPU nodes (the session's nodes cordoned). Queue
slice-owner fills them: its two oldest gangs hold all of r3 and all of r4
(two pods each), its four most recent are one-pod gangs, one on each node
of r1 and r2. Queue slice-needy (the same weight: 4 of the 8 CPUs are its
share) then asks for a gang of four in slices of two, each slice whole in
one rack (Kueue's podset-slice-required-topology and podset-slice-size on
its pods), and no rack for the gang as a whole.

By reclaim's order alone (the most recent first) the four one-pod gangs of
r1 and r2 would go: four gangs evicted. The slices' search costs each rack
for a slice and takes the fewest: r3's gang and r4's, two gangs, in the two
racks the slices then take; the gangs of r1 and r2 keep running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from app.core.groups import VOLCANO_GROUP_ANNOTATIONS
from app.core.topology.sources import KUEUE_POD_INDEX, KUEUE_SLICE_REQUIRED, KUEUE_SLICE_SIZE
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import RACK, slice_racks
from tests.cluster.test_queue_reclaim_racks import (
    counts_stay,
    gang_counts,
    needy_bound,
    queued_racks,
    reclaimed,
    volcano_gang,
)

OWNER, NEEDY = "slice-owner", "slice-needy"
# slice-owner's gangs in creation order: (pods, the rack they are pinned to).
OWNER_GANGS = {
    "own-r3": (2, "r3"),
    "own-r4": (2, "r4"),
    "one-r2a": (1, "r2"),
    "one-r1a": (1, "r1"),
    "one-r2b": (1, "r2"),
    "one-r1b": (1, "r1"),
}
NEEDY_SIZE, SLICE = 4, 2


@pytest.fixture
def rack_of(kube: Kube, namespace: str) -> Iterator[dict[str, str]]:
    """Racks r1..r4 of two 1-CPU nodes each (node -> rack) and the two Queues."""
    layout = {f"r{i}": ("b1", 2) for i in range(1, 5)}
    with queued_racks(kube, namespace, layout, OWNER, NEEDY) as nodes:
        yield nodes


def sliced_gang(kube: Kube, namespace: str, name: str) -> None:
    """slice-needy's Volcano PodGroup of four 1-CPU pods, ranked, in slices of two by rack."""
    kube.create_volcano_podgroup(namespace, name, NEEDY_SIZE, queue=NEEDY)
    for i in range(NEEDY_SIZE):
        body = kube.pod_body(
            f"{name}-{i}",
            labels={KUEUE_POD_INDEX: str(i)},
            annotations={
                VOLCANO_GROUP_ANNOTATIONS[0]: name,
                KUEUE_SLICE_REQUIRED: RACK,
                KUEUE_SLICE_SIZE: str(SLICE),
            },
            cpu="1",
        )
        kube.core.create_namespaced_pod(namespace, body)


def test_a_gang_of_slices_reclaims_the_fewest_gangs_only_in_the_racks_its_slices_take(
    kube: Kube, namespace: str, rack_of: dict[str, str]
) -> None:
    for i, (name, (size, rack)) in enumerate(OWNER_GANGS.items()):
        volcano_gang(kube, namespace, name, size, OWNER, rack=rack)
        # A PodGroup's creationTimestamp has seconds: one apart, the order is theirs.
        if i < len(OWNER_GANGS) - 1:
            time.sleep(1.05)
    owners = {name: size for name, (size, _) in OWNER_GANGS.items()}
    wait_for(
        lambda: gang_counts(kube, namespace) == owners or None,
        60,
        "slice-owner's six gangs fill the four racks",
    )
    sliced_gang(kube, namespace, "needy")
    elapsed = needy_bound(
        kube, namespace, NEEDY_SIZE, "slice-needy's gang bound whole once room was reclaimed"
    )
    bound = kube.bound(namespace)
    needy = {f"needy-{i}": bound[f"needy-{i}"] for i in range(NEEDY_SIZE)}
    assert sorted(slice_racks(needy, rack_of, "needy-", SLICE)) == ["r3", "r4"]
    # Only the gangs of r3 and r4 were evicted (two, the fewest); r1's and r2's keep running.
    kept = {name: size for name, size in owners.items() if name.startswith("one-")}
    counts_stay(kube, namespace, {**kept, "needy": NEEDY_SIZE})
    assert reclaimed(kube, namespace, "own-r3") and reclaimed(kube, namespace, "own-r4")
    assert not any(reclaimed(kube, namespace, name) for name in kept)
    print(f"\nslice-needy's gang bound in r3 and r4 {elapsed:.1f}s after creation")
