"""What each queue holds and waits for at one moment: the input of the shares (app/core/queues.py).

Pods in no gang are in no queue: what they take is not the queues' to
share. Gangs waiting are every gang with pods not placed, enough of them to
be whole, no claim, not yet at minMember (kube-scheduler may not have asked
about them yet; they still count as their queue's demand).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.base.tasks import let_others_run
from app.core.contention import Holder
from app.core.groups import GroupSpec, PodGroupSpecError
from app.core.queues import DEFAULT_QUEUE, Running
from app.core.records import GroupNotFound, PodRecord
from app.core.resources import Resources, add, subtract
from app.core.state import ClusterState
from app.runtime.queues.queue_lines import Pending, QueueLine

# Gangs redone per slice of catch_up(): a few milliseconds of the event loop.
_SLICE = 100


@dataclass(slots=True)
class Tally:
    """The capacity queues share, what each queue holds and waits for, who holds nodes."""

    capacity: Resources
    allocated: dict[str, Resources]
    running: dict[str, Running]
    pending: dict[str, list[Pending]]
    # queue -> gangs holding a claim (admitted, their members on the way through the gate).
    admitted: dict[str, int] = field(default_factory=dict)


def queue_of(spec: GroupSpec | None, members: Sequence[PodRecord]) -> str:
    """The group's spec.queue (or annotation), else a member's annotation, else default."""
    if spec is not None and spec.queue:
        return spec.queue
    return next((p.queue for p in members if p.queue), DEFAULT_QUEUE)


class QueueTally:
    """The queues' tally, kept between calls: each gang's part is redone only when it changed.

    A fresh admission with queues asks for the whole cluster's tally; walking
    every pod for it took 0.2-0.5 s at 50,000 pods (BENCHMARKS.md, "the
    queues' tally kept between calls"), on the event loop every other verb
    waits for. Each gang's part (what it holds on which node, whether it
    waits and for what) depends on its pods, its group object and which
    nodes take pods. The state says which groups changed
    (`groups_changed_since`) and when nodes started or stopped taking pods
    (`schedulable_version`: then the gangs with pods on those nodes), so a
    tally redoes those gangs and sums the rest as they were. The plain pods'
    share is what the pods on schedulable nodes request less the gangs'
    share, both summed node by node as nodes and their pods change
    (`nodes_changed_since`).
    """

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._nodes = _NodeSums(state)
        self._parts: dict[str, _GangPart] = {}
        # What the parts add up to, kept as parts change.
        self._allocated: dict[str, Resources] = {}
        self._on_nodes: Resources = {}
        self._running: dict[str, Running] = {}
        self._pending: dict[str, tuple[str, Pending]] = {}
        # queue -> its gangs waiting, kept as _pending changes (see QueueLine).
        self._lines: dict[str, QueueLine] = {}
        # The change stamp and the schedulable-node version the parts are current with,
        # and the nodes that took pods then.
        self._stamp = -1
        self._schedulable = -1
        self._taking: set[str] = set()
        # Gangs whose parts changed and are not redone yet (a slice stopped before them).
        self._todo: set[str] = set()

    def tally(self, holders: Sequence[Holder]) -> Tally:
        """The queues now: placed pods and the claims' promises are held, unplaced gangs wait."""
        self._catch_up()
        allocated = {name: dict(amounts) for name, amounts in self._allocated.items()}
        admitted: dict[str, int] = {}
        for holder in holders:
            name = self.queue_of_holder(holder.key)
            admitted[name] = admitted.get(name, 0) + 1
            for amounts in holder.remaining.values():
                add(allocated.setdefault(name, {}), amounts)
        claimed = {h.key for h in holders}
        running = dict(self._running)
        for key in claimed:
            running.pop(key, None)
        pending: dict[str, list[Pending]] = {}
        for key, (name, waiting) in self._pending.items():
            if key not in claimed:
                pending.setdefault(name, []).append(waiting)
        return Tally(self._capacity(), allocated, running, pending, admitted)

    def lines(self) -> tuple[Resources, dict[str, Resources], dict[str, QueueLine]]:
        """The capacity queues share, what each queue's gangs hold (no claim counted), and
        each queue's gangs waiting (those holding a claim too): kept, not copied, so that
        a caller's cost does not grow with the line. The caller counts the claims and must
        not change what it is handed."""
        self._catch_up()
        return self._capacity(), self._allocated, self._lines

    def running(self, holders: Sequence[Holder]) -> list[Running]:
        """The gangs holding nodes and not being admitted (reclaim's victims)."""
        self._catch_up()
        claimed = {h.key for h in holders}
        return [r for key, r in self._running.items() if key not in claimed]

    def queue_of_holder(self, key: str) -> str:
        """The queue a gang holding a claim counts in (as tally() counts it)."""
        members = self._state.members(key)
        return _queue_of_key(self._state, key, members[0]) if members else DEFAULT_QUEUE

    def _capacity(self) -> Resources:
        """What the schedulable nodes have less what plain pods (no gang) hold there."""
        state = self._state
        self._nodes.catch_up()
        capacity = dict(self._nodes.allocatable)
        plain = dict(self._nodes.requested)
        subtract(plain, self._on_nodes)
        for pod in state.leaving.values():  # placed, on their way out: they hold nothing
            if pod.group is None and _takes_pods(state, pod.placed_node):
                subtract(plain, pod.requests)
        subtract(capacity, plain)
        return capacity

    def _catch_up(self) -> None:
        """Every gang's part current: what changed since, and what a slice left to do."""
        self._collect()
        todo = self._todo
        while todo:
            self._redo(todo.pop())

    def catch_up_slice(self, most: int) -> bool:
        """Redo at most `most` of the nodes' sums, then of the gangs' parts, that changed;
        True: none is left.

        A tally() between two slices does the rest at once, so it is always the
        whole cluster's as it is then; slices only take that work off it.
        """
        if not self._nodes.catch_up_slice(most):
            return False
        self._collect()
        todo = self._todo
        for _ in range(min(most, len(todo))):
            self._redo(todo.pop())
        return not todo

    async def catch_up(self, most: int = _SLICE) -> None:
        """Bring every gang's part up to date, `most` gangs at a time, the event loop free
        between slices: the first tally after a start or a relist walks every pod, and
        done at once it held the loop 0.3-0.8 s at 50,000 pods (verbs and watches wait)."""
        while not self.catch_up_slice(most):
            await let_others_run()

    def _collect(self) -> None:
        """Note the gangs whose parts changed since last time (all, when too many to tell)."""
        state = self._state
        stamp, changed = state.groups_changed_since(self._stamp)
        moved: set[str] = set()
        if self._schedulable != state.schedulable_version:
            # A gang's part counts its members on nodes that take pods: redo the
            # gangs on the nodes that came, went, or were cordoned or uncordoned,
            # not every gang (a full tally holds the loop 0.3-0.7 s at 50,000 pods,
            # and nodes come and go in an autoscaled cluster).
            taking = {name for name, node in state.nodes.items() if not node.unschedulable}
            if changed is not None:
                moved = self._gangs_on(taking ^ self._taking)
            self._taking = taking
        if changed is None:
            self._parts.clear()
            self._allocated, self._on_nodes, self._running, self._pending = {}, {}, {}, {}
            self._lines = {}
            self._todo = set(state.group_keys())
        else:
            self._todo.update(moved)
            self._todo.update(changed)
        self._stamp, self._schedulable = stamp, state.schedulable_version

    def _gangs_on(self, nodes: set[str]) -> set[str]:
        """The gangs with a member placed on one of `nodes`."""
        return {
            pod.group.key
            for name in nodes
            for pod in self._state.pods_on(name)
            if pod.group is not None
        }

    def _redo(self, key: str) -> None:
        old = self._parts.pop(key, None)
        if old is not None:
            for name, amounts in old.allocated.items():
                total = self._allocated[name]
                subtract(total, amounts)
                if not total:
                    del self._allocated[name]
            subtract(self._on_nodes, old.on_nodes)
            self._running.pop(key, None)
            was = self._pending.pop(key, None)
            if was is not None:
                line = self._lines[was[0]]
                line.remove(was[1])
                if not line.gangs:
                    del self._lines[was[0]]
        pods = self._state.group_pods(key)
        if not pods:
            return
        part = _gang_part(self._state, key, pods)
        self._parts[key] = part
        for name, amounts in part.allocated.items():
            add(self._allocated.setdefault(name, {}), amounts)
        add(self._on_nodes, part.on_nodes)
        if part.running is not None:
            self._running[key] = part.running
        if part.pending is not None:
            self._pending[key] = part.pending
            self._lines.setdefault(part.pending[0], QueueLine()).add(part.pending[1])


class _NodeSums:
    """What the schedulable nodes have and what the pods on them request, summed; redone
    node by node as the state reports nodes changed (their record or their pods)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._stamp = -1
        # node -> (allocatable, requested) as counted in the sums.
        self._counted: dict[str, tuple[Resources, Resources]] = {}
        self.allocatable: Resources = {}
        self.requested: Resources = {}
        # Nodes changed and not redone yet (a slice stopped before them).
        self._todo: set[str] = set()

    def catch_up(self) -> None:
        self.catch_up_slice(sys.maxsize)

    def catch_up_slice(self, most: int) -> bool:
        """Redo at most `most` of the nodes that changed; True: none is left. The first
        sums after a start count every node: 5,000 of them at once held the loop tens of
        milliseconds in the first admission with queues."""
        stamp, changed = self._state.nodes_changed_since(self._stamp)
        if changed is None:
            self._counted, self.allocatable, self.requested = {}, {}, {}
            self._todo = set()
            changed = list(self._state.nodes)
        self._todo.update(changed)
        self._stamp = stamp
        todo = self._todo
        for _ in range(min(most, len(todo))):
            self._redo(todo.pop())
        return not todo

    def _redo(self, name: str) -> None:
        counted = self._counted.pop(name, None)
        if counted is not None:
            subtract(self.allocatable, counted[0])
            subtract(self.requested, counted[1])
        node = self._state.nodes.get(name)
        if node is None or node.unschedulable:
            return
        requested = dict(self._state.requested_on(name))  # the state changes its own in place
        add(self.allocatable, node.allocatable)
        add(self.requested, requested)
        self._counted[name] = (node.allocatable, requested)


@dataclass(frozen=True, slots=True)
class _GangPart:
    """One gang's share of the tally."""

    # queue -> what its held members (placed, staying, on schedulable nodes) request.
    allocated: dict[str, Resources]
    # What every non-terminal member on a schedulable node requests, leaving ones too.
    on_nodes: Resources
    # The gang as a reclaim victim: it holds nodes and is not being admitted.
    running: Running | None
    # (queue, its place in line): it waits, with members enough to be whole.
    pending: tuple[str, Pending] | None


def _gang_part(state: ClusterState, key: str, pods: Sequence[PodRecord]) -> _GangPart:
    """Members naming different queues (no queue on the group object) count each in its own;
    the gang, as a reclaim victim, is in the first of them by name."""
    allocated: dict[str, Resources] = {}
    held: dict[str, Resources] = {}
    on_nodes: Resources = {}
    unplaced: list[PodRecord] = []
    queues: set[str] = set()
    placed, admitting, priority, latest = 0, False, 0, 0.0
    keys: list[str] = []
    for pod in pods:
        node = pod.placed_node
        if not node:
            if pod.counts_as_member:
                unplaced.append(pod)
            continue
        if pod.terminal or not _takes_pods(state, node):
            continue  # outside the capacity as well
        add(on_nodes, pod.requests)
        if pod.key in state.leaving:
            continue
        admitting = admitting or not pod.node_name  # reserved in the gate, not bound yet
        name = _queue_of_key(state, key, pod)
        queues.add(name)
        add(allocated.setdefault(name, {}), pod.requests)
        add(held.setdefault(node, {}), pod.requests)
        keys.append(pod.key)
        priority = pod.priority if not placed else max(priority, pod.priority)
        latest = max(latest, pod.created)
        placed += 1
    running = None
    if placed and not admitting:
        total: Resources = {}
        for amounts in held.values():
            add(total, amounts)
        created = podgroup_created(state, key, latest)
        running = Running(key, min(queues), priority, created, held, total, frozenset(keys))
    return _GangPart(allocated, on_nodes, running, _waiting(state, key, placed, unplaced))


def _waiting(
    state: ClusterState, key: str, placed: int, unplaced: Sequence[PodRecord]
) -> tuple[str, Pending] | None:
    """(queue, place in line) of a gang not whole yet but with members enough to be."""
    if not unplaced:
        return None
    ref = unplaced[0].group
    assert ref is not None
    try:
        spec = state.group_spec(ref)
    except (GroupNotFound, PodGroupSpecError):
        return None
    if placed >= spec.min_member or placed + len(unplaced) < spec.min_member:
        return None  # whole already, or cannot be yet
    request: Resources = {}
    for pod in unplaced:
        add(request, pod.requests)
    created = podgroup_created(state, key, 0.0) or min(p.created for p in unplaced)
    priority = max(p.priority for p in unplaced)
    return queue_of(spec, unplaced), (-priority, created, key, request)


def _takes_pods(state: ClusterState, node: str) -> bool:
    record = state.nodes.get(node)
    return record is not None and not record.unschedulable


def podgroup_created(state: ClusterState, key: str, otherwise: float) -> float:
    """The PodGroup's creation time, `otherwise` when unknown."""
    record = state.podgroups.get(key)
    return record.created if record is not None and record.created else otherwise


def _queue_of_key(state: ClusterState, key: str, pod: PodRecord) -> str:
    record = state.podgroups.get(key)
    if record is not None and record.spec is not None and record.spec.queue:
        return record.spec.queue
    return pod.queue or DEFAULT_QUEUE
