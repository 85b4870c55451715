"""A gang whose attempt failed keeps its place in line while denied (app/runtime/line_gangs.py),
unless its attempts failed again and again; on the in-memory state and the real permit gate.

Found by CI: two aged big gangs wait for a running one to end; when it does, the first is
admitted, kube-scheduler (its cache a moment behind) finds no node for one member, the gang
is failed fast and denied, and the second, behind it, started in its place."""

from __future__ import annotations

import asyncio

import pytest

from app.core.admission import FilterReason, wholeness
from app.core.contention import Contest, Gang, decide
from app.core.groups import GroupSpec
from app.core.line_look import wake_order
from app.core.packing import Bin, Demand
from app.runtime.line_gangs import KEEPS_PLACE_FAILURES
from app.runtime.waiting_room import GateError
from tests.unit.builders import pod
from tests.unit.test_arbiter import World, with_unschedulable
from tests.unit.test_line_walk import gang

_AGING = 60.0


def _two_aged_behind_a_running_gang() -> tuple[World, GroupSpec, GroupSpec]:
    """Two nodes of 4 CPUs, each running a 3-CPU pod; gangs first and second (two 3-CPU
    members each, PodGroups created a minute apart) turned away in that order, aged; then
    the running pods end."""
    world = World(nodes=2, cpu="4")
    for i in range(2):
        world.state.apply_pod(pod(f"run-{i}", cpu="3", node=f"n{i}", phase="Running"))
    first = gang(world, "first", 2, "3", 0)
    assert world.filter(first, "first-0").reason == FilterReason.INSUFFICIENT_CAPACITY
    world.clock.now += 1
    second = gang(world, "second", 2, "3", 1)
    assert not world.filter(second, "second-0").admitted
    world.clock.now += _AGING
    for i in range(2):
        world.state.delete_pod("default", f"run-{i}")
    return world, first, second


async def _fail_once(world: World, first: GroupSpec, attempt: int) -> None:
    """first is admitted, one member reserved; kube-scheduler finds no node for the other."""
    assert world.filter(first, "first-0").reason == FilterReason.CLAIMED
    reserved = world.reserve(first, "first-0", "n0")
    await asyncio.sleep(0)
    message = f"0/2 nodes are available: 2 Insufficient cpu. (attempt {attempt})"
    world.state.apply_pod(with_unschedulable(pod("first-1", group="first", cpu="3"), message))
    with pytest.raises(GateError, match="released its reservations at once"):
        await reserved
    assert world.admission.check(first, wholeness(first, 2), dict).reason == FilterReason.DENIED


async def test_an_aged_gang_whose_attempt_failed_is_not_overtaken_while_denied() -> None:
    world, first, second = _two_aged_behind_a_running_gang()
    await _fail_once(world, first, 1)

    verdict = world.filter(second, "second-0")
    assert verdict.reason == FilterReason.WAITING_BEHIND
    assert "waiting behind default/first (priority 0), which has waited longest" in verdict.message
    line = world.arbiter.snapshot()["line"]
    assert [(g["group"], g.get("denied", False)) for g in line] == [
        ("default/first", True),
        ("default/second", False),
    ]
    assert line[0]["heldFor"]["nodeCount"] == 2

    # Its denial expires: first is admitted again, second still waits behind it.
    world.clock.now += 3.5
    assert world.filter(first, "first-0").reason == FilterReason.CLAIMED
    assert world.filter(second, "second-1").reason == FilterReason.WAITING_BEHIND


async def test_a_gang_that_failed_again_and_again_is_left_out_while_denied() -> None:
    """Kube-scheduler refuses it whatever the extender reckons (a rule the packing does not
    model): past KEEPS_PLACE_FAILURES failed attempts it no longer holds the gangs behind."""
    world, first, second = _two_aged_behind_a_running_gang()
    for attempt in range(1, KEEPS_PLACE_FAILURES + 1):
        await _fail_once(world, first, attempt)
        assert world.filter(second, "second-0").reason == FilterReason.WAITING_BEHIND
        world.clock.now += 3.5  # the denial expires
    await _fail_once(world, first, KEEPS_PLACE_FAILURES + 1)
    assert [g["group"] for g in world.arbiter.snapshot()["line"]] == ["default/second"]
    assert world.filter(second, "second-0").reason == FilterReason.CLAIMED


async def test_a_gang_that_gave_way_keeps_its_count_of_failed_attempts() -> None:
    """Giving way to a gang of higher priority is no failed attempt of its own."""
    world, first, _ = _two_aged_behind_a_running_gang()
    await _fail_once(world, first, 1)
    world.clock.now += 3.5
    assert world.filter(first, "first-0").reason == FilterReason.CLAIMED
    urgent = world.gang("urgent", 2, "3", priority=10)  # (its members of priority 10)
    assert world.filter(urgent, "urgent-0").reason == FilterReason.CLAIMED
    assert world.arbiter.waiting["default/first"].failed == 1


def test_a_denied_gang_takes_no_room_and_is_not_woken_and_holds_only_aged() -> None:
    """Pure: the decision and the line's look over a line with a denied gang in it."""
    free = [Bin("n0", {"cpu": 4}), Bin("n1", {"cpu": 4})]
    allocatable = list(free)
    demands = (Demand("d-0", {"cpu": 3}), Demand("d-1", {"cpu": 3}))
    denied = Gang("d", 0, 1.0, demands, 2, waiting_since=0.0, denied=True)
    fresh = Gang("f", 0, 2.0, (Demand("f-0", {"cpu": 3}),), 1)
    contest = Contest(free, (), [denied], allocatable)

    # Not aged: it takes nothing, the gang behind it is admitted into its room.
    assert decide(fresh, contest, 10.0, _AGING).plan == {"f-0": "n0"}
    assert wake_order(contest, 10.0, _AGING) == []
    # Aged: it holds what its members can use; the gang behind waits, named behind it.
    waits = decide(fresh, contest, 100.0, _AGING)
    assert waits.behind == ("d", 0) and "has waited longest" in waits.message
    assert wake_order(contest, 100.0, _AGING) == []
    # Its denial over, it fits and is woken.
    undenied = Contest(free, (), [Gang("d", 0, 1.0, demands, 2, waiting_since=0.0)], allocatable)
    assert wake_order(undenied, 100.0, _AGING) == ["d"]
