"""The queues' tally kept between calls equals the one walked from scratch, change after change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Gang, Holder
from app.core.groups import PodGroupSpecError
from app.core.packing import Demand
from app.core.queues import (
    DEFAULT_QUEUE,
    QUEUE_ANNOTATION,
    QueueSpec,
    QueueView,
    deserved_shares,
    enqueue,
)
from app.core.records import GroupNotFound
from app.core.resources import Resources, add, subtract
from app.core.state import ClusterState
from app.runtime.queues.book import Assessment, QueueBook
from app.runtime.queues.tally import QueueTally, queue_of
from app.runtime.queues.verdicts import request_of
from tests.unit.builders import node, pod, podgroup

NODES = ("n0", "n1", "n2")
GROUPS = ("g0", "g1", "g2", "g3", "g4")
# Members of a gang name the same queue (or none): g1 and g4 leave it to their PodGroup.
QUEUE_OF_GROUP = {"g0": "team-a", "g1": "", "g2": "team-b", "g3": "team-a", "g4": ""}


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


# ---- the queue check read from the kept sums equals one walked from the whole tally ----------

QUEUE_OBJECTS = [
    {"metadata": {"name": "team-a"}, "spec": {"weight": 1, "capability": {"cpu": "4"}}},
    {"metadata": {"name": "team-b"}, "spec": {"weight": 2}},
    {"metadata": {"name": DEFAULT_QUEUE}, "spec": {"weight": 1, "guarantee": {"cpu": "2"}}},
]
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the pods' creation times above


def reference_assess(
    book: QueueBook,
    tally: QueueTally,
    candidate: Gang | None,
    queue: str,
    line: Sequence[tuple[Gang, str]],
    holders: Sequence[Holder],
) -> tuple[dict[str, Any], str | None, list[str]]:
    """QueueBook.assess as it was: every gang of the whole tally walked at each call."""
    queues = {**book.specs}
    queues.setdefault(DEFAULT_QUEUE, QueueSpec(DEFAULT_QUEUE))
    got = tally.tally(holders)
    capacity, allocated = got.capacity, got.allocated
    requests: dict[str, Resources] = {n: dict(v) for n, v in allocated.items()}
    if candidate is not None:
        mine = got.pending.setdefault(queue, [])
        mine[:] = [w for w in mine if w[2] != candidate.key]
        mine.append((-candidate.priority, candidate.created, candidate.key, request_of(candidate)))
    for name, gangs in got.pending.items():
        for waiting in gangs:
            add(requests.setdefault(name, {}), waiting[-1])
    deserved = deserved_shares(queues, requests, capacity)
    views = {}
    for name, spec in queues.items():
        ordered = sorted(got.pending.get(name, ()), key=lambda w: w[:3])
        views[name] = QueueView(
            spec,
            allocated.get(name, {}),
            deserved[name],
            ordered[0][-1] if ordered else None,
            len(ordered),
        )
    message = None
    if candidate is not None and queue not in queues:
        message = "no such queue"
    elif candidate is not None:
        request = request_of(candidate)
        alone = enqueue(queue, request, views, capacity, book.overcommit)
        if alone is not None:
            message = f"gang {candidate.key} waits in its queue: {alone}"
        else:
            place = (-candidate.priority, candidate.created, candidate.key)
            ahead = [
                w
                for w in got.pending.get(queue, ())
                if w[:3] < place
                and all(v <= capacity.get(r, 0) for r, v in w[3].items() if r in capacity)
                and enqueue(queue, w[3], views, capacity, book.overcommit) is None
            ]
            together = dict(request)
            for waiting in ahead:
                add(together, waiting[3])
            if ahead and enqueue(queue, together, views, capacity, book.overcommit) is not None:
                names = ", ".join(w[2] for w in sorted(ahead)[:3])
                message = f"{len(ahead)} ahead: {names}"
    allowed = [
        g.key
        for g, name in line
        if name in views and enqueue(name, request_of(g), views, capacity, book.overcommit) is None
    ]
    shown = {
        n: (_clean(v.allocated), _clean(v.deserved), v.head and _clean(v.head), v.waiting)
        for n, v in views.items()
    }
    return shown, message, allowed


def _gist(book: QueueBook, got: Assessment) -> tuple[dict[str, Any], str | None, list[str]]:
    """What reference_assess returns, from QueueBook.assess's answer (the messages' gist)."""
    message = got.message
    if message is not None and "which does not exist" in message:
        message = "no such queue"
    elif message is not None and "waits behind" in message:
        count = message.split("waits behind ")[1].split(" ")[0]
        names = message.split(f"of queue {got.queue} (")[1].split("): the queue")[0]
        message = f"{count} ahead: {names.removesuffix(', ...')}"
    views = {
        n: (_clean(v.allocated), _clean(v.deserved), v.head and _clean(v.head), v.waiting)
        for n, v in got.views.items()
    }
    return views, message, [g.key for g in got.line]


def applied(
    state: ClusterState, ops: tuple[Any, ...], line: list[tuple[Gang, str]]
) -> list[tuple[Gang, str]]:
    """The changes made; the line after them: mostly a new one, sometimes the very one the
    verdict's memo knows."""
    for op in ops:
        apply(state, op)
    return _line_of(state) if len(ops) % 3 else line


def queue_cluster() -> tuple[ClusterState, QueueBook]:
    """The nodes of 8 CPUs and the queues every test here starts from."""
    state = ClusterState()
    state.replace_nodes([node(n, cpu="8") for n in NODES])
    book = QueueBook(state)
    book.replace(QUEUE_OBJECTS)
    return state, book


def _line_of(state: ClusterState) -> list[tuple[Gang, str]]:
    """A line of every group's unplaced members (one list kept: the verdict's memo is used)."""
    line = []
    for i, key in enumerate(sorted(state.group_keys())):
        demands = tuple(
            Demand(p.key, p.requests, None) for p in state.members(key) if not p.placed_node
        )
        if demands:
            line.append(
                (
                    Gang(key, 0, EPOCH + i, demands, len(demands)),
                    QUEUE_OF_GROUP[key[8:]] or DEFAULT_QUEUE,
                )
            )
    return line


assessments = st.tuples(
    st.just("assess"),
    st.sampled_from(["default/g0", "default/g1", "default/g3", "default/new"]),
    st.sampled_from(["team-a", "team-b", DEFAULT_QUEUE, "team-c"]),
    st.integers(0, 2),
    st.integers(0, 59),
    st.integers(1, 3),
    st.integers(0, 2),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(operations.map(tuple), assessments), min_size=2, max_size=12))
def test_the_queue_check_from_the_kept_sums_is_the_one_from_the_whole_tally(
    rounds: list[tuple[Any, ...]],
) -> None:
    state, book = queue_cluster()
    reference_tally = QueueTally(state)
    line: list[tuple[Gang, str]] = []
    for ops in rounds:
        if ops[0] != "assess":
            line = applied(state, ops, line)
            continue
        _, key, queue, priority, second, cpu, claims = ops
        candidate = Gang(
            key, priority, EPOCH + second, (Demand(f"{key}-0", {"cpu": cpu * 1000}, None),), 1
        )
        holders = _holders(state)[:claims] + (
            [Holder("default/g2", 0, 0.0, {"n1": {"cpu": 2000}})] if claims == 2 else []
        )
        for who in (candidate, None):
            got = book.assess(who, queue, line, holders)
            assert _gist(book, got) == reference_assess(
                book, reference_tally, who, queue, line, holders
            )


def test_a_candidate_waits_behind_its_queues_older_gangs_until_one_holds_a_claim() -> None:
    state, book = queue_cluster()  # team-a: at most 4 CPUs
    for group in ("g0", "g3"):
        state.apply_podgroup(podgroup(group, 2))
        for i in range(2):
            state.apply_pod(
                _pod(
                    f"{group}-{i}",
                    group,
                    "",
                    "Pending",
                    cpu=1,
                    second=i,
                    priority=0,
                    deleting=False,
                )
            )
    candidate = Gang(
        "default/new", 0, EPOCH + 50, (Demand("default/new-0", {"cpu": 1000}, None),), 1
    )
    line = _line_of(state)
    got = book.assess(candidate, "team-a", line, [])
    assert got.message is not None and "waits behind 2 older" in got.message
    assert _gist(book, got) == reference_assess(
        book, QueueTally(state), candidate, "team-a", line, []
    )
    # g0 holds a claim (one CPU of it still to place): it no longer waits, g3 alone is ahead.
    claim = [Holder("default/g0", 0, 0.0, {"n0": {"cpu": 1000}})]
    got = book.assess(candidate, "team-a", line, claim)
    assert got.message is None and got.views["team-a"].waiting == 2  # g3 and the candidate
    assert _gist(book, got) == reference_assess(
        book, QueueTally(state), candidate, "team-a", line, claim
    )
