"""A gang turned away is answered again from its verdict while nothing it weighed changed
(app/runtime/answers.py), and decided afresh after any change that may move the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.admission import DenyReason, FilterReason, Verdict
from app.core.contention import Contest
from app.core.groups import GroupSpec
from app.runtime.waiting_room import SettleOutcome
from tests.unit.builders import node, pod, podgroup
from tests.unit.test_arbiter import World


class Decisions:
    """Counts the line's contests the arbiter gathers: one per decision that packs the line."""

    def __init__(self, world: World) -> None:
        self.count = 0
        line = world.arbiter.line
        contest = line.contest

        def counted(exclude: str) -> Contest:
            self.count += 1
            return contest(exclude)

        line.contest = counted  # type: ignore[method-assign]


def group(name: str, min_member: int, minute: int = 0) -> dict[str, Any]:
    """A PodGroup as the API server has it: created at a time (the line's order reads it;
    without one a gang's creation would be \"now\" at every call, never the same gang twice)."""
    raw = podgroup(name, min_member)
    raw["metadata"]["creationTimestamp"] = f"2027-01-15T08:{minute:02d}:00Z"
    return raw


def gang(world: World, name: str, members: int, cpu: str, minute: int) -> GroupSpec:
    world.state.apply_podgroup(group(name, members, minute))
    for i in range(members):
        world.state.apply_pod(pod(f"{name}-{i}", group=name, cpu=cpu))
    return GroupSpec(f"default/{name}", members)


def waiting_world() -> tuple[World, GroupSpec, Decisions]:
    """Gang a holds the cluster, c and b wait behind it, each turned away once."""
    world = World()
    a = gang(world, "a", 3, "2500m", 0)
    b = gang(world, "b", 3, "2500m", 1)
    c = gang(world, "c", 2, "2", 2)
    assert world.filter(a, "a-0").reason == FilterReason.CLAIMED
    assert world.filter(c, "c-0").reason == FilterReason.WAITING_BEHIND
    decisions = Decisions(world)
    assert world.filter(b, "b-0").reason == FilterReason.WAITING_BEHIND
    assert decisions.count == 1
    return world, b, decisions


def test_a_retry_with_nothing_changed_is_answered_without_packing_the_line() -> None:
    world, b, decisions = waiting_world()
    first = world.filter(b, "b-0")
    again = [world.filter(b, f"b-{i}") for i in range(3)]
    assert decisions.count == 1
    assert world.arbiter.answers.reused == 4
    assert all(v == first for v in again)
    assert first.reason == FilterReason.WAITING_BEHIND and "behind default/a" in first.message
    # Time alone that ages nobody changes nothing either.
    world.clock.now += 30
    assert world.filter(b, "b-1") == first
    assert decisions.count == 1


def _pod_gone(world: World) -> None:
    world.state.delete_pod("default", "a-2")


def _node_changed(world: World) -> None:
    world.state.apply_node(node("n0", cpu="8"))


def _node_added(world: World) -> None:
    world.state.apply_node(node("n-new"))


def _gang_admitted(world: World) -> None:
    gang(world, "d", 1, "100m", 3)
    assert world.filter(GroupSpec("default/d", 1), "d-0").reason == FilterReason.CLAIMED


def _gang_released(world: World) -> None:
    world.arbiter.on_settled("default/a", SettleOutcome.RELEASED)


def _line_gang_changed(world: World) -> None:
    world.state.apply_podgroup(group("c", 1, 0))  # now older than b: ahead of it


def _line_gang_denied(world: World) -> None:
    world.admission.deny("default/c", DenyReason.CAPACITY, "a member found no node")


def _own_member_added(world: World) -> None:
    world.state.apply_pod(pod("b-3", group="b", cpu="2500m"))


def _placed_elsewhere(world: World) -> None:
    world.state.apply_pod(pod("x", cpu="1", node="n1", phase="Running"))


@pytest.mark.parametrize(
    "change",
    [
        _pod_gone,
        _node_changed,
        _node_added,
        _gang_admitted,
        _gang_released,
        _line_gang_changed,
        _line_gang_denied,
        _own_member_added,
        _placed_elsewhere,
    ],
)
def test_any_relevant_change_has_the_gang_decided_afresh(change: Callable[[World], None]) -> None:
    world, b, decisions = waiting_world()
    change(world)
    before = decisions.count
    verdict = world.filter(b, "b-0")
    assert decisions.count == before + 1
    if not verdict.admitted:
        # The verdict kept is the one a fresh decision gives.
        world.arbiter.answers.forget()
        assert world.filter(b, "b-0") == verdict


def test_a_gang_in_line_ageing_ends_the_verdict() -> None:
    """b, ahead in line, ages: it holds back the room c waited for, and c hears so at once."""
    world = World()
    for i in range(3):
        world.state.apply_pod(pod(f"r{i}", cpu="2", node=f"n{i}", phase="Running"))
    for i in range(2):
        world.state.apply_pod(pod(f"x{i}", cpu="2", node=f"n{i}", phase="Running"))
    b = gang(world, "b", 3, "3", 0)
    d = gang(world, "d", 2, "2", 1)
    c = gang(world, "c", 2, "2", 2)
    assert world.filter(d, "d-0").reason == FilterReason.INSUFFICIENT_CAPACITY
    assert world.filter(b, "b-0").reason == FilterReason.INSUFFICIENT_CAPACITY
    for i in range(2):
        world.state.delete_pod("default", f"x{i}")
    decisions = Decisions(world)
    before = world.filter(c, "c-0")  # d, ahead, fits: it takes the room first
    assert "waiting behind default/d" in before.message
    world.clock.now += 59.9
    assert world.filter(c, "c-0") == before
    assert decisions.count == 1
    world.clock.now += 0.1  # everyone in line joined at 100: aged now
    after = world.filter(c, "c-0")
    assert decisions.count == 2
    assert "waiting behind default/b" in after.message and "has waited longest" in after.message


def test_a_denial_of_a_gang_in_line_ends_the_verdict() -> None:
    world, b, decisions = waiting_world()
    _line_gang_denied(world)
    world.filter(b, "b-0")
    assert decisions.count == 2
    assert world.filter(b, "b-0").reason == FilterReason.WAITING_BEHIND
    assert decisions.count == 2


_GANGS = ("g0", "g1", "g2", "g3")


@st.composite
def _steps(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    kinds = st.sampled_from(
        [
            "filter",
            "filter",
            "filter",
            "place",
            "delete",
            "node",
            "tick",
            "deny",
            "forget",
            "podgroup",
            "release",
            "settle",
        ]
    )
    return draw(st.lists(st.tuples(kinds, st.integers(0, 3), st.integers(0, 3)), max_size=30))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(["1", "2", "3500m"])), min_size=4, max_size=4
    ),
    steps=_steps(),
)
def test_a_verdict_reused_is_always_the_one_a_fresh_decision_gives(
    sizes: list[tuple[int, str]], steps: list[tuple[str, int, int]]
) -> None:
    world = World(nodes=3)
    specs = {
        name: gang(world, name, n, cpu, minute)
        for minute, (name, (n, cpu)) in enumerate(zip(_GANGS, sizes, strict=True))
    }
    placed = 0
    for kind, i, j in steps:
        name = _GANGS[i]
        spec = specs[name]
        if kind == "filter":
            _compare(world, spec, f"{name}-{j % spec.min_member}")
        elif kind == "place":
            placed += 1
            world.state.apply_pod(pod(f"run-{placed}", cpu="1", node=f"n{j % 3}", phase="Running"))
        elif kind == "delete" and placed:
            world.state.delete_pod("default", f"run-{1 + j % placed}")
        elif kind == "node":
            world.state.apply_node(node(f"n{j % 3}", cpu=str(2 + j)))
        elif kind == "tick":
            world.clock.now += j * 20  # the arbiter's aging: 60 s
        elif kind == "deny":
            world.admission.deny(spec.key, DenyReason.CAPACITY, "test")
        elif kind == "forget":
            world.admission.forget(spec.key)
        elif kind == "podgroup":
            world.state.apply_podgroup(group(name, 1 + j % 3, i))
        elif kind == "release" and spec.key in world.arbiter.claims:
            world.arbiter.on_settled(spec.key, SettleOutcome.RELEASED)
        elif kind == "settle" and spec.key in world.arbiter.claims:
            world.arbiter.on_settled(spec.key, SettleOutcome.BOUND)
        for other in specs.values():
            _compare(world, other, f"{other.key.split('/')[1]}-0")


def _compare(world: World, spec: GroupSpec, member: str) -> None:
    """The member's verdict, and if it was a refusal, the same from a decision made afresh."""
    if spec.key in world.admission.denied or f"default/{member}" not in world.state.pods:
        return
    verdict: Verdict = world.filter(spec, member)
    if verdict.admitted:
        return
    world.arbiter.answers.forget()
    fresh: Any = world.filter(spec, member)
    assert fresh == verdict, (spec.key, verdict, fresh)
