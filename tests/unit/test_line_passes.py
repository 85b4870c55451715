"""The warm-up's passes over the whole line done in slices (issue 46): the line's order
(app/core/line_order.py) and its queues' verdicts (app/runtime/queues/verdicts.py) are
exactly those done at once, changes arriving between slices; and the warm-up lets others
run between their slices (app/runtime/line_warmup.py)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Gang, order_line
from app.core.groups import GroupRef
from app.core.line_order import next_to_age, order_steps
from app.runtime import line_warmup
from app.runtime.line_gangs import Waiting
from app.runtime.queues.tally import QueueTally
from app.runtime.queues.verdicts import admitted
from tests.unit.test_queue_book import World as QueueWorld
from tests.unit.test_queue_tally import (
    GROUPS,
    _holders,
    _line_of,
    _pod,
    applied,
    apply,
    operations,
    queue_cluster,
    reference_assess,
)

_GANGS = st.lists(
    st.tuples(
        st.integers(0, 2),  # priority
        st.one_of(st.none(), st.sampled_from([0.0, 10.0, 50.0, 90.0])),  # waiting since
        st.sampled_from([0.0, 0.25, 0.5]),  # share
        st.sampled_from([1.0, 2.0, 3.0]),  # created
    ),
    max_size=40,
)


def _gangs(shapes: list[tuple[int, float | None, float, float]]) -> list[Gang]:
    # Keys alike in places: the order must not lean on them being unique.
    return [
        Gang(f"default/g{i % 7}", priority, created, (), 1, since, share)
        for i, (priority, since, share, created) in enumerate(shapes)
    ]


@settings(max_examples=300, deadline=None)
@given(shapes=_GANGS, now=st.sampled_from([60.0, 100.0, 150.0]), most=st.integers(1, 9))
def test_the_line_ordered_in_slices_is_the_line_ordered_at_once(
    shapes: list[tuple[int, float | None, float, float]], now: float, most: int
) -> None:
    gangs = _gangs(shapes)
    steps = list(order_steps(gangs, now, 60.0, most))
    order = steps[-1]
    assert order is not None and all(step is None for step in steps[:-1])
    expected = order_line(gangs, now, 60.0)
    assert [id(g) for g in order] == [id(g) for g in expected]  # the very gangs, in order
    # A slice of keying and sorting per `most` gangs, and of merging when there are runs.
    runs = math.ceil(len(gangs) / most)
    assert len(steps) - 1 >= runs + (len(gangs) // most if runs > 1 else 0)
    # The gang that ages next, found a part at a time, is the one found at once.
    young = [g for g in gangs if g.waiting_since is not None and not g.aged(now, 60.0)]
    first = min(young, key=lambda g: g.waiting_since or 0.0, default=None)
    found = None
    for start in range(0, len(gangs), most):
        found = next_to_age(gangs[start : start + most], now, 60.0, found)
    assert found is first and next_to_age(gangs, now, 60.0) is first


_PASSES = st.tuples(
    st.just("pass"),
    st.integers(1, 3),  # gangs judged a slice
    st.integers(0, 3),  # slices before the change
    operations,  # changes arriving between two slices
    st.booleans(),  # the claims counted
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(operations.map(tuple), _PASSES), min_size=2, max_size=10))
def test_the_verdicts_judged_in_slices_are_those_judged_at_once(
    rounds: list[tuple[Any, ...]],
) -> None:
    """The pass yields between slices, hands out what assess() gives at its start, and the
    verdict it keeps is only used while it is still right (changes come mid-pass)."""
    state, book = queue_cluster()
    tally = QueueTally(state)
    line = _line_of(state)
    for ops in rounds:
        if ops[0] != "pass":
            line = applied(state, ops, line)
            continue
        _, most, before, changes, claimed = ops
        holders = _holders(state) if claimed else []
        expected = reference_assess(book, tally, None, "", line, holders)[2]
        steps = book.admitted_steps(line, holders, most)
        taken = [step for _, step in zip(range(before), steps, strict=False)]
        for op in changes:
            apply(state, op)
        taken += list(steps)
        allowed = taken[-1]
        assert allowed is not None and all(step is None for step in taken[:-1])
        assert [g.key for g in allowed] == expected
        assert len(taken) in (1, max(1, math.ceil(len(line) / most)))  # kept, or sliced
        # What an admission reads now: the kept verdict only if still right.
        now = book.assess(None, "", line, holders)
        shown = reference_assess(book, tally, None, "", line, holders)
        assert [g.key for g in now.line] == shown[2]
        fresh = admitted(line, now.views, now.capacity, book.overcommit)
        assert [g.key for g in fresh] == shown[2]


def test_the_verdict_pass_yields_after_every_slice_but_the_last_and_is_kept() -> None:
    state, book = queue_cluster()
    for i, group in enumerate(GROUPS):
        extra = {"cpu": 1, "second": i, "priority": 0, "deleting": False}
        state.apply_pod(_pod(f"p{i}", group, "", "Pending", **extra))
    line = _line_of(state)
    assert len(line) == 5
    *slices, allowed = book.admitted_steps(line, [], 2)
    assert slices == [None, None] and allowed is not None
    assert [g.key for g in allowed] == reference_assess(
        book, QueueTally(state), None, "", line, []
    )[2]
    again = list(book.admitted_steps(line, [], 2))
    assert len(again) == 1 and again[0] is allowed  # kept: judged no more
    assert list(book.admitted_steps(list(line), [], 2))[-1] == allowed  # a copy: judged again


def _queued_world(gangs: int) -> QueueWorld:
    world = QueueWorld()
    world.book.replace([{"metadata": {"name": "team-a"}, "spec": {"weight": 1}}])
    for i in range(gangs):
        spec = world.gang(f"a{i}", "team-a")
        world.arbiter.waiting[spec.key] = Waiting(GroupRef("default", f"a{i}"), 0.0)
    return world


async def test_the_warm_up_lets_others_run_between_the_passes_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six gangs in line, the verdicts and the order 2 gangs a slice: another task runs
    between the verdict pass's slices and between the order's, and the first admission
    after the warm-up finds the verdicts kept (nothing judged again)."""
    monkeypatch.setattr(line_warmup, "_PASS_SLICE", 2)
    world = _queued_world(6)
    line, book = world.arbiter.line, world.book
    phases: list[str] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            if line._pairs is not None and book.verdicts._allowed is None:
                phases.append("judging")
            elif book.verdicts._allowed is not None and line.walk._ordered is None:
                phases.append("ordering")
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await world.arbiter.warmup.warm(most=1)
    done.set()
    await watcher
    assert phases.count("judging") >= 2 and phases.count("ordering") >= 3
    assert line.walk.length == 6
    kept, ordered = book.verdicts._allowed, line.walk._ordered
    fresh = world.gang("fresh", "team-a")
    world.filter(fresh, "fresh-0")  # its queue check judges nothing of the line again
    assert book.verdicts._allowed is kept and kept is not None and len(kept[2]) == 6
    assert line.walk._ordered is ordered and ordered is not None
