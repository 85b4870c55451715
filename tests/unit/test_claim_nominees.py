"""An admitted gang's members late to the gate are nominated for the nodes promised them.

On the arbiter's real claims and gate (tests/unit/test_arbiter.py's World) and the
plans' Nominations writer; the cluster test
(tests/cluster/test_gang_only.py::test_a_late_members_room_is_kept_from_a_plain_pod)
shows kube-scheduler keeping the room for them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.core.admission import FilterReason
from app.core.groups import GroupSpec
from app.core.records import PodRecord
from app.runtime.claim_nominees import ClaimNominees
from app.runtime.preemption.nominations import Nominations
from app.runtime.waiting_room import GateError
from tests.unit.builders import pod
from tests.unit.fakes import eventually
from tests.unit.test_arbiter import World, with_unschedulable
from tests.unit.test_nominations import Api

AFTER = 0.05


class TimedApi(Api):
    """Api that also notes when each write was made."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.times.append(time.monotonic())
        await super().nominate_pod(namespace, name, uid, node)


def nominating(world: World) -> tuple[ClaimNominees, Nominations, TimedApi]:
    """World's claims nominated through a Nominations, wired as app/server.py wires them
    (the plans' pod listener syncs on a change of a pod nominated)."""
    api = TimedApi()
    nominations = Nominations(world.state, api, lambda: ())
    nominees = ClaimNominees(world.state, world.arbiter.ledger, after=AFTER)
    nominees.attach(nominations)

    def follow(old: PodRecord | None, new: PodRecord | None) -> None:
        pod = new or old
        if pod is not None and nominations.concerns(pod):
            nominations.sync()

    world.state.add_pod_listener(follow)
    return nominees, nominations, api


def promised(world: World, gang: str) -> dict[str, str]:
    claim = world.arbiter.claims[f"default/{gang}"]
    return {key.split("/")[1]: node for key, node in claim.plan.items()}


def first_at_gate(world: World, members: int) -> tuple[GroupSpec, dict[str, str], Any]:
    """Gang a of `members` x 2.5 CPU admitted at a-0's filter call; a-0 sent to the gate
    (its task returned) and the others not: the gang, the nodes promised, the task."""
    a = world.gang("a", members, "2500m")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    plan = promised(world, "a")
    return a, plan, world.reserve(a, "a-0", plan["a-0"])


async def test_members_that_reach_the_gate_in_time_are_not_nominated() -> None:
    world = World()
    nominees, nominations, api = nominating(world)
    a = world.gang("a", 3, "2500m")
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    plan = promised(world, "a")
    tasks = [world.reserve(a, name, node) for name, node in plan.items()]
    await asyncio.gather(*tasks)
    await asyncio.sleep(AFTER * 3)
    await nominations.drain()
    assert api.writes == [] and nominees.late == []
    assert "default/a" not in world.arbiter.claims


async def test_members_late_to_the_gate_are_nominated_until_the_claim_ends() -> None:
    world = World()
    nominees, nominations, api = nominating(world)
    admitted = time.monotonic()
    a, plan, first = first_at_gate(world, 3)
    await eventually(lambda: world.gate.waiting("default/a") != [])
    # After it, the two members not at the gate are nominated for their promised nodes.
    await eventually(lambda: len(api.writes) == 2)
    # Not before the wait was over (timed, not polled: a busy machine may let the wait
    # pass while the test awaits the gate).
    assert min(api.times) - admitted >= AFTER
    await nominations.drain()
    assert dict(api.writes) == {"a-1": plan["a-1"], "a-2": plan["a-2"]}
    assert nominees.late == ["default/a"]
    (shown,) = world.arbiter.snapshot()["claims"]
    assert shown["group"] == "default/a" and shown["lateMembersNominated"] is True
    # The claim falls (a member deleted): the remaining member's nomination is removed;
    # the deleted one needs none.
    world.state.delete_pod("default", "a-2")
    assert world.filter(a, "a-0").reason != FilterReason.HOLDING
    await eventually(lambda: len(api.writes) == 3)
    await nominations.drain()
    assert api.writes[2:] == [("a-1", "")]
    assert nominees.late == []
    first.cancel()


async def test_a_late_member_placed_needs_no_write_to_undo_its_nomination() -> None:
    world = World()
    _, nominations, api = nominating(world)
    a, plan, first = first_at_gate(world, 2)
    await eventually(lambda: len(api.writes) == 1)
    await nominations.drain()
    assert api.writes == [("a-1", plan["a-1"])]
    # a-1 comes to the gate on its promised node: the wave binds, the claim ends.
    await asyncio.gather(first, world.reserve(a, "a-1", plan["a-1"]))
    assert "default/a" not in world.arbiter.claims
    await nominations.drain()
    assert api.writes == [("a-1", plan["a-1"])]
    assert nominations.ours == {}


async def test_a_late_member_that_finds_no_node_fails_its_gang_though_we_nominated_it() -> None:
    """A nomination kube-scheduler made is a sign it preempts for the member (the gang is
    not failed fast); the one we wrote for a late member is not."""
    world = World()
    _, nominations, api = nominating(world)
    _, plan, first = first_at_gate(world, 2)
    await eventually(lambda: len(api.writes) == 1)
    # kube-scheduler tried a-1 and found no node; our nomination stayed on it (a pod that
    # may not preempt: kube-scheduler clears a nomination only when its preemption ran).
    raw = with_unschedulable(
        pod("a-1", group="a", cpu="2500m"),
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.",
    )
    raw["status"]["nominatedNodeName"] = plan["a-1"]
    world.state.apply_pod(raw)
    with pytest.raises(GateError, match="released its reservations at once"):
        await first
    assert "default/a" not in world.arbiter.claims
    await eventually(lambda: api.writes[-1:] == [("a-1", "")])
    await nominations.drain()
