"""The line keeps the gangs it built between calls: always what a fresh build would give."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.base.metrics import Metrics
from app.core.admission import Admission, DenyReason
from app.core.groups import GroupRef
from app.core.state import ClusterState
from app.core.topology.sources import KUEUE_REQUIRED
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.gate import PermitGate
from app.runtime.line import Line
from app.runtime.line_gangs import Waiting
from app.runtime.queues.book import QueueBook
from app.runtime.revision import Revision
from tests.unit.builders import node, pod, podgroup
from tests.unit.fakes import Clock, RecordingBinder

RACK = "example.com/rack"
GROUPS = [f"g{i}" for i in range(6)]
CREATED = "2026-11-28T00:00:00Z"
LIGHT = "g5"  # a label-only group: its minimum is in its pods' labels and its line entry's ref


def racked_node(i: int, cpu: str = "4") -> dict[str, Any]:
    raw = node(f"n{i}", cpu=cpu)
    raw["metadata"]["labels"][RACK] = f"r{i % 2}"
    return raw


def member(rng: random.Random, group: str, i: int, version: int) -> dict[str, Any]:
    light = group == LIGHT
    raw = pod(
        f"{group}-{i}",
        group=None if light else group,
        light=(group, str(rng.randint(1, 3))) if light else None,
        cpu=rng.choice(["500m", "1", "3"]),
        node=rng.choice(["", "", "n0", "n1"]),
        phase=rng.choice(["Pending", "Pending", "Running", "Failed"]),
    )
    raw["metadata"]["resourceVersion"] = str(version)
    raw["metadata"]["creationTimestamp"] = CREATED
    raw["spec"]["priority"] = rng.choice([0, 0, 10])
    if group == "g0":  # a gang that must fit in one rack
        raw["metadata"]["annotations"] = {KUEUE_REQUIRED: RACK}
    return raw


def group_object(group: str, min_member: int, queue: str) -> dict[str, Any]:
    raw = podgroup(group, min_member)
    raw["metadata"]["creationTimestamp"] = CREATED
    raw["metadata"]["annotations"] = {"scheduling.volcano.sh/queue-name": queue}
    return raw


def _by_key(gangs: list[Any]) -> list[Any]:
    """The line in any order (gangs() promises none): compared by group key."""
    return sorted(gangs, key=lambda g: g.key)


def arbiter_on(nodes: int, queues: bool = False) -> tuple[ClusterState, Admission, Arbiter]:
    """An arbiter over a new state of `nodes` nodes in two racks (its line is what is tested).

    queues: Volcano Queues a and b exist, so the gangs in line carry their DRF share.
    """
    state = ClusterState()
    state.replace_nodes([racked_node(i) for i in range(nodes)])
    admission = Admission(3)
    book = QueueBook(state) if queues else None
    if book is not None:
        book.replace([{"metadata": {"name": q}, "spec": {"weight": 1}} for q in ("a", "b")])
    return (
        state,
        admission,
        Arbiter(
            state,
            admission,
            PermitGate(state, admission, RecordingBinder(), Metrics()),
            lambda spec: 30.0,
            ArbiterPeers(queues=book),
            ArbiterSettings(levels=("kubernetes.io/hostname", RACK), clock=Clock(100.0)),
        ),
    )


@pytest.mark.parametrize("queues", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_gangs_in_line_are_those_a_fresh_build_gives_after_any_change(
    seed: int, queues: bool
) -> None:
    rng = random.Random(seed)
    state, admission, arbiter = arbiter_on(4, queues)
    line = arbiter.line
    version = 1

    def change() -> None:
        nonlocal version
        version += 1
        group = rng.choice(GROUPS)
        i = rng.randrange(4)
        step = rng.randrange(9)
        if step < 3:
            state.apply_pod(member(rng, group, i, version))
        elif step == 3:
            state.delete_pod("default", f"{group}-{i}")
        elif step == 4:
            state.apply_podgroup(group_object(group, rng.randint(1, 4), rng.choice("ab")))
        elif step == 5:
            state.delete_podgroup("default", group)
        elif step == 6:
            minimum = rng.randint(1, 3) if group == LIGHT else None
            ref = GroupRef("default", group, min_available=minimum)
            line.waiting[ref.key] = Waiting(ref, rng.random())
        elif step == 7:
            line.leave(f"default/{group}")
        elif rng.random() < 0.5:
            admission.deny(f"default/{group}", DenyReason.TIMEOUT, "no room")
        else:
            state.replace_nodes([racked_node(n, rng.choice(["2", "4"])) for n in range(4)])

    for _ in range(150):
        change()
        if rng.random() < 0.1:  # the entries replaced at once, some of them gone
            line.waiting = {k: v for k, v in line.waiting.items() if rng.random() < 0.7}
        if rng.random() < 0.3:
            continue  # several changes between two reads
        fresh = Line(state, admission, arbiter.topology, line.queues, Revision(), arbiter.ledger)
        fresh.waiting = dict(line.waiting)
        got = line.gangs("")
        assert _by_key(got) == _by_key(fresh.gangs("")), f"seed {seed}"
        assert line.waiting == fresh.waiting
        if got:
            assert line.gangs("") is got  # nothing changed: the very same list
            again = line.gangs(got[0].key)
            assert [g.key for g in again] == [g.key for g in got[1:]]


def test_a_gang_in_line_is_rebuilt_only_when_its_group_changed() -> None:
    state, _, arbiter = arbiter_on(2)
    rng = random.Random(1)
    for group in ("a", "b"):
        state.apply_podgroup(group_object(group, 2, "a"))
        for i in range(2):
            raw = member(rng, group, i, 1)
            raw["spec"]["nodeName"] = None
            raw["status"]["phase"] = "Pending"
            state.apply_pod(raw)
        arbiter.line.join(f"default/{group}", GroupRef("default", group), 5.0)
    first = {g.key: g for g in arbiter.line.gangs("")}
    assert set(first) == {"default/a", "default/b"}
    state.delete_pod("default", "b-1")
    state.apply_pod(member(rng, "b", 1, 2))
    second = {g.key: g for g in arbiter.line.gangs("")}
    assert second["default/a"] is first["default/a"]
    assert second["default/b"] is not first["default/b"]


def test_a_gang_in_line_is_rebuilt_when_its_line_entry_names_it_otherwise() -> None:
    """A label-only group's minimum is in the entry's ref: a new ref is a new gang."""
    state, _, arbiter = arbiter_on(2)
    for i in range(3):
        raw = pod(f"{LIGHT}-{i}", light=(LIGHT, "3"))
        raw["metadata"]["creationTimestamp"] = CREATED
        state.apply_pod(raw)
    key = f"default/{LIGHT}"
    arbiter.line.waiting[key] = Waiting(GroupRef("default", LIGHT, min_available=3), 5.0)
    assert [g.need for g in arbiter.line.gangs("")] == [3]
    arbiter.line.waiting[key] = Waiting(GroupRef("default", LIGHT, min_available=2), 5.0)
    assert [g.need for g in arbiter.line.gangs("")] == [2]
