"""A preemption plan in flight holds its draw of a shared device pool (issue 47).

Two gangs planning at once saw each other's open slots on nodes only: the
devices a live plan's members draw of a pool published for many nodes were
free for the other gang's plan, which could count on the very devices the
first plan's victims free. Now a live plan's open slots take their draw of
the pools for gangs planning at the same or a lower priority
(app/runtime/preemption/room.py), and a higher-priority plan drawing on the
same pool makes a lower-priority one give way (plan_book.py), as on a node.
"""

from __future__ import annotations

from typing import Any

from app.core.groups import GroupRef
from app.runtime.preemption import unasked as unasked_preemption
from app.runtime.preemption.plan import Plan, PlanPhase, Slot
from app.runtime.preemption.room import PreemptionRoom
from tests.unit.test_devices import DRIVER, GPU
from tests.unit.test_pool_preemption import _cluster, _run

RACK_POOL = f"{DRIVER}/rack"


def test_a_live_plan_s_open_slots_hold_the_pool_devices_its_victims_free(
    monkeypatch: Any,
) -> None:
    """urgent (priority 1000) plans 2 x 2 of the rack pool of 6, evicting two of its three
    holders: the 4 devices they free are its members'. Another gang planning at the same or
    a lower priority finds the pool with none free (the third holder keeps its 2); one of
    higher priority sees the 4 freed, as it may make urgent's plan give way."""
    monkeypatch.setattr(unasked_preemption, "SETTLE_SECONDS", 0)
    state, preemption, _deleted, plans = _cluster()
    _run(state, preemption)
    made = plans.plans["default/urgent"]
    assert made.evictions == 2
    assert [slot.pools for slot in made.slots] == [{RACK_POOL: {GPU: 2000}}] * 2
    room = PreemptionRoom(state, plans._book)

    def free_at(priority: int) -> int:
        (rack,) = {p for b in room.bins("default/other", priority) for p in b.pools}
        return rack.free.get(GPU, 0)

    assert free_at(1000) == 0
    assert free_at(500) == 0
    assert free_at(5000) == 4000
    # The open slots' draw is counted on their nodes as a placed pod's: the nodes' own
    # devices (none) read as they are, not short.
    rack_bins = [b for b in room.bins("default/other", 1000) if b.pools]
    for b in rack_bins:
        (rack,) = b.pools
        shown = rack.offer[GPU] - rack.used_on.get(b.name, {}).get(GPU, 0)
        assert b.free.get(GPU, 0) - shown <= 0


def _plan(name: str, priority: int, node: str, pools: dict[str, dict[str, int]]) -> Plan:
    slot = Slot(node, {"cpu": 1000, GPU: 2000}, (), planned=f"default/{name}-0", pools=pools)
    return Plan(GroupRef("default", name), priority, 0.0, 60.0, [slot], {}, 0)


def test_a_higher_priority_plan_needing_the_same_pool_makes_a_lower_one_give_way() -> None:
    """low (500) plans a member on n1 drawing 2 of the rack pool; high (1000) one on n2
    drawing 2 of it too: no node in common, but the pool is, and low's draw was not
    counted against high's plan: low's plan is cancelled, and says why. A plan drawing on
    no pool of low's, or of the same priority, leaves it be."""
    _state, _preemption, _deleted, plans = _cluster()
    book = plans._book
    low = _plan("low", 500, "n1", {RACK_POOL: {GPU: 2000}})
    book.add(low)
    book.add(_plan("elsewhere", 1000, "n2", {}))
    book.add(_plan("peer", 500, "n2", {RACK_POOL: {GPU: 2000}}))
    assert low.live and "default/low" in book.plans
    book.add(_plan("high", 1000, "n2", {RACK_POOL: {GPU: 2000}}))
    assert low.phase is PlanPhase.CANCELLED and "default/low" not in book.plans
    assert low.reason == (
        f"higher-priority gang default/high needs devices of shared pool(s) {RACK_POOL}"
    )
