"""Backfill behind aged gangs (issue 46), end to end: the issue's story on four nodes.

Three nodes run one 6-CPU member of a big gang each, the fourth is empty; two
more big gangs of four 6-CPU members wait (kube-scheduler's own filters pass
the empty node, so the extender turns them away and they join its line) and
age; gangs of 100m then run in the 2 CPUs per node that no 6-CPU member can
ever use (on the empty node too), and when the running big gang ends the
waiting ones start whole, in line order. The real kube-scheduler calls the
extender; every assertion is on what the API server shows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import node_pool
from tests.cluster.session import PERMIT_WAIT_SECONDS, Extender

NODES = 4
AGING_SECONDS = 2
# kube-scheduler retries a pod our filter turned away after its backoff (10 s at
# most) or when the extender wakes it: the small gangs run within that and some.
SMALL_BOUND_SECONDS = 30


@pytest.fixture
def backfill_pool(kube: Kube, extender: Extender) -> Iterator[list[str]]:
    """NODES nodes of 8 CPUs labelled pool=backfill, and the extender with short aging."""
    shape = (NODES, "8", "64Gi")
    with node_pool(kube, extender, "backfill", shape, "--gang-aging-seconds", str(AGING_SECONDS)):
        yield [f"backfill-{i}" for i in range(NODES)]


def gang(
    kube: Kube, namespace: str, name: str, members: int, cpu: str, pool: str = "backfill"
) -> list[str]:
    """A PodGroup of `members` pods of `cpu` each, held to the nodes of `pool`; their names."""
    kube.create_podgroup(namespace, name, members)
    pods = [f"{name}-{i}" for i in range(members)]
    for pod in pods:
        body: dict[str, Any] = kube.pod_body(pod, group=name, cpu=cpu)
        body["spec"]["nodeSelector"] = {"pool": pool}
        kube.core.create_namespaced_pod(namespace, body)
    return pods


def in_line(kube: Kube, namespace: str, name: str, pods: list[str]) -> bool:
    """Is gang `name` in the extender's line: turned away by its filter, or (created while
    another waited, --hold-waiting-gangs=auto) held with its PodGroup told so?"""
    return kube.event_on(namespace, pods[0], f"gang {namespace}/{name} ") or kube.event_on(
        namespace, name, "GangHeldInLine"
    )


def bound_within(
    kube: Kube,
    namespace: str,
    pods: list[str],
    seconds: float,
    what: str,
    big: dict[str, list[str]],
    overtaken_by: Sequence[str] = (),
) -> float:
    """Wait until every one of `pods` is bound; meanwhile no big gang stays partly bound
    longer than its bind wave can take (one gate round), and none of `overtaken_by` is
    bound. The seconds it took."""
    start = time.monotonic()
    partly_since: dict[str, float] = {}
    while True:
        bound = set(kube.bound(namespace))
        now = time.monotonic()
        for name, members in big.items():
            if 0 < len(bound & set(members)) < len(members):
                since = partly_since.setdefault(name, now)
                assert now - since <= PERMIT_WAIT_SECONDS, f"{name} partly bound: {bound}"
            else:
                partly_since.pop(name, None)
        assert not bound & set(overtaken_by), f"{what} was overtaken"
        if set(pods) <= bound:
            return time.monotonic() - start
        assert time.monotonic() - start < seconds, (
            f"{what} not bound within {seconds} s: {sorted(set(pods) - bound)}"
        )
        time.sleep(0.5)


def test_small_gangs_run_beside_big_aged_gangs_which_then_start_whole_in_line_order(
    kube: Kube, namespace: str, backfill_pool: list[str]
) -> None:
    running = gang(kube, namespace, "running", NODES - 1, "6")
    wait_for(
        lambda: set(running) <= set(kube.bound(namespace)), 30, "the first big gang bound whole"
    )
    # Two more big gangs wait (they need every node) and age.
    first = gang(kube, namespace, "first", NODES, "6")
    time.sleep(1.1)  # created a second apart: the line's order is their creation order
    second = gang(kube, namespace, "second", NODES, "6")
    big = {"first": first, "second": second}

    wait_for(
        lambda: all(in_line(kube, namespace, name, pods) for name, pods in big.items()),
        30,
        "both waiting big gangs in the extender's line",
    )
    time.sleep(AGING_SECONDS + 1)

    # Small gangs: their 2 CPUs per node are all they may use, and all they need.
    smalls = [p for i in range(4) for p in gang(kube, namespace, f"small{i}", 2, "100m")]
    elapsed = bound_within(kube, namespace, smalls, SMALL_BOUND_SECONDS, "the small gangs", big)
    assert not set(first + second) & set(kube.bound(namespace))

    # The running gang ends: the first waiting gang starts whole, the second does not.
    for pod in running:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, first, 40, "the first big gang", big, overtaken_by=second)
    for pod in first:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, second, 40, "the second big gang", big)
    print(f"\nfour small gangs bound {elapsed:.1f} s after creation, behind two aged big gangs")
