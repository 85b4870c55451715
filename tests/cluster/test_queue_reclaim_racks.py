"""Queue reclaim for a gang that must fit in one rack, through the real kube-scheduler.

Two racks of four 1-CPU nodes (the session's nodes cordoned). Queue
rack-owner's four gangs of two fill them, two gangs pinned to each rack, created
one second apart so that the most recent is in r2 and the one before in r1.
Queue rack-needy (the same weight: 4 of the 8 CPUs are its share) then asks
for a gang of four that must fit in one rack (Kueue's
podset-required-topology on its pods). rack-owner may lose two gangs (down to
its share): by age alone those are the last two, one in each rack, 2 CPUs
free in each, where the gang cannot start. Reclaim judges the room by the
gang's own placement rule: both gangs of r2 are evicted, the two of r1 keep
running, and the gang starts whole in r2.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from app.core.groups import VOLCANO_GROUP_ANNOTATIONS
from app.core.topology.sources import KUEUE_REQUIRED
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import RACK, one_rack, racks

OWNER, NEEDY = "rack-owner", "rack-needy"
# rack-owner's gangs (two 1-CPU pods each) in creation order, and the rack each is pinned to.
OWNER_GANGS = {"owner-0": "r2", "owner-1": "r1", "owner-2": "r1", "owner-3": "r2"}
NEEDY_SIZE = 4


@contextlib.contextmanager
def queued_racks(
    kube: Kube, namespace: str, layout: dict[str, tuple[str, int]], owner: str, needy: str
) -> Iterator[dict[str, str]]:
    """The racks of `layout` (node -> rack) and the Queues `owner` and `needy` (weight 1
    each); afterwards the namespace's pods and the Queues gone."""
    with racks(kube, layout) as nodes:
        try:
            kube.create_queue(owner, 1)
            kube.create_queue(needy, 1)
            yield nodes
        finally:
            kube.delete_pods_now(namespace)
            kube.delete_queue(owner)
            kube.delete_queue(needy)


@pytest.fixture
def rack_of(kube: Kube, namespace: str) -> Iterator[dict[str, str]]:
    """Racks r1 and r2 of four 1-CPU nodes each (node -> rack) and the two Queues."""
    with queued_racks(kube, namespace, {"r1": ("b1", 4), "r2": ("b1", 4)}, OWNER, NEEDY) as nodes:
        yield nodes


def volcano_gang(
    kube: Kube,
    namespace: str,
    name: str,
    size: int,
    queue: str,
    *,
    rack: str | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    """A Volcano PodGroup of `size` 1-CPU pods naming `queue`; `rack`: its pods held there by
    a nodeSelector (where it runs is the test's to choose, not the scheduler's)."""
    kube.create_volcano_podgroup(namespace, name, size, queue=queue)
    for i in range(size):
        body = kube.pod_body(
            f"{name}-{i}",
            annotations={VOLCANO_GROUP_ANNOTATIONS[0]: name, **(annotations or {})},
            cpu="1",
        )
        if rack is not None:
            body["spec"]["nodeSelector"] = {RACK: rack}
        kube.core.create_namespaced_pod(namespace, body)


def gang_counts(kube: Kube, namespace: str) -> dict[str, int]:
    """gang -> members bound now."""
    counts: dict[str, int] = {}
    for pod in kube.bound(namespace):
        gang = pod.rsplit("-", 1)[0]
        counts[gang] = counts.get(gang, 0) + 1
    return counts


def reclaimed(kube: Kube, namespace: str, gang: str) -> bool:
    """A GangReclaimed Event was recorded on a member of `gang`."""
    return any(
        e.startswith("GangReclaimed:")
        for i in range(2)
        for e in kube.events(namespace, f"{gang}-{i}")
    )


def needy_bound(kube: Kube, namespace: str, size: int, what: str) -> float:
    """Seconds until the gang `needy` has `size` members bound (60 s at most)."""
    started = time.monotonic()
    wait_for(lambda: gang_counts(kube, namespace).get("needy") == size or None, 60, what)
    return time.monotonic() - started


def counts_stay(kube: Kube, namespace: str, counts: dict[str, int], seconds: float = 3) -> None:
    """The gangs' bound members are `counts` and stay so for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = gang_counts(kube, namespace)
        assert now == counts, now
        time.sleep(0.3)


def test_a_gang_that_needs_one_rack_reclaims_both_gangs_of_one_rack_and_starts_there(
    kube: Kube, namespace: str, rack_of: dict[str, str]
) -> None:
    for i, (name, rack) in enumerate(OWNER_GANGS.items()):
        volcano_gang(kube, namespace, name, 2, OWNER, rack=rack)
        # A PodGroup's creationTimestamp has seconds: one apart, the order is theirs.
        if i < len(OWNER_GANGS) - 1:
            time.sleep(1.05)
    wait_for(
        lambda: gang_counts(kube, namespace) == dict.fromkeys(OWNER_GANGS, 2) or None,
        60,
        "rack-owner's four gangs fill both racks",
    )
    for name, rack in OWNER_GANGS.items():
        one_rack(kube.bound(namespace), rack_of, (f"{name}-{i}" for i in range(2)))
        assert rack_of[kube.bound(namespace)[f"{name}-0"]] == rack
    volcano_gang(kube, namespace, "needy", NEEDY_SIZE, NEEDY, annotations={KUEUE_REQUIRED: RACK})
    elapsed = needy_bound(
        kube, namespace, NEEDY_SIZE, "rack-needy's gang bound whole once room was reclaimed"
    )
    bound = kube.bound(namespace)
    assert one_rack(bound, rack_of, (f"needy-{i}" for i in range(NEEDY_SIZE))) == "r2"
    # Only r2's gangs were evicted; r1's keep running whole, and stay so.
    counts_stay(kube, namespace, {"owner-1": 2, "owner-2": 2, "needy": NEEDY_SIZE})
    assert reclaimed(kube, namespace, "owner-3") and reclaimed(kube, namespace, "owner-0")
    assert not reclaimed(kube, namespace, "owner-2") and not reclaimed(kube, namespace, "owner-1")
    print(f"\nrack-needy's gang bound in r2 {elapsed:.1f}s after creation (r2's gangs reclaimed)")
