"""The line's walk kept between decisions (app/runtime/line_walk.py): a fresh gang packs into
the room it left, redone only from the first gang a change reaches, and every decision is the
one a walk of the whole line gives."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.core.contention import Contest, Decision, Gang, decide
from app.core.groups import GroupRef, GroupSpec
from app.core.packing import Bin, Demand
from app.runtime.line_gangs import Waiting
from app.runtime.line_pass import LineAt
from app.runtime.line_walk import LineWalk
from tests.unit.builders import node, pod, podgroup
from tests.unit.test_arbiter import World

_AGING = 60.0


def gang(
    world: World, name: str, members: int, cpu: str, minute: int, odd: int = 0, spare: int = 0
) -> GroupSpec:
    """`members` (minMember) and `spare` more pods; every other one asks `odd` CPU more."""
    raw = podgroup(name, members)
    raw["metadata"]["creationTimestamp"] = f"2027-01-15T08:{minute:02d}:00Z"
    world.state.apply_podgroup(raw)
    for i in range(members + spare):
        mine = str(int(cpu) + odd * (i % 2))
        world.state.apply_pod(pod(f"{name}-{i}", group=name, cpu=mine))
    return GroupSpec(f"default/{name}", members)


def join(world: World, name: str) -> None:
    world.arbiter.waiting[f"default/{name}"] = Waiting(GroupRef("default", name), world.clock.now)


def both(world: World, fresh: GroupSpec) -> tuple[Decision, Decision, int]:
    """The gang's decision (a fresh one, or one in line) with the kept walk, one walking the
    whole line, and how many gangs the kept walk walked again."""
    line = world.arbiter.line
    name = fresh.key.split("/", 1)[1]
    candidate: Gang = line.gang(world.state.group_spec(GroupRef("default", name)), None)
    contest = line.contest(exclude=fresh.key)
    now = world.clock.now
    walked = line.walked(contest, now, _AGING, candidate)
    with_walk = decide(candidate, replace(contest, walked=walked), now, _AGING)
    without = decide(candidate, replace(contest, walked=None), now, _AGING)
    return with_walk, without, line.walk.walked_again


def warm_slice(world: World, most: int) -> bool:
    """One slice of the warm-up's walk (app/runtime/line_warmup.py) over the line as it is."""
    line = world.arbiter.line
    c = line.contest(exclude="")
    return line.walk.warm(LineAt.of(c, world.clock.now, _AGING), most)


def test_only_the_gangs_a_change_reaches_are_walked_again() -> None:
    world = World(nodes=6, cpu="8")
    for i in range(4):  # each fills one node from the first: n0, n1, n2, n3
        gang(world, f"w{i}", 2, "4", i)
        join(world, f"w{i}")
    fresh = gang(world, "fresh", 2, "4", 30)
    first, whole, again = both(world, fresh)
    assert first == whole and again == 4
    assert first.plan == {"default/fresh-0": "n4", "default/fresh-1": "n4"}
    # Nothing changed: nothing walked again.
    assert both(world, fresh)[2] == 0
    # A pod placed on n5, past every gang's reach: nothing walked again, the room is n5's less.
    world.state.apply_pod(pod("x", cpu="6", node="n5", phase="Running"))
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0
    # A pod placed on n2: the gang that went there (w2) and those behind it walked again.
    world.state.apply_pod(pod("y", cpu="6", node="n2", phase="Running"))
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 2
    # A gang leaves the line: walked again from its place.
    del world.arbiter.waiting["default/w3"]
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0  # w3 was last: the walk is a prefix of the old


@st.composite
def _ops(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    kind = st.sampled_from(
        ["run", "run", "end", "join", "join", "leave", "node", "tick", "claim", "warm", "learn"]
    )
    return draw(st.lists(st.tuples(kind, st.integers(0, 5), st.integers(1, 4)), max_size=30))


@settings(max_examples=300, deadline=None)
@given(
    gangs=st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 2), st.integers(0, 1)),
        min_size=1,
        max_size=8,
    ),
    fresh_shape=st.tuples(st.integers(1, 3), st.integers(1, 5)),
    ops=_ops(),
)
# Found by this test: a gang kept in the walk that fit nowhere and aged since (no other
# change) went on taking nothing, where it holds room back now.
@example(
    gangs=[(3, 4, 0, 0), (2, 4, 1, 0), (1, 1, 0, 0), (1, 1, 0, 0), (3, 4, 1, 1)],
    fresh_shape=(1, 1),
    ops=[
        ("run", 0, 1),
        ("run", 1, 1),
        ("join", 0, 1),
        ("join", 1, 1),
        ("join", 4, 1),
        ("tick", 0, 3),
    ],
)
def test_a_fresh_gang_is_decided_as_a_walk_of_the_whole_line_decides(
    gangs: list[tuple[int, int, int, int]],
    fresh_shape: tuple[int, int],
    ops: list[tuple[str, int, int]],
) -> None:
    world = World(nodes=6, cpu="8")
    names = [f"w{i}" for i in range(len(gangs))]
    for i, (members, cpu, odd, spare) in enumerate(gangs):
        gang(world, names[i], members, str(cpu), i, odd, spare)
    fresh = gang(world, "fresh", fresh_shape[0], str(fresh_shape[1]), 59)
    running = 0
    for kind, a, b in ops:
        name = names[a % len(names)]
        key = f"default/{name}"
        if kind == "run":
            running += 1
            raw: dict[str, Any] = pod(f"r{running}", cpu=str(b), node=f"n{a}", phase="Running")
            world.state.apply_pod(raw)
        elif kind == "end" and running:
            world.state.delete_pod("default", f"r{1 + (a * 7 + b) % running}")
        elif kind == "join" and key not in world.arbiter.claims:
            join(world, name)
        elif kind == "leave":
            world.arbiter.waiting.pop(key, None)
        elif kind == "node":
            world.state.apply_node(node(f"n{a}", cpu=str(4 + 2 * b)))
        elif kind == "tick":
            world.clock.now += 25 * b  # ages gangs in line (aging 60 s)
        elif kind == "claim" and key not in world.arbiter.claims:
            world.filter(GroupSpec(key, gangs[a % len(names)][0]), f"{name}-0")
        elif kind == "warm":  # a slice of the warm-up: `b` more gangs walked ahead
            warm_slice(world, b)
        elif kind == "learn":
            world.arbiter.line.learn(b)
        if kind in ("warm", "learn") and a % 2:
            continue  # the next change comes before a decision: the walk warmed goes stale
        with_walk, whole, _ = both(world, fresh)
        assert with_walk == whole, (kind, a, b)


def test_a_gang_whose_members_differ_is_walked_again_after_a_change_anywhere() -> None:
    """Members of different shapes go largest first by their share of the whole cluster's
    free capacity: a node far past where they went can change their order, so their place."""
    a = Demand("w0-a", {"cpu": 2, "memory": 1})
    b = Demand("w0-b", {"cpu": 1, "memory": 2})
    w0 = Gang("w0", 0, 1.0, (a, b), 2, waiting_since=100.0)
    fresh = Gang("fresh", 0, 2.0, (Demand("f", {"cpu": 1}),), 1)
    free = [
        Bin("n0", {"cpu": 2, "memory": 2}),
        Bin("n1", {"cpu": 10, "memory": 10}),
        Bin("n2", {"cpu": 1, "memory": 1}),
    ]
    positions = {"n0": 0, "n1": 1, "n2": 2}
    walk = LineWalk()

    def decided(free: list[Bin]) -> tuple[Decision, Decision]:
        line = [w0]
        walked = walk.walked(LineAt(line, free, (), positions, 100.0, _AGING))
        contest = Contest(free, (), line, positions=positions)
        return (
            decide(fresh, replace(contest, walked=walked), 100.0, _AGING),
            decide(fresh, contest, 100.0, _AGING),
        )

    # cpu and memory alike tight: a first, onto n0; the fresh member's cpu is on n1.
    with_walk, whole = decided(free)
    assert with_walk == whole and with_walk.plan == {"f": "n1"}
    # n2 grows cpu: memory is the tight one, b goes first onto n0 and leaves it a cpu.
    free = [*free[:2], Bin("n2", {"cpu": 100, "memory": 1})]
    with_walk, whole = decided(free)
    assert with_walk == whole and with_walk.plan == {"f": "n0"}


def test_a_gang_placed_without_one_of_its_members_read_every_node() -> None:
    """A member that fit nowhere read every node: room on any of them may take it next time."""
    big = Demand("w0-a", {"cpu": 5})
    small = (Demand("w0-b", {"cpu": 1}), Demand("w0-c", {"cpu": 1}))
    w0 = Gang("w0", 0, 1.0, (big, *small), 2, waiting_since=100.0)
    fresh = Gang("fresh", 0, 2.0, (Demand("f", {"cpu": 3}),), 1)
    positions = {"n0": 0, "n1": 1, "n2": 2}
    walk = LineWalk()

    def decided(free: list[Bin]) -> tuple[Decision, Decision]:
        walked = walk.walked(LineAt([w0], free, (), positions, 100.0, _AGING))
        contest = Contest(free, (), [w0], positions=positions)
        return (
            decide(fresh, replace(contest, walked=walked), 100.0, _AGING),
            decide(fresh, contest, 100.0, _AGING),
        )

    free = [Bin("n0", {"cpu": 2}), Bin("n1", {"cpu": 1}), Bin("n2", {"cpu": 4})]
    with_walk, whole = decided(free)  # the small ones on n0, the big one nowhere
    assert with_walk == whole and with_walk.plan == {"f": "n2"}
    free = [*free[:2], Bin("n2", {"cpu": 8})]  # now the big one goes to n2, and a small one
    with_walk, whole = decided(free)
    assert with_walk == whole and with_walk.plan == {"f": "n2"}
    free = [*free[:2], Bin("n2", {"cpu": 7})]
    with_walk, whole = decided(free)
    assert with_walk == whole


def test_an_aged_gang_that_does_not_fit_has_the_decision_walk_the_line() -> None:
    """An aged gang ahead holds back what it can use: the fresh gang waits (no walk is kept)."""
    world = World(nodes=3, cpu="8")
    for i in range(3):
        world.state.apply_pod(pod(f"r{i}", cpu="4", node=f"n{i}", phase="Running"))
    gang(world, "big", 3, "6", 0)
    join(world, "big")
    fresh = gang(world, "fresh", 1, "3", 59)
    world.clock.now += _AGING  # big has aged
    with_walk, whole, _ = both(world, fresh)
    assert with_walk == whole
    assert "waiting behind default/big" in with_walk.message


def _walked(walk: LineWalk, line: list[Gang], free: list[Bin], fresh: Gang) -> list[Decision]:
    positions = {b.name: i for i, b in enumerate(free)}
    walked = walk.walked(LineAt(line, free, (), positions, 100.0, _AGING))
    contest = Contest(free, (), line, positions=positions)
    return [
        decide(fresh, replace(contest, walked=walked), 100.0, _AGING),
        decide(fresh, contest, 100.0, _AGING),
    ]


def _one(key: str, cpu: int, created: float, members: int = 1) -> Gang:
    demands = tuple(Demand(f"{key}-{i}", {"cpu": cpu}) for i in range(members))
    return Gang(key, 0, created, demands, members, waiting_since=99.0)


def test_the_gang_named_ahead_is_the_first_that_took_room() -> None:
    w0, w1 = _one("w0", 6, 1.0), _one("w1", 4, 2.0, members=2)  # w0 fits nowhere
    free = [Bin("n0", {"cpu": 4}), Bin("n1", {"cpu": 4})]
    with_walk, whole = _walked(LineWalk(), [w0, w1], free, _one("fresh", 2, 3.0))
    assert with_walk == whole and with_walk.behind == ("w1", 0)


def test_a_gang_that_did_not_fit_may_fit_after_a_change_past_everyone_else() -> None:
    w0, w1 = _one("w0", 5, 1.0), _one("w1", 4, 2.0)
    fresh = _one("fresh", 2, 3.0)
    walk = LineWalk()
    free = [Bin("n0", {"cpu": 4}), Bin("n1", {"cpu": 1}), Bin("n2", {"cpu": 2})]
    with_walk, whole = _walked(walk, [w0, w1], free, fresh)
    assert with_walk == whole and with_walk.plan == {"fresh-0": "n2"}
    free = [*free[:2], Bin("n2", {"cpu": 6})]  # w0 fits there now, before the fresh gang
    with_walk, whole = _walked(walk, [w0, w1], free, fresh)
    assert with_walk == whole and not with_walk.plan


def five_in_line() -> tuple[World, GroupSpec]:
    """Six nodes of 8 CPU, five gangs of 2 x 4 CPU in line, a fresh gang of 2 x 4 CPU."""
    world = World(nodes=6, cpu="8")
    for i in range(5):
        gang(world, f"w{i}", 2, "4", i)
        join(world, f"w{i}")
    return world, gang(world, "fresh", 2, "4", 30)


def test_a_line_warmed_in_slices_leaves_the_fresh_gang_nothing_to_walk() -> None:
    world, fresh = five_in_line()
    line = world.arbiter.line
    assert not line.learn(2) and not line.learn(2) and line.learn(2)  # 5 gangs, 2 a slice
    slices = 1
    while not warm_slice(world, 2):
        slices += 1
    assert slices == 3 and line.walk.length == 5
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0


async def test_the_warm_up_walks_the_line_once_and_again_only_after_a_change() -> None:
    world, fresh = five_in_line()
    warmup = world.arbiter.warmup
    await warmup.warm(most=2)
    line = world.arbiter.line
    assert line.walk.length == 5 and set(line._line._known) == {f"default/w{i}" for i in range(5)}
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0
    # Nothing changed: nothing done. A gang's pod changed: it is built again, ahead.
    await warmup.warm(most=2)
    world.state.apply_pod(pod("w4-0", group="w4", cpu="3"))
    await warmup.warm(most=2)
    demands = line._line._known["default/w4"].gang.demands
    assert sorted(d.requests["cpu"] for d in demands) == [3000, 4000]
    with_walk, whole, _ = both(world, fresh)
    assert with_walk == whole


async def test_after_a_node_is_cordoned_the_warm_up_walks_the_line_again() -> None:
    """A cordon moves every free bin: the warm-up walks the whole line again, in slices, and
    the fresh gang's admission then walks nothing again and decides as a whole walk does."""
    world, fresh = five_in_line()
    await world.arbiter.warmup.warm(most=2)
    raw = node("n0", cpu="8")
    raw["spec"]["unschedulable"] = True
    world.state.apply_node(raw)
    await world.arbiter.warmup.warm(most=2)
    line = world.arbiter.line
    assert line.walk.walked_again == 1  # the last slice of the walk redone from the start
    with_walk, whole, again = both(world, fresh)
    assert with_walk == whole and again == 0


def test_after_a_cordon_the_free_bins_last_slice_is_a_step_of_the_loop_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up yields the event loop after the free bins' last slice, before the line's
    gangs and walk (at 5,000 nodes and 10,000 gangs, that slice and the walk's first held it
    12-17 ms as one step)."""
    world, _ = five_in_line()
    warmup, state, line = world.arbiter.warmup, world.state, world.arbiter.line
    steps: list[str] = []

    def noted(name: str, call: Any) -> Any:
        def step(*args: Any) -> Any:
            steps.append(name)
            return call(*args)

        return step

    async def yielded() -> None:  # one step of the loop ends, as a bare yield
        await asyncio.sleep(0)

    monkeypatch.setattr("app.runtime.line_warmup.let_others_run", yielded)
    monkeypatch.setattr(state, "warm_room", noted("bins", state.warm_room))
    monkeypatch.setattr(line, "learn", noted("gangs", line.learn))
    monkeypatch.setattr(line.walk, "warm", noted("walk", line.walk.warm))
    raw = node("n0", cpu="8")
    raw["spec"]["unschedulable"] = True
    state.apply_node(raw)
    warming = warmup.warm(most=2)
    with pytest.raises(StopIteration):
        while True:  # each yield in it ends a step of the loop
            warming.send(None)
            steps.append("|")
    last_bins = len(steps) - steps[::-1].index("bins") - 1
    assert steps[last_bins + 1] == "|" and "walk" in steps[last_bins:]
    assert line.walk.length == 5
