"""Nominations: every member a live plan gives a slot carries status.nominatedNodeName.

kube-scheduler nominates only the member whose preempt answer it acted on;
the rest of the plan's room looks free to any lower-priority pod. The cluster
test (tests/cluster/test_preemption.py) shows kube-scheduler honouring what
is written here; these check what is written, when, and what is taken back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.runtime.preemption.nominations import Nominations
from app.runtime.preemption.plan import PlanPhase
from tests.unit.builders import pod, podgroup
from tests.unit.test_preemption_plans import World, with_priority


class Api:
    """Records each write; `hold` keeps writes waiting until the test sets it."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []
        self.hold: asyncio.Event | None = None

    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        if self.hold is not None:
            await self.hold.wait()
        self.writes.append((name, node))


def member(name: str, group: str, *, nominated: str = "", node: str = "", rv: int = 2) -> Any:
    raw = with_priority(pod(name, group=group, cpu="2", node=node), 1000)
    raw["metadata"]["resourceVersion"] = str(rv)
    if nominated:
        raw["status"]["nominatedNodeName"] = nominated
    return raw


async def planned(members: int = 3) -> tuple[World, Api, Nominations, dict[str, str]]:
    """World's 3 full nodes, gang u of `members` x 2 CPU; member 0 asked: the plan is made."""
    w, api = World(), Api()
    nominations = w.plans.nominate_through(api)
    w.gang("u", members)
    w.ask("u", 0)
    await nominations.drain()
    return w, api, nominations, dict(api.writes)


def slots(w: World) -> list[str]:
    return sorted(s.node for s in w.plans.plans["default/u"].slots)


async def test_every_planned_member_is_nominated_for_its_slot_not_only_the_asking_one() -> None:
    w, api, nominations, written = await planned()
    # One write per member, to the plan's slots: the two not asked too.
    assert sorted(written) == ["u-0", "u-1", "u-2"]
    assert sorted(written.values()) == slots(w)
    # The asking member: the node its answer named.
    (asked,) = [s.node for s in w.plans.plans["default/u"].slots if s.member == "uid-default-u-0"]
    assert asked == written["u-0"]
    # Seen back through the watch: nothing more to write.
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", nominated=node))
    await nominations.drain()
    assert len(api.writes) == 3
    nominations.cancel()


async def test_a_nomination_kube_scheduler_clears_while_the_plan_lives_is_written_again() -> None:
    w, api, nominations, written = await planned()
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", nominated=node))
    # kube-scheduler's preemption found no candidate for u-1 and cleared its nomination.
    w.state.apply_pod(member("u-1", "u", rv=3))
    await nominations.drain()
    assert api.writes[3:] == [("u-1", written["u-1"])]
    nominations.cancel()


async def test_a_plan_that_expires_takes_back_its_nominations() -> None:
    w, api, nominations, written = await planned()
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", nominated=node))
    w.clock.now += 61
    w.plans.on_nodes_changed()  # what the expiry timer runs
    assert "default/u" not in w.plans.plans
    await nominations.drain()
    assert sorted(api.writes[3:]) == [("u-0", ""), ("u-1", ""), ("u-2", "")]
    for name in written:
        w.state.apply_pod(member(name, "u", rv=3))
    assert nominations.ours == {}


async def test_the_expiry_timer_ends_the_plan_without_any_event() -> None:
    w, api, nominations, _ = await planned()
    plan = w.plans.plans["default/u"]
    # The timer runs on the loop's clock: bring the deadline close.
    plan.deadline = w.clock.now + 0.05
    w.plans.on_pod_change(None, w.state.pods["default/u-1"])  # a sync re-times the check
    w.clock.now += 1
    await asyncio.sleep(0.3)
    assert plan.phase is PlanPhase.EXPIRED
    await nominations.drain()
    assert sorted(n for n, node in api.writes[3:] if node == "") == ["u-0", "u-1", "u-2"]


async def test_placed_members_are_not_touched_when_the_plan_is_done() -> None:
    w, api, nominations, written = await planned()
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", nominated=node))
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", node=node, rv=3))
    await nominations.drain()
    assert "default/u" not in w.plans.plans
    assert api.writes[3:] == []
    assert nominations.ours == {}


async def test_kube_schedulers_own_later_nomination_is_left_alone() -> None:
    w, api, nominations, written = await planned()
    for name, node in written.items():
        w.state.apply_pod(member(name, "u", nominated=node))
    w.clock.now += 61
    w.plans.on_nodes_changed()
    await nominations.drain()
    assert ("u-2", "") in api.writes
    # Before our clearing shows, kube-scheduler nominated u-2 elsewhere (its own preemption).
    other = next(n for n in ("n1", "n2", "n3") if n != written["u-2"])
    w.state.apply_pod(member("u-2", "u", nominated=other, rv=3))
    await nominations.drain()
    assert len(api.writes) == 6  # the three set, the three cleared: nothing more
    assert "uid-default-u-2" not in nominations.ours


async def test_a_deleted_planned_member_gives_its_slot_to_a_spare_member() -> None:
    # minMember 3, four pods: the plan nominates three; one is deleted, the spare takes it.
    w, api = World(), Api()
    nominations = w.plans.nominate_through(api)
    w.state.apply_podgroup(podgroup("u", 3))
    for i in range(4):
        w.state.apply_pod(member(f"u-{i}", "u", rv=1))
    w.ask("u", 0)
    await nominations.drain()
    first = dict(api.writes)
    assert len(first) == 3
    gone = next(n for n in first if n != "u-0")
    spare = next(f"u-{i}" for i in range(4) if f"u-{i}" not in first)
    w.state.delete_pod("default", gone)
    await nominations.drain()
    assert api.writes[3:] == [(spare, first[gone])]
    nominations.cancel()


async def test_one_write_per_pod_at_a_time_the_latest_last() -> None:
    w, api = World(), Api()
    nominations = w.plans.nominate_through(api)
    api.hold = asyncio.Event()
    w.gang("u", 3)
    w.ask("u", 0)
    await asyncio.sleep(0)
    # The plan ends while the first writes wait: the clears queue behind them.
    w.state.delete_pod("default", "u-2")
    w.plans.plans["default/u"].deadline = w.clock.now - 1
    w.plans.on_nodes_changed()
    api.hold.set()
    await nominations.drain()
    by_pod: dict[str, list[str]] = {}
    for name, node in api.writes:
        by_pod.setdefault(name, []).append(node)
    assert by_pod["u-0"][-1] == "" and by_pod["u-1"][-1] == ""
    assert len(by_pod["u-0"]) == 2 and by_pod["u-0"][0] != ""


def waiting_nominated(name: str, node: str) -> Any:
    """A gang member kube-scheduler reported unschedulable, nominated for `node`."""
    raw = member(name, "u", nominated=node)
    raw["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
    ]
    return raw


async def test_a_restarted_extender_removes_the_nominations_of_a_plan_it_never_knew() -> None:
    w, api = World(), Api()
    nominations = w.plans.nominate_through(api)
    w.state.apply_podgroup(podgroup("u", 2))
    # What the watch lists after a restart: the members nominated by a plan now gone.
    w.state.apply_pod(waiting_nominated("u-0", "n1"))
    w.state.apply_pod(waiting_nominated("u-1", "n2"))
    await nominations.drain()
    assert sorted(api.writes) == [("u-0", ""), ("u-1", "")]
    w.state.apply_pod(member("u-0", "u", rv=3))
    w.state.apply_pod(member("u-1", "u", rv=3))
    assert nominations.ours == {}
    nominations.cancel()


async def test_a_nomination_a_live_plan_wants_is_kept() -> None:
    w, api, nominations, written = await planned()
    raw = waiting_nominated("u-1", written["u-1"])
    raw["metadata"]["resourceVersion"] = "3"
    w.state.apply_pod(raw)
    await nominations.drain()
    assert all(node for _name, node in api.writes)
    nominations.cancel()
