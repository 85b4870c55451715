"""Queues through the real kube-scheduler: shares by weight, capability, guarantee, reclaim.

Each test gets nodes of its own (the session's are cordoned), Volcano Queues
(deleted afterwards: with no Queue left the extender is back to one line)
and Volcano PodGroups of two one-CPU pods each, naming their queue.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes import client as k8s

from app.core.groups import VOLCANO_API, VOLCANO_GROUP_ANNOTATIONS
from hack.clusterkit import wait_for
from tests.cluster.kube import Kube
from tests.cluster.session import PERMIT_WAIT_SECONDS, Extender

NODE_CPU = 4
MEMBERS = 2  # one CPU each: a gang takes 2 CPUs


@dataclass
class Cluster:
    kube: Kube
    namespace: str
    queues: list[str] = field(default_factory=list)
    # gang name -> queue, in creation order.
    gangs: dict[str, str] = field(default_factory=dict)

    def queue(self, name: str, weight: int = 1, **kwargs: object) -> None:
        self.kube.create_queue(name, weight, **kwargs)  # type: ignore[arg-type]
        self.queues.append(name)

    def gang(self, name: str, queue: str) -> None:
        self.kube.create_volcano_podgroup(self.namespace, name, MEMBERS, queue=queue)
        for i in range(MEMBERS):
            self.kube.create_pod(
                self.namespace,
                f"{name}-{i}",
                annotations={VOLCANO_GROUP_ANNOTATIONS[0]: name},
                labels={"gang": name},
                cpu="1",
            )
        self.gangs[name] = queue

    def bound_members(self) -> dict[str, int]:
        """gang -> members bound now (gangs with none left out)."""
        counts: dict[str, int] = {}
        for pod in self.kube.bound(self.namespace):
            gang = pod.rsplit("-", 1)[0]
            counts[gang] = counts.get(gang, 0) + 1
        return counts

    def revive(self, done: set[str]) -> int:
        """Recreate the pods of gangs reclaim evicted, as their Job's controller would."""
        present = {p.metadata.name.rsplit("-", 1)[0] for p in self.kube.pods(self.namespace)}
        revived = 0
        for gang in self.gangs:
            if gang not in done and gang not in present:
                for i in range(MEMBERS):
                    self.kube.create_pod(
                        self.namespace,
                        f"{gang}-{i}",
                        annotations={VOLCANO_GROUP_ANNOTATIONS[0]: gang},
                        cpu="1",
                    )
                revived += 1
        return revived

    def finish(self, gang: str) -> None:
        for i in range(MEMBERS):
            self.kube.core.delete_namespaced_pod(
                f"{gang}-{i}", self.namespace, grace_period_seconds=0
            )

    def gang_events(self, gang: str) -> list[str]:
        return self.kube.events(self.namespace, gang) + [
            e for i in range(MEMBERS) for e in self.kube.events(self.namespace, f"{gang}-{i}")
        ]


@pytest.fixture
def cluster(kube: Kube, namespace: str, extender: Extender) -> Iterator[Cluster]:
    """Volcano Queues of the test's own, deleted afterwards (their gangs first)."""
    world = Cluster(kube, namespace)
    try:
        yield world
    finally:
        kube.delete_pods_now(namespace)
        for name in world.queues:
            kube.delete_queue(name)


@pytest.fixture
def nodes(kube: Kube) -> Iterator[list[str]]:
    """The session's nodes cordoned; the test's own nodes deleted afterwards."""
    with kube.nodes_of_its_own() as created:
        yield created


def add_nodes(kube: Kube, created: list[str], count: int) -> int:
    for i in range(count):
        name = f"queue-node-{i}"
        kube.create_node(name, str(NODE_CPU))
        created.append(name)
    return count * NODE_CPU // MEMBERS


class Partials:
    """How long any gang was seen with some but not all members bound."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}
        self.longest = 0.0

    def look(self, bound: dict[str, int]) -> None:
        now = time.monotonic()
        for gang, count in bound.items():
            if count < MEMBERS:
                self.since.setdefault(gang, now)
        for gang in list(self.since):
            if bound.get(gang, 0) in (0, MEMBERS):
                self.longest = max(self.longest, now - self.since.pop(gang))


def known_gangs(extender: Extender, namespace: str) -> set[str]:
    """The gangs of `namespace` the extender's watch has delivered with all their members."""
    with urllib.request.urlopen(f"{extender.url}/debug/gangs", timeout=5) as response:
        groups = json.loads(response.read())["groups"]
    prefix = f"{namespace}/"
    # A key is namespace/name, after "volcano:" for a Volcano PodGroup.
    keys = {g["key"].split(":", 1)[-1]: g["members"] for g in groups}
    return {
        key.removeprefix(prefix)
        for key, members in keys.items()
        if key.startswith(prefix) and members == MEMBERS
    }


def run_shares(
    world: Cluster,
    extender: Extender,
    open_cluster: Callable[[], int],
    per_queue: dict[str, int],
) -> list[float]:
    """Submit the queues' gangs interleaved, then open the cluster (`open_cluster` adds
    the nodes and says how many gangs fit); each round let the cluster fill, then finish
    the oldest running gang. Returns the first queue's share of the bound pods at every
    full round while both queues still had gangs waiting.

    The nodes appear only once the extender has seen every gang: a share is
    worked out from the demand known at a filter call, so gangs placed while
    the other queue's gangs were still being created could let a queue run
    ahead of its share until reclaim evicts its latest gangs (the reclaim
    tests below), and the first full round would measure that race, not the
    share. Gangs reclaim evicts anyway are recreated here (bare pods have no
    controller to do it)."""
    first, second = list(per_queue)
    for i in range(max(per_queue.values())):
        for queue in (first, second):
            if i < per_queue[queue]:
                world.gang(f"{queue}-{i}", queue)
    wait_for(
        lambda: known_gangs(extender, world.namespace) >= set(world.gangs) or None,
        30,
        "every gang in the extender's /debug/gangs",
    )
    fit = open_cluster()
    done: set[str] = set()
    revived = 0
    partials = Partials()
    shares: list[float] = []
    while len(done) < len(world.gangs):
        left = len(world.gangs) - len(done)

        def full(left: int = left) -> dict[str, int] | None:
            nonlocal revived
            revived += world.revive(done)
            bound = world.bound_members()
            partials.look(bound)
            whole = [g for g, n in bound.items() if n == MEMBERS and g not in done]
            return bound if len(whole) == min(fit, left) else None

        try:
            bound = wait_for(full, 60, f"{min(fit, left)} gangs bound whole ({left} left)")
        except TimeoutError as err:
            raise AssertionError(f"{err}; bound: {world.bound_members()}, done: {done}") from None
        waiting = {q for g, q in world.gangs.items() if g not in done and g not in bound}
        if waiting == {first, second}:
            mine = sum(n for g, n in bound.items() if world.gangs[g] == first)
            shares.append(mine / sum(bound.values()))
        oldest = next(g for g in world.gangs if g in bound and g not in done)
        world.finish(oldest)
        done.add(oldest)
    assert partials.longest <= PERMIT_WAIT_SECONDS, f"a gang partly bound {partials.longest}s"
    print(f"\n{revived} gang(s) reclaimed and recreated on the way")
    return shares


def test_two_queues_of_equal_weight_share_the_cluster_half_and_half(
    cluster: Cluster, nodes: list[str], extender: Extender
) -> None:
    cluster.queue("team-a", 1)
    cluster.queue("team-b", 1)
    # 12 CPUs: 6 of the 18 gangs at a time.
    shares = run_shares(
        cluster, extender, lambda: add_nodes(cluster.kube, nodes, 3), {"team-a": 9, "team-b": 9}
    )
    print(f"\nteam-a's share at each full round: {[round(s, 2) for s in shares]}")
    assert len(shares) >= 6
    assert all(abs(s - 0.5) <= 0.10 for s in shares), shares


def test_weights_three_to_one_give_three_quarters_and_one_quarter(
    cluster: Cluster, nodes: list[str], extender: Extender
) -> None:
    cluster.queue("big", 3)
    cluster.queue("small", 1)
    # 16 CPUs: 8 gangs at a time.
    shares = run_shares(
        cluster, extender, lambda: add_nodes(cluster.kube, nodes, 4), {"big": 12, "small": 6}
    )
    print(f"\nbig's share at each full round: {[round(s, 2) for s in shares]}")
    assert len(shares) >= 4
    assert all(abs(s - 0.75) <= 0.10 for s in shares), shares


def test_a_capability_caps_a_queue_even_when_the_other_is_idle(
    cluster: Cluster, nodes: list[str]
) -> None:
    add_nodes(cluster.kube, nodes, 3)
    cluster.queue("capped", 1, capability={"cpu": "4"})
    cluster.queue("idle", 1)
    for i in range(4):
        cluster.gang(f"capped-{i}", "capped")
    wait_for(
        lambda: (
            sorted(g for g, n in cluster.bound_members().items() if n == MEMBERS)
            == ["capped-0", "capped-1"]
        ),
        30,
        "the first two gangs bound (4 CPUs, the capability)",
    )
    wait_for(
        lambda: any("its capability" in e for e in cluster.gang_events("capped-2")),
        30,
        "the third gang told it waits for its queue's capability",
    )
    # The Queue's status subresource counts its gangs (written every 2 s).
    wait_for(
        lambda: (
            (cluster.kube.queue_object("capped").get("status") or {}).get("running") == 2
            and cluster.kube.queue_object("capped")["status"].get("pending") == 2
        ),
        10,
        "Queue capped's status: 2 running, 2 pending",
    )
    assert cluster.kube.queue_object("capped")["status"]["allocated"]["cpu"] == "4"
    # Still capped a while later, with 8 CPUs free.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert sum(cluster.bound_members().values()) <= 2 * MEMBERS
        time.sleep(0.3)
    cluster.finish("capped-0")
    wait_for(
        lambda: cluster.bound_members().get("capped-2") == MEMBERS,
        30,
        "the next gang in once one finished",
    )
    assert sum(cluster.bound_members().values()) == 2 * MEMBERS


def test_a_guarantee_is_kept_free_for_its_queue(cluster: Cluster, nodes: list[str]) -> None:
    add_nodes(cluster.kube, nodes, 3)  # 12 CPUs
    cluster.queue("busy", 1)
    cluster.queue("kept", 1, guarantee={"cpu": "4"})
    for i in range(6):
        cluster.gang(f"busy-{i}", "busy")
    wait_for(
        lambda: sum(cluster.bound_members().values()) == 4 * MEMBERS,
        30,
        "four of busy's gangs bound (8 CPUs: 4 are kept's guarantee)",
    )
    # The guarantee holds while kept is idle.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert sum(cluster.bound_members().values()) == 4 * MEMBERS
        time.sleep(0.3)
    started = time.monotonic()
    cluster.gang("kept-0", "kept")
    cluster.gang("kept-1", "kept")
    wait_for(
        lambda: (
            {"kept-0", "kept-1"} <= {g for g, n in cluster.bound_members().items() if n == MEMBERS}
        ),
        20,
        "kept's gangs bound in its guarantee",
    )
    print(f"\nkept's two gangs bound {time.monotonic() - started:.1f}s after creation")


def test_reclaim_evicts_the_most_recent_gang_of_the_queue_above_its_share(
    cluster: Cluster, nodes: list[str]
) -> None:
    fit = add_nodes(cluster.kube, nodes, 3)
    cluster.queue("owner", 1)
    cluster.queue("late", 1)
    for i in range(fit):
        cluster.gang(f"owner-{i}", "owner")
        # Created one after another: the last one is the most recent.
        time.sleep(1.05 if i == fit - 2 else 0)
    wait_for(
        lambda: sum(cluster.bound_members().values()) == fit * MEMBERS,
        30,
        "owner's gangs fill the cluster while late is idle",
    )
    started = time.monotonic()
    cluster.gang("late-0", "late")
    wait_for(
        lambda: cluster.bound_members().get("late-0") == MEMBERS,
        20,
        "late's gang bound once room was reclaimed",
    )
    elapsed = time.monotonic() - started
    bound = cluster.bound_members()
    last = f"owner-{fit - 1}"
    assert last not in bound, bound
    assert all(bound.get(f"owner-{i}") == MEMBERS for i in range(fit - 1)), bound
    events = cluster.gang_events(last)
    assert any(
        e.startswith("GangReclaimed:") and "queue late is below its deserved share" in e
        for e in events
    ), events
    print(f"\nlate's gang bound {elapsed:.1f}s after creation ({last} reclaimed)")


def test_reclaim_spares_a_gang_its_disruption_budget_protects(
    cluster: Cluster, nodes: list[str]
) -> None:
    fit = add_nodes(cluster.kube, nodes, 3)
    cluster.queue("owner", 1)
    cluster.queue("late", 1)
    for i in range(fit):
        cluster.gang(f"owner-{i}", "owner")
        # The last two in seconds of their own: the most recent, then the one before.
        time.sleep(1.05 if i >= fit - 3 else 0)
    kept, next_one = f"owner-{fit - 1}", f"owner-{fit - 2}"
    policy = k8s.PolicyV1Api(cluster.kube.client)
    budget = k8s.V1PodDisruptionBudget(
        metadata=k8s.V1ObjectMeta(name=kept),
        spec=k8s.V1PodDisruptionBudgetSpec(
            min_available=MEMBERS, selector=k8s.V1LabelSelector(match_labels={"gang": kept})
        ),
    )
    policy.create_namespaced_pod_disruption_budget(cluster.namespace, budget)
    wait_for(
        lambda: sum(cluster.bound_members().values()) == fit * MEMBERS,
        30,
        "owner's gangs fill the cluster while late is idle",
    )

    def guarded() -> bool:
        status = policy.read_namespaced_pod_disruption_budget(kept, cluster.namespace).status
        return status is not None and status.current_healthy == MEMBERS

    wait_for(guarded, 30, f"the disruption controller counts {kept}'s pods (none may go)")
    cluster.gang("late-0", "late")
    wait_for(
        lambda: cluster.bound_members().get("late-0") == MEMBERS,
        30,
        "late's gang bound once room was reclaimed from another gang",
    )
    bound = cluster.bound_members()
    assert bound.get(kept) == MEMBERS, bound  # its budget kept it whole
    assert next_one not in bound, bound
    assert any(e.startswith("GangReclaimed:") for e in cluster.gang_events(next_one))
    assert not any(e.startswith("GangReclaimed:") for e in cluster.gang_events(kept))


def test_a_queue_that_is_not_reclaimable_is_never_reclaimed_from(
    cluster: Cluster, nodes: list[str], extender: Extender
) -> None:
    fit = add_nodes(cluster.kube, nodes, 3)
    cluster.queue("keeps", 1, reclaimable=False)
    cluster.queue("asks", 1)
    for i in range(fit):
        cluster.gang(f"keeps-{i}", "keeps")
    wait_for(
        lambda: sum(cluster.bound_members().values()) == fit * MEMBERS,
        30,
        "keeps' gangs fill the cluster",
    )
    cluster.gang("asks-0", "asks")
    wait_for(
        lambda: any(e.startswith("FailedScheduling:") for e in cluster.gang_events("asks-0")),
        30,
        "asks' gang turned away for capacity",
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        bound = cluster.bound_members()
        assert all(bound.get(f"keeps-{i}") == MEMBERS for i in range(fit)), bound
        assert "asks-0" not in bound
        time.sleep(0.3)
    assert "GangReclaimed" not in " ".join(
        e for i in range(fit) for e in cluster.gang_events(f"keeps-{i}")
    )
    group = cluster.kube.group_object(VOLCANO_API, cluster.namespace, "keeps-0")
    assert group["spec"]["queue"] == "keeps"
