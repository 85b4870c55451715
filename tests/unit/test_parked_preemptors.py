"""A pod kube-scheduler nominated and left parked on a node with room for it is requeued.

kube-scheduler's own half (a nomination removed requeues the parked pods of no
higher priority) is exercised against the real kube-scheduler in
tests/cluster/test_parked_preemptor.py; here, which pods are found and when.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.core.preemption.parked import parked_with_room, room_as_scheduler_counts
from app.core.state import ClusterState
from app.runtime.preemption.parked import ParkedPreemptors
from tests.unit.builders import node, pod, podgroup


def preemptor(
    name: str,
    nominated: str = "n1",
    *,
    cpu: str = "2",
    priority: int = 1000,
    unschedulable: bool = True,
    group: str | None = None,
) -> dict[str, Any]:
    raw = pod(name, cpu=cpu, group=group)
    raw["spec"]["priority"] = priority
    raw["status"]["nominatedNodeName"] = nominated
    if unschedulable:
        raw["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient cpu.",
            }
        ]
    return raw


def cluster() -> ClusterState:
    """n1 of 4 CPU holding a 3-CPU victim; the preemptor p (2 CPU) nominated there."""
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="4")])
    state.apply_pod(pod("victim", cpu="3", node="n1", phase="Running"))
    state.apply_pod(preemptor("p"))
    return state


class Nominator:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.calls.append((name, node))


def bound_on_n1(name: str) -> dict[str, Any]:
    """The preemptor as kube-scheduler leaves it once it retried it in time."""
    bound = preemptor(name, unschedulable=False)
    bound["spec"]["nodeName"] = "n1"
    return bound


def watched(*nodes: str, **timings: float) -> tuple[ClusterState, Nominator, ParkedPreemptors]:
    """Nodes of 4 CPUs, and a ParkedPreemptors (these timings) hearing every pod change."""
    state = ClusterState()
    state.replace_nodes([node(name, cpu="4") for name in nodes])
    api = Nominator()
    parked = ParkedPreemptors(state, api, **timings)
    state.add_pod_listener(parked.on_pod_change)
    return state, api, parked


def names(state: ClusterState, node_name: str | None = None) -> list[str]:
    return [p.name for p in parked_with_room(state, node_name)]


def cpu_room(state: ClusterState) -> int:
    room = room_as_scheduler_counts(state, "n1", 1000, "uid-default-p")
    assert room is not None
    return room.get("cpu", 0)


def test_room_counts_placed_pods_and_nominations_at_or_above_the_priority() -> None:
    state = cluster()
    assert cpu_room(state) == 1000
    state.apply_pod(preemptor("ahead", cpu="1", priority=2000, unschedulable=False))
    state.apply_pod(preemptor("behind", cpu="1", priority=10, unschedulable=False))
    assert cpu_room(state) == 0
    assert room_as_scheduler_counts(state, "nowhere", 1000, "uid-default-p") is None


def test_a_parked_pod_is_found_once_its_victim_is_gone_and_not_before() -> None:
    state = cluster()
    assert names(state) == []  # the victim still holds the room
    state.apply_pod(pod("victim", cpu="3", node="n1", phase="Running", deleting=True))
    assert names(state) == []  # leaving: it holds the room until gone
    state.delete_pod("default", "victim")
    assert names(state) == ["p"]
    assert names(state, "n1") == ["p"] and names(state, "n2") == []


def test_gang_members_pods_kube_scheduler_is_trying_and_too_big_pods_are_left_be() -> None:
    state = cluster()
    state.delete_pod("default", "victim")
    state.apply_node(node("n2", cpu="16"))
    state.apply_podgroup(podgroup("g", 2))
    state.apply_pod(preemptor("member", "n2", group="g"))
    state.apply_pod(preemptor("trying", "n2", unschedulable=False))
    state.apply_pod(preemptor("big", "n2", cpu="20"))
    assert names(state) == ["p"]


async def test_the_nomination_is_removed_once_the_room_has_been_free_a_while() -> None:
    state = cluster()
    api = Nominator()
    parked = ParkedPreemptors(state, api, parked_seconds=0.05, cooldown_seconds=60)
    state.add_pod_listener(parked.on_pod_change)
    state.delete_pod("default", "victim")  # the event kube-scheduler missed
    await asyncio.sleep(0.02)
    assert api.calls == []  # kube-scheduler gets its backoff's time first
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == [("p", "")]
    # Once per cooldown: a later change on the node does not requeue it again.
    state.apply_pod(pod("other", cpu="1", node="n1", phase="Running"))
    state.delete_pod("default", "other")
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == [("p", "")]


async def test_a_pod_placed_meanwhile_is_not_touched() -> None:
    state = cluster()
    api = Nominator()
    parked = ParkedPreemptors(state, api, parked_seconds=0.05)
    state.add_pod_listener(parked.on_pod_change)
    state.delete_pod("default", "victim")
    state.apply_pod(bound_on_n1("p"))  # kube-scheduler retried it in time
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == []


async def test_a_pod_parked_after_its_room_was_freed_is_checked_from_then() -> None:
    state, api, parked = watched("n1", parked_seconds=0.05)
    state.apply_pod(preemptor("p", unschedulable=False))
    state.apply_pod(preemptor("p"))  # reported unschedulable with room already free
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == [("p", "")]


def test_no_nomination_no_work() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1")])
    parked = ParkedPreemptors(state, Nominator())
    state.add_pod_listener(parked.on_pod_change)  # outside a loop: no timer may start
    state.apply_pod(pod("a", node="n1", phase="Running"))
    state.delete_pod("default", "a")


async def test_a_nomination_ahead_ending_gives_the_room_back() -> None:
    """A pod of higher priority nominated on the node is bound elsewhere (kube-scheduler
    moves no parked pod for that: kubernetes issue 134859)."""
    state = ClusterState()
    state.replace_nodes([node("n1", cpu="4"), node("n2", cpu="4")])
    ahead = preemptor("ahead", cpu="3", priority=2000)
    ahead["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "nowhere"}
    state.apply_pod(ahead)  # parked too, but no room on n1 is any use to it
    api = Nominator()
    parked = ParkedPreemptors(state, api, parked_seconds=0.05)
    state.add_pod_listener(parked.on_pod_change)
    state.apply_pod(preemptor("p", unschedulable=False))
    state.apply_pod(preemptor("p"))
    await asyncio.sleep(0.1)
    assert api.calls == []  # the pod ahead holds the room
    bound = preemptor("ahead", cpu="3", priority=2000, unschedulable=False)
    bound["spec"]["nodeName"] = "n2"
    state.apply_pod(bound)
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == [("p", "")]


UNANSWERED = (
    "0/2 nodes are available: 2 Insufficient cpu. preemption: Post "
    '"http://127.0.0.1:19888/scheduler/preempt": dial tcp 127.0.0.1:19888: connect: '
    "connection refused"
)


def unanswered_pod(name: str, *, nominated: str = "", **kwargs: Any) -> dict[str, Any]:
    """As kube-scheduler leaves a pod whose preempt call found the extender down."""
    raw = preemptor(name, nominated, **kwargs)
    raw["status"]["conditions"][0]["message"] = UNANSWERED
    return raw


async def test_a_pod_whose_preempt_call_got_no_answer_is_requeued_for_another() -> None:
    """The soak's extender kills: kube-scheduler's filter call was answered, its preempt call
    found the extender down; kube-scheduler parked the pod as if nothing could be evicted,
    and asked again only a minute later."""
    state, api, parked = watched("n2", "n1", unanswered_seconds=0.05)
    state.apply_pod(unanswered_pod("p"))
    state.apply_pod(unanswered_pod("q", nominated="n2"))
    await asyncio.sleep(0.02)
    assert api.calls == []  # kube-scheduler's backoff first
    await asyncio.sleep(0.1)
    await parked.drain()
    # A nomination is set (on some node) when it has none, then removed: kube-scheduler
    # takes that as room given back and tries the pod again.
    assert sorted(api.calls) == [("p", ""), ("p", "n1"), ("q", "")]


async def test_only_pods_parked_for_an_unanswered_preempt_call_are_requeued() -> None:
    state, api, parked = watched("n1", unanswered_seconds=0.05)
    state.apply_podgroup(podgroup("g", 2))
    state.apply_pod(unanswered_pod("member", group="g"))  # the gang's own wake-ups
    never = unanswered_pod("never")
    never["spec"]["preemptionPolicy"] = "Never"
    state.apply_pod(never)
    state.apply_pod(preemptor("answered", ""))  # preemption ran and found nothing
    state.apply_pod(unanswered_pod("placed"))
    state.apply_pod(bound_on_n1("placed"))  # kube-scheduler retried it in time
    await asyncio.sleep(0.1)
    await parked.drain()
    assert api.calls == []
