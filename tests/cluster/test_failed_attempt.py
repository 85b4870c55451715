"""A gang whose attempt failed keeps its place in line while denied, end to end.

Found by CI in tests/cluster/test_backfill.py: two aged gangs wait for a running one; it
ends, the first is admitted, kube-scheduler (its cache a moment behind the extender's)
finds no node for one member, the gang is failed fast and denied for a few seconds, and
the second started in its place. Here kube-scheduler refuses the member for a reason the
extender does not model, inter-pod anti-affinity against a pod that is then deleted: the
refusal comes every time, not one run in ten. And a gang kube-scheduler refuses again
and again stops holding the line. The real kube-scheduler calls the extender; every
assertion is on what the API server shows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.runtime.line_gangs import KEEPS_PLACE_FAILURES
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import node_pool
from tests.cluster.session import Extender
from tests.cluster.test_backfill import bound_within, in_line

AGING_SECONDS = 2
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture
def retry_pool(kube: Kube, extender: Extender) -> Iterator[list[str]]:
    """Three nodes of 4 CPUs labelled pool=retry, and the extender with short aging."""
    shape = (3, "4", "8Gi")
    with node_pool(kube, extender, "retry", shape, "--gang-aging-seconds", str(AGING_SECONDS)):
        yield ["retry-0", "retry-1", "retry-2"]


def gang(
    kube: Kube, namespace: str, name: str, members: int, shun_blocker: bool = False
) -> list[str]:
    """A PodGroup of `members` 3-CPU pods held to the retry pool (one a node); `shun_blocker`:
    each refuses a node that runs the blocker (inter-pod anti-affinity, which the extender
    does not model)."""
    kube.create_podgroup(namespace, name, members)
    pods = [f"{name}-{i}" for i in range(members)]
    for pod in pods:
        body: dict[str, Any] = kube.pod_body(pod, group=name, cpu="3")
        body["spec"]["nodeSelector"] = {"pool": "retry"}
        if shun_blocker:
            body["spec"]["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app": "blocker"}},
                            "topologyKey": HOSTNAME,
                        }
                    ]
                }
            }
        kube.core.create_namespaced_pod(namespace, body)
    return pods


def two_aged_gangs_behind_a_running_one(kube: Kube, namespace: str) -> tuple[list[str], list[str]]:
    """The blocker on retry-0; a running gang on two nodes; gangs first (which shuns the
    blocker) and second, of three members, waiting (kube-scheduler's filters pass the empty
    node, so the extender turns them away and they join its line) in that order, aged.
    Then the running gang ends: the extender admits first onto every node, and
    kube-scheduler finds no node for its member that may not go beside the blocker."""
    blocker = kube.pod_body("blocker", labels={"app": "blocker"})
    blocker["spec"]["nodeSelector"] = {HOSTNAME: "retry-0"}
    kube.core.create_namespaced_pod(namespace, blocker)
    running = gang(kube, namespace, "running", 2)
    wait_for(
        lambda: {"blocker", *running} <= set(kube.bound(namespace)), 30, "blocker and running bound"
    )
    first = gang(kube, namespace, "first", 3, shun_blocker=True)
    time.sleep(1.1)  # created a second apart: the line's order is their creation order
    second = gang(kube, namespace, "second", 3)
    wait_for(
        lambda: (
            in_line(kube, namespace, "first", first) and in_line(kube, namespace, "second", second)
        ),
        30,
        "both gangs in the extender's line",
    )
    time.sleep(AGING_SECONDS + 1)
    for pod in running:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    return first, second


def failed_attempts(extender: Extender) -> float:
    """How many gangs the extender released before their wave was bound (here: first, each
    time kube-scheduler found no node for a member; the extender started afresh)."""
    return extender.sample("gang_extender_gang_admissions_total", result="rejected")


def test_an_aged_gang_refused_once_is_not_overtaken_and_then_starts_whole(
    kube: Kube, namespace: str, extender: Extender, retry_pool: list[str]
) -> None:
    first, second = two_aged_gangs_behind_a_running_one(kube, namespace)
    wait_for(lambda: failed_attempts(extender) >= 1, 40, "first released: a member found no node")
    kube.core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)

    # Denied for a few seconds, then retried: first starts whole, second never before it.
    big = {"first": first, "second": second}
    bound_within(kube, namespace, first, 60, "the first gang", big, overtaken_by=second)
    assert any(
        e.startswith("GangReleased:") and "anti-affinity" in e
        for e in kube.events(namespace, "first")
    )
    for pod in first:
        kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    bound_within(kube, namespace, second, 40, "the second gang", big)


def test_a_gang_refused_again_and_again_lets_the_gang_behind_it_start(
    kube: Kube, namespace: str, extender: Extender, retry_pool: list[str]
) -> None:
    """The blocker stays: first can never start, and only after its third refusal in a row
    (line_gangs.KEEPS_PLACE_FAILURES) is second admitted, while first is denied."""
    first, second = two_aged_gangs_behind_a_running_one(kube, namespace)
    # Each refusal: first denied for 3 s, then its members retried after kube-scheduler's
    # backoff (10 s at most).
    wait_for(lambda: set(second) <= set(kube.bound(namespace)), 120, "second bound")
    assert failed_attempts(extender) >= KEEPS_PLACE_FAILURES + 1
    assert not set(first) & set(kube.bound(namespace))
