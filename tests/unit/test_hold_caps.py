"""An aged gang's hold kept across walks (app/core/hold_caps.py): the same bins capped once,
the caller's bins and the kept copies never changed, a changed node capped again."""

from __future__ import annotations

from app.core.contention import Gang
from app.core.packing import Bin, Demand
from app.core.room import Room
from tests.unit.test_backfill import aged, cpu, fixed, members

NODES = 6
BIG = aged(members("ns/big", 4, 6))  # 6-CPU members


def cluster() -> tuple[list[Bin], list[Bin], dict[str, list[dict[str, int]]]]:
    """8-CPU nodes, each running one 1-CPU pod: 7 CPU free, of which no 6-CPU member can
    ever use 1, whether the pod stays or ends (and one pod slot)."""
    allocatable = [Bin(f"n{i}", cpu(8, 110)) for i in range(NODES)]
    free = [Bin(f"n{i}", cpu(7, 109)) for i in range(NODES)]
    return free, allocatable, {f"n{i}": [cpu(1)] for i in range(NODES)}


def test_a_second_walk_over_the_same_bins_hands_the_same_capped_copies() -> None:
    free, allocatable, present = cluster()
    remainders = fixed(present)
    off_first: dict[str, dict[str, int]] = {}
    first = Room(free, (), allocatable, remainders=remainders)
    held = first.hold_for(BIG, off_first)
    assert held == [f"n{i}" for i in range(NODES)]
    assert [b.free for b in first.bins] == [{"cpu": 1000, "pods": 108}] * NODES
    assert [b.free["cpu"] for b in free] == [7000] * NODES  # the caller's bins as they were
    off_again: dict[str, dict[str, int]] = {}
    again = Room(free, (), allocatable, remainders=remainders)
    assert again.hold_for(BIG, off_again) == held and off_again == off_first
    assert all(a is b for a, b in zip(again.bins, first.bins, strict=True))


def test_a_node_whose_bin_changed_is_capped_again_and_the_others_are_kept() -> None:
    free, allocatable, present = cluster()
    remainders = fixed(present)
    first = Room(free, (), allocatable, remainders=remainders)
    first.hold_for(BIG)
    free[2] = Bin("n2", cpu(2, 108))  # a 5-CPU pod placed there
    present["n2"] = [cpu(1), cpu(5)]
    again = Room(free, (), allocatable, remainders=remainders)
    assert again.hold_for(BIG) == [f"n{i}" for i in range(NODES)]
    assert again.bins[2] is not first.bins[2] and again.bins[2].free["cpu"] == 1000
    assert all(again.bins[i] is first.bins[i] for i in range(NODES) if i != 2)


def test_room_taken_after_a_hold_changes_a_copy_never_the_kept_one() -> None:
    free, allocatable, present = cluster()
    remainders = fixed(present)
    first = Room(free, (), allocatable, remainders=remainders)
    first.hold_for(BIG)
    small = members("ns/small", 1, 1)
    assert first.set_aside(small)  # the 1 CPU on n0 the big gang can never use
    assert first.bins[0].free.get("cpu", 0) == 0
    again = Room(free, (), allocatable, remainders=remainders)
    again.hold_for(BIG)
    assert [b.free["cpu"] for b in again.bins] == [1000] * NODES


def test_the_warm_up_makes_the_copies_a_slice_at_a_time_and_the_hold_then_makes_none() -> None:
    free, allocatable, present = cluster()
    remainders = fixed(present)
    room = Room(free, (), allocatable, remainders=remainders)
    calls = 1
    while not room.warm_hold(BIG, 2):
        calls += 1
    assert calls == NODES // 2 + 1  # two copies a call; the call that finds none left says so
    kept = {
        name: entry[2] for name, entry in remainders.capped(remainders.shapes(BIG.demands)).items()
    }
    room.hold_for(BIG)
    assert all(b is kept[b.name] for b in room.bins)


def test_a_node_held_whole_for_the_gangs_promised_there_is_not_the_one_kept_for_the_cap() -> None:
    free, allocatable, present = cluster()
    remainders = fixed(present)
    room = Room(free, (), allocatable, remainders=remainders)
    room.promise(["n1"])  # a gang set aside there before the walk went on from its middle
    held = room.hold_for(BIG)
    assert held is not None and "n1" not in held and room.bins[1].free.get("cpu", 0) == 0
    again = Room(free, (), allocatable, remainders=remainders)
    again.hold_for(BIG)
    assert again.bins[1].free["cpu"] == 1000


def test_a_gang_that_never_asks_for_a_resource_leaves_it_uncapped() -> None:
    free, allocatable, present = cluster()
    demands = tuple(Demand(f"ns/g-{i}", {"cpu": 6000}) for i in range(2))
    cpu_only = Gang("ns/g", 0, 0.0, demands, 2, 0.0)
    room = Room(free, (), allocatable, remainders=fixed(present))
    room.hold_for(cpu_only)
    assert [b.free for b in room.bins] == [{"cpu": 1000, "pods": 109}] * NODES
