"""The queues' tally kept between calls equals the one walked from scratch, change after change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Holder
from app.core.groups import PodGroupSpecError
from app.core.queues import DEFAULT_QUEUE, QUEUE_ANNOTATION
from app.core.records import GroupNotFound
from app.core.resources import Resources, add, subtract
from app.core.state import ClusterState
from app.runtime.queues.tally import QueueTally, queue_of
from tests.unit.builders import node, pod, podgroup

NODES = ("n0", "n1", "n2")
GROUPS = ("g0", "g1", "g2")
# Members of a gang name the same queue (or none): g1 leaves it to its PodGroup.
QUEUE_OF_GROUP = {"g0": "team-a", "g1": "", "g2": "team-b"}


def reference(state: ClusterState, holders: Sequence[Holder]) -> dict[str, Any]:
    """The tally by one walk over every pod: what QueueTally must always agree with."""
    capacity = state.total_allocatable()
    allocated: dict[str, Resources] = {}
    held: dict[str, dict[str, Resources]] = {}
    meta: dict[str, tuple[str, int, float]] = {}
    placed: dict[str, int] = {}
    admitting: set[str] = set()
    unplaced: dict[str, list[Any]] = {}
    for p in state.pods.values():
        if not p.placed_node:
            if p.group is not None and p.counts_as_member:
                unplaced.setdefault(p.group.key, []).append(p)
            continue
        record = state.nodes.get(p.placed_node)
        if p.terminal or p.key in state.leaving or record is None or record.unschedulable:
            continue
        if p.group is None:
            subtract(capacity, p.requests)
            continue
        key = p.group.key
        name = _queue_name(state, key, p)
        if not p.node_name:
            admitting.add(key)
        placed[key] = placed.get(key, 0) + 1
        add(allocated.setdefault(name, {}), p.requests)
        add(held.setdefault(key, {}).setdefault(p.placed_node, {}), p.requests)
        _, priority, latest = meta.get(key, (name, p.priority, p.created))
        meta[key] = (name, max(priority, p.priority), max(latest, p.created))
    claimed = {h.key for h in holders}
    for h in holders:
        for amounts in h.remaining.values():
            name = _queue_name(state, h.key, state.members(h.key)[0])
            add(allocated.setdefault(name, {}), amounts)
    running = {}
    for key, (name, priority, latest) in meta.items():
        if key in claimed or key in admitting:
            continue
        group_record = state.podgroups.get(key)
        created = group_record.created if group_record and group_record.created else latest
        total: Resources = {}
        for amounts in held[key].values():
            add(total, amounts)
        running[key] = (name, priority, created, _clean_nodes(held[key]), _clean(total))
    pending: dict[str, list[Any]] = {}
    for key, pods in unplaced.items():
        if key in claimed:
            continue
        try:
            spec = state.group_spec(pods[0].group)
        except (GroupNotFound, PodGroupSpecError):
            continue
        have = placed.get(key, 0)
        if have >= spec.min_member or have + len(pods) < spec.min_member:
            continue
        request: Resources = {}
        for p in pods:
            add(request, p.requests)
        group_record = state.podgroups.get(key)
        created = (group_record.created if group_record and group_record.created else 0.0) or min(
            p.created for p in pods
        )
        pending.setdefault(queue_of(spec, pods), []).append(
            (-max(p.priority for p in pods), created, key, _clean(request))
        )
    return {
        "capacity": _clean(capacity),
        "allocated": {q: _clean(v) for q, v in allocated.items() if _clean(v)},
        "running": running,
        "pending": {q: sorted(v) for q, v in pending.items()},
    }


def _queue_name(state: ClusterState, key: str, member: Any) -> str:
    record = state.podgroups.get(key)
    if record is not None and record.spec is not None and record.spec.queue:
        return record.spec.queue
    return str(member.queue or DEFAULT_QUEUE)


def observed(tally: QueueTally, holders: Sequence[Holder]) -> dict[str, Any]:
    got = tally.tally(holders)
    return {
        "capacity": _clean(got.capacity),
        "allocated": {q: _clean(v) for q, v in got.allocated.items() if _clean(v)},
        "running": {
            key: (r.queue, r.priority, r.created, _clean_nodes(r.held), _clean(r.total))
            for key, r in got.running.items()
        },
        "pending": {q: sorted((*w[:3], _clean(w[3])) for w in v) for q, v in got.pending.items()},
    }


def _clean(amounts: Mapping[str, int]) -> Resources:
    return {r: v for r, v in amounts.items() if v}


def _clean_nodes(held: Mapping[str, Mapping[str, int]]) -> dict[str, Resources]:
    return {n: _clean(v) for n, v in held.items()}


def _pod(name: str, group: str | None, where: str, phase: str, **extra: Any) -> dict[str, Any]:
    raw = pod(name, group=group, node=where, phase=phase, cpu=str(extra["cpu"]))
    raw["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{extra['second']:02d}Z"
    raw["spec"]["priority"] = extra["priority"]
    if extra["deleting"]:
        raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    if group is not None and QUEUE_OF_GROUP[group]:
        raw["metadata"]["annotations"] = {QUEUE_ANNOTATION: QUEUE_OF_GROUP[group]}
    return raw


pods = st.builds(
    lambda i, group, where, phase, cpu, second, priority, deleting: (
        "pod",
        _pod(
            f"p{i}",
            group,
            where,
            phase,
            cpu=cpu,
            second=second,
            priority=priority,
            deleting=deleting,
        ),
    ),
    st.integers(0, 9),
    st.sampled_from([None, *GROUPS]),
    st.sampled_from(["", "", *NODES, "gone"]),
    st.sampled_from(["Pending", "Running", "Succeeded"]),
    st.integers(1, 3),
    st.integers(0, 59),
    st.integers(0, 2),
    st.booleans(),
)
operations = st.lists(
    st.one_of(
        pods,
        pods,
        pods,
        st.tuples(st.just("tally"), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 9)),
        st.tuples(st.just("reserve"), st.integers(0, 9), st.sampled_from(NODES)),
        st.tuples(st.just("unreserve"), st.integers(0, 9)),
        st.tuples(st.just("bind"), st.integers(0, 9), st.sampled_from(NODES)),
        st.tuples(st.just("cordon"), st.sampled_from(NODES), st.booleans()),
        st.tuples(st.just("drop-node"), st.sampled_from(NODES)),
        st.tuples(st.just("podgroup"), st.sampled_from(GROUPS), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("podgroup"), st.sampled_from(GROUPS), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("drop-podgroup"), st.sampled_from(GROUPS)),
        st.tuples(st.just("tally"), st.booleans()),
        st.tuples(st.just("slice"), st.integers(1, 3)),
        st.tuples(st.just("slice"), st.integers(1, 3)),
    ),
    min_size=5,
    max_size=80,
)


def apply(state: ClusterState, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "pod":
        state.apply_pod(op[1])
    elif kind == "delete":
        state.delete_pod("default", f"p{op[1]}")
    elif kind == "reserve":
        state.reserve(f"default/p{op[1]}", op[2])
    elif kind == "unreserve":
        state.unreserve(f"default/p{op[1]}")
    elif kind == "bind":
        state.assume_bound(f"default/p{op[1]}", op[2])
    elif kind == "cordon":
        raw = node(op[1], cpu="8")
        raw["spec"]["unschedulable"] = op[2]
        state.apply_node(raw)
    elif kind == "drop-node":
        state.delete_node(op[1])
    elif kind == "podgroup":
        raw = podgroup(op[1], op[2])
        if op[3]:
            raw["metadata"]["annotations"] = {QUEUE_ANNOTATION: "team-c"}
        raw["metadata"]["creationTimestamp"] = "2026-01-01T00:00:30Z"
        state.apply_podgroup(raw)
    elif kind == "drop-podgroup":
        state.delete_podgroup("default", op[1])


@settings(max_examples=500, deadline=None)
@given(operations)
def test_the_kept_tally_is_the_walked_one(ops: list[tuple[Any, ...]]) -> None:
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    tally = QueueTally(state)
    for op in ops:
        apply(state, op)
        if op[0] == "slice":  # catch_up() in the background, a few gangs at a time
            tally.catch_up_slice(op[1])
        if op[0] == "tally":
            holders = _holders(state) if op[1] else []
            assert observed(tally, holders) == reference(state, holders)
    assert observed(tally, []) == reference(state, [])


async def test_a_tally_asked_between_slices_is_the_whole_clusters() -> None:
    """catch_up() a slice at a time, changes and a verb's tally() arriving in between."""
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    tally = QueueTally(state)
    for i in range(10):
        group = GROUPS[i % len(GROUPS)]
        state.apply_pod(
            _pod(
                f"p{i}",
                group,
                NODES[i % 2] if i % 3 else "",
                "Running",
                cpu=1,
                second=i,
                priority=0,
                deleting=False,
            )
        )
    assert not tally.catch_up_slice(1)  # a slice: one gang redone, the rest left
    state.apply_pod(
        _pod("p0", GROUPS[0], "", "Pending", cpu=2, second=0, priority=1, deleting=False)
    )
    assert observed(tally, []) == reference(state, [])
    state.delete_pod("default", "p1")
    await tally.catch_up(most=1)
    assert tally.catch_up_slice(1)
    assert observed(tally, []) == reference(state, [])


def _holders(state: ClusterState) -> list[Holder]:
    """A claim for the first gang with members: it runs nor waits while claimed."""
    for key in sorted(state.group_keys()):
        if state.members(key):
            return [Holder(key, 0, 0.0, {"n0": {"cpu": 1000}})]
    return []


def test_a_gang_leaves_the_line_once_placed_or_gone() -> None:
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    state.apply_podgroup(podgroup("g0", 2))
    tally = QueueTally(state)
    for i in range(2):
        state.apply_pod(
            _pod(f"p{i}", "g0", "", "Pending", cpu=1, second=i, priority=0, deleting=False)
        )
    assert [w[2] for w in tally.tally([]).pending["team-a"]] == ["default/g0"]
    state.assume_bound("default/p0", "n0")
    state.assume_bound("default/p1", "n1")
    assert tally.tally([]).pending == {}
    assert observed(tally, []) == reference(state, [])
    state.delete_pod("default", "p0")
    state.delete_pod("default", "p1")
    assert tally.tally([]).running == {} and tally.tally([]).pending == {}
    assert observed(tally, []) == reference(state, [])


def test_a_tally_after_more_node_changes_than_the_state_remembers_counts_afresh() -> None:
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    state.apply_pod(_pod("p0", None, "n0", "Running", cpu=2, second=0, priority=0, deleting=False))
    tally = QueueTally(state)
    assert observed(tally, []) == reference(state, [])
    state.delete_node("n2")
    for i in range(5000):  # the state's log of node changes keeps 4,096
        state.apply_node(node(NODES[i % 2], cpu=str(8 + i % 3)))
    state.delete_pod("default", "p0")
    assert observed(tally, []) == reference(state, [])


def test_a_node_that_stops_taking_pods_redoes_only_the_gangs_on_it() -> None:
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    for i, (group, where) in enumerate((("g0", "n0"), ("g2", "n1"))):
        state.apply_pod(
            _pod(f"p{i}", group, where, "Running", cpu=1, second=i, priority=0, deleting=False)
        )
    tally = QueueTally(state)
    before = tally.tally([]).running
    assert set(before) == {"default/g0", "default/g2"}
    cordoned = node("n0", cpu="8")
    cordoned["spec"]["unschedulable"] = True
    state.apply_node(cordoned)
    after = tally.tally([]).running
    assert set(after) == {"default/g2"}  # g0's member no longer counts: its node takes no pods
    assert after["default/g2"] is before["default/g2"]  # kept: nothing of g2 moved
    assert observed(tally, []) == reference(state, [])
    state.apply_node(node("n0", cpu="8"))
    state.delete_node("n1")
    assert set(tally.tally([]).running) == {"default/g0"}
    assert observed(tally, []) == reference(state, [])
