"""The kept walk of the line through aged gangs that do not fit (app/runtime/line_pass.py):
each holds what it can use, the walk goes on behind it and is handed out, and a fresh gang is
decided exactly as a decision walking the whole line decides, whatever changes between."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.admission import DenyReason
from app.core.contention import Contest, Gang, decide
from app.core.groups import GroupSpec
from app.core.line_look import wake_order
from app.core.packing import Bin, Demand
from app.core.room import Room
from app.runtime.line_pass import CAPS_A_GANG, NODES_A_GANG, AlikeRuns, LineAt
from app.runtime.line_walk import LineWalk
from tests.unit.builders import pod
from tests.unit.test_arbiter import World
from tests.unit.test_line_walk import _AGING, both, gang, join, warm_slice

# Per gang in line: (minMember, CPU each, minute created, pods beyond minMember).
_LINE = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(0, 50), st.integers(0, 1)),
    min_size=1,
    max_size=7,
)
_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("run", "end", "swap", "join", "leave", "tick", "claim"),
                *("deny", "deny", "fail", "warm", "warm"),
            ]
        ),
        st.integers(0, 6),
        st.integers(1, 4),
    ),
    max_size=25,
)


def _busy(world: World, node: int, cpus: list[int], tag: str) -> None:
    for i, cpu in enumerate(cpus):
        world.state.apply_pod(pod(f"{tag}-{i}", cpu=str(cpu), node=f"n{node}", phase="Running"))


def test_an_aged_gang_that_does_not_fit_is_walked_past_and_the_walk_handed_out() -> None:
    """Nothing changed since the last decision: nothing is walked again, behind an aged gang
    that holds room back too (before, every decision walked the line itself from it)."""
    world = World(nodes=3, cpu="8")
    for i in range(3):
        world.state.apply_pod(pod(f"r{i}", cpu="4", node=f"n{i}", phase="Running"))
    gang(world, "big", 3, "6", 0)
    join(world, "big")
    for i in range(3):
        gang(world, f"small{i}", 1, "1", 1 + i)
        join(world, f"small{i}")
    fresh = gang(world, "fresh", 1, "3", 59)
    world.clock.now += _AGING  # big has aged: it holds what a 6-CPU member can use
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 4
    assert "waiting behind default/big" in with_walk.message
    assert world.arbiter.line.walk.walked(_over(world)) is not None
    assert both(world, fresh)[2] == 0


def test_a_node_whose_pods_changed_but_not_its_free_room_is_a_change_for_the_holds() -> None:
    """Pods of 1 and 2 CPU on a node, then of 3 and 0 in their place: its free room is alike
    (CPU, memory, pods), but what the aged gang can never use there is not: it may use the
    room either pod leaves."""
    world = World(nodes=2, cpu="10")
    _busy(world, 0, [1, 2], "a")  # n0: 7 CPU free; big may use them all once a pod ends
    _busy(world, 1, [8, 0], "b")  # n1: 2 CPU free that no 4-CPU member can ever use
    gang(world, "big", 3, "4", 0)  # 3 x 4 CPU: fits the empty cluster, not now
    join(world, "big")
    fresh = gang(world, "fresh", 1, "2", 59)
    world.clock.now += _AGING
    with_walk, whole, _ = both(world, fresh)
    assert with_walk == whole and with_walk.plan == {"default/fresh-0": "n1"}
    for i in range(2):
        world.state.delete_pod("default", f"a-{i}")
    _busy(world, 0, [3, 0], "c")  # n0 as free as before; 2 of its 7 CPU big can never use
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and with_walk.plan == {"default/fresh-0": "n0"}
    assert again >= 1


@settings(max_examples=300, deadline=None)
@given(line=_LINE, busy=st.lists(st.integers(0, 7), min_size=4, max_size=4), ops=_OPS)
def test_behind_aged_gangs_the_kept_walk_decides_as_a_whole_walk(
    line: list[tuple[int, int, int, int]], busy: list[int], ops: list[tuple[str, int, int]]
) -> None:
    """Aged gangs that do not fit ahead of a fresh one, and every kind of change between two
    decisions: pods run, end or are swapped for others as large (the room alike, what an aged
    gang can never use not), gangs join or leave the line, age, or claim room."""
    world = World(nodes=4, cpu="8")
    for n, cpu in enumerate(busy):  # two pods a node, one of no CPU (swapped below)
        _busy(world, n, [cpu, 0], f"x{n}")
    names = [f"w{i}" for i in range(len(line))]
    for name, (members, cpu, minute, spare) in zip(names, line, strict=True):
        gang(world, name, members, str(cpu), minute, spare=spare)
        join(world, name)
    fresh = gang(world, "fresh", 1, "1", 59)
    world.clock.now += _AGING  # every gang in line has aged
    running = 0
    for kind, a, b in ops:
        name = names[a % len(names)]
        key = f"default/{name}"
        if kind == "run":
            running += 1
            _busy(world, a % 4, [b], f"r{running}")
        elif kind == "end" and running:
            world.state.delete_pod("default", f"r{1 + (a * 7 + b) % running}-0")
        elif kind == "swap" and busy[a % 4] > 1:  # two pods for two as large in all
            n = a % 4
            cut = 1 + b % (busy[n] - 1)
            _busy(world, n, [cut, busy[n] - cut], f"x{n}")  # the room alike; its pods not
        elif kind == "join" and key not in world.arbiter.claims:
            join(world, name)
        elif kind == "leave":
            world.arbiter.waiting.pop(key, None)
        elif kind == "tick":
            world.clock.now += 25 * b
        elif kind == "claim" and key not in world.arbiter.claims:
            world.filter(GroupSpec(key, line[a % len(names)][0]), f"{name}-0")
        elif kind == "deny":  # its attempt failed: denied for 3 s (b > 2: that long passed)
            world.admission.deny(key, DenyReason.TIMEOUT, "its wait ran out")
            world.clock.now += b - 0.5
        elif kind == "fail" and key in world.arbiter.waiting:  # failed again and again
            entry = world.arbiter.waiting[key]
            world.arbiter.waiting[key] = replace(entry, failed=entry.failed + b)
        elif kind == "warm":  # a warm-up's slice of b gangs: the next one goes on from it
            warm_slice(world, b)
        with_walk, whole, _ = both(world, fresh)
        assert with_walk == whole, (kind, a, b)
        line_now = world.arbiter.line  # the look at the line wakes what a whole walk would
        woken = list(line_now.wake_steps(world.clock.now, _AGING, 3, b))[-1]
        assert woken == wake_order(line_now.contest(exclude=""), world.clock.now, _AGING, 3)
        if key in world.arbiter.waiting and key not in world.arbiter.claims:  # one in line
            with_walk, whole, _ = both(world, GroupSpec(key, line[a % len(names)][0]))
            assert with_walk == whole, ("in line", kind, a, b)


def _over(world: World):  # type: ignore[no-untyped-def]
    from app.runtime.line_pass import LineAt

    contest = world.arbiter.line.contest(exclude="default/fresh")
    return LineAt.of(contest, world.clock.now, _AGING)


def test_the_warm_up_works_out_the_remainders_an_aged_gang_holds_by_a_slice_at_a_time() -> None:
    """The first hold reads every node's remainder: the warm-up's walk works them out
    NODES_A_GANG nodes per gang of its slice, a call at a time (at 5,000 nodes all at once
    held the event loop for hundreds of ms); then the fresh gang walks nothing again."""
    world = World(nodes=12, cpu="8")
    for i in range(12):
        world.state.apply_pod(pod(f"r{i}", cpu="4", node=f"n{i}", phase="Running"))
    gang(world, "big", 3, "6", 0)
    join(world, "big")
    fresh = gang(world, "fresh", 1, "3", 59)
    world.clock.now += _AGING
    world.arbiter.line.learn(10)
    slices = 1
    while not warm_slice(world, 1):  # 1 gang, NODES_A_GANG nodes' remainders, a slice
        slices += 1
    # Then the capped bins of its hold, CAPS_A_GANG a slice, the first in the remainders'
    # last slice (every node has 2 CPU more free than the 2 a 6-CPU member can never use);
    # the slice that finds none left to make holds and walks on.
    assert slices == (-(-12 // NODES_A_GANG) - 1) + -(-12 // CAPS_A_GANG) + 1
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0
    assert "waiting behind default/big" in with_walk.message


def test_a_candidate_whose_own_entry_stands_ahead_of_it_is_not_served_from_the_walk() -> None:
    """The walk's line has the candidate's own entry, ahead of where the candidate stands now
    (aged there, not as weighed): the room before its place holds what its entry took, so
    the decision walks the line itself, leaving its own entry out."""
    fits = Gang("c", 0, 1.0, (Demand("c-0", {"cpu": 3}),), 1, waiting_since=0.0)  # aged
    other = Gang("w", 0, 2.0, (Demand("w-0", {"cpu": 3}),), 1, waiting_since=0.0)
    candidate = replace(fits, waiting_since=None)  # as weighed now: not aged, behind `w`
    free = [Bin("n0", {"cpu": 4}), Bin("n1", {"cpu": 4})]
    positions = {"n0": 0, "n1": 1}
    line = [fits, other]
    walked = LineWalk().walked(LineAt(line, free, (), positions, 100.0, _AGING))
    assert walked is not None
    contest = Contest(free, (), line, positions=positions)
    with_walk = decide(candidate, replace(contest, walked=walked), 100.0, _AGING)
    assert with_walk == decide(candidate, contest, 100.0, _AGING)
    assert with_walk.plan == {"c-0": "n1"}  # w ahead took n0; its own entry's room is not held


def test_a_run_of_alike_aged_gangs_walked_in_slices_is_walked_once_and_kept_whole() -> None:
    """Six alike aged gangs that do not fit, warmed two a slice: each slice goes on with the
    run the last one stopped in (no first fit, no hold again), and once its end is seen the
    whole run is kept, so the decision after walks nothing again."""
    world = World(nodes=3, cpu="8")
    for i in range(3):
        world.state.apply_pod(pod(f"r{i}", cpu="4", node=f"n{i}", phase="Running"))
    for i in range(6):
        gang(world, f"big{i}", 3, "6", i)
        join(world, f"big{i}")
    fresh = gang(world, "fresh", 1, "1", 59)
    world.clock.now += _AGING
    world.arbiter.line.learn(10)
    holds: list[str] = []
    room_hold = Room.hold_for

    def hold_for(room: Room, gang: Gang, off: Any = None) -> Any:
        holds.append(gang.key)
        return room_hold(room, gang, off)

    with patch.object(Room, "hold_for", hold_for):
        while not warm_slice(world, 2):
            pass
    assert holds == ["default/big0"]
    runs = world.arbiter.line.walk._runs
    assert runs._end == [6] * 6 and not runs._open
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0


def test_the_runs_kept_for_the_part_a_new_order_shares_with_the_last() -> None:
    """The line handed again as a new list (a claim came or went): the ends of the runs wholly
    inside the part it shares with the last order from the front are kept."""
    a, b, c = (Gang(k, 0, 0.0, (), 1) for k in "abc")
    runs = AlikeRuns()
    first = [a, a, a, b, b]
    assert runs.end(first, 0, lambda x, y: x is y, 5) == 3
    assert runs.end(first, 3, lambda x, y: x is y, 5) == 5
    looked: list[tuple[Gang, Gang]] = []

    def alike(x: Gang, y: Gang) -> bool:
        looked.append((x, y))
        return x is y

    second = [a, a, a, b, c]
    assert runs.end(second, 0, alike, 5) == 3 and not looked  # kept: wholly before the change
    assert runs.end(second, 3, alike, 5) == 4 and looked  # reached the change: looked again
