"""What each queue holds and waits for at one moment: the input of the shares (app/core/queues.py).

Pods in no gang are in no queue: what they take is not the queues' to
share. Gangs waiting are every gang with pods not placed, enough of them to
be whole, no claim, not yet at minMember (kube-scheduler may not have asked
about them yet; they still count as their queue's demand).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.contention import Holder
from app.core.groups import GroupSpec, PodGroupSpecError
from app.core.queues import DEFAULT_QUEUE, Running
from app.core.records import GroupNotFound, PodRecord
from app.core.resources import Resources, add, subtract
from app.core.state import ClusterState

# A gang waiting: (-priority, created, key, what it asks for); sorts in queue order.
Pending = tuple[int, float, str, Resources]


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


def tally_queues(state: ClusterState, holders: Sequence[Holder]) -> Tally:
    """The queues now: placed pods and the claims' promises are held, unplaced gangs wait."""
    walk = _Placed(state)
    walk.over(state)
    allocated = walk.allocated
    admitted: dict[str, int] = {}
    for holder in holders:
        members = state.members(holder.key)
        name = _queue_of_key(state, holder.key, members[0]) if members else DEFAULT_QUEUE
        admitted[name] = admitted.get(name, 0) + 1
        for amounts in holder.remaining.values():
            add(allocated.setdefault(name, {}), amounts)
    claimed = {h.key for h in holders}
    return Tally(
        walk.capacity,
        allocated,
        walk.running(state, claimed),
        walk.pending(state, claimed),
        admitted,
    )


class _Placed:
    """One walk over the pods: what each gang holds where, and which gangs wait."""

    def __init__(self, state: ClusterState) -> None:
        self.capacity = state.total_allocatable()
        self.allocated: dict[str, Resources] = {}
        # gang -> node -> what its placed members hold there.
        self.held: dict[str, dict[str, Resources]] = {}
        # gang -> (queue, highest priority, latest member creation).
        self.meta: dict[str, tuple[str, int, float]] = {}
        self.unplaced: dict[str, list[PodRecord]] = {}
        self.placed: dict[str, int] = {}
        # Gangs still being admitted (a member in the gate): not running, never reclaimed.
        self.admitting: set[str] = set()

    def over(self, state: ClusterState) -> None:
        for pod in state.pods.values():
            if not pod.placed_node:
                if pod.group is not None and pod.counts_as_member:
                    self.unplaced.setdefault(pod.group.key, []).append(pod)
                continue
            if pod.terminal or pod.key in state.leaving:
                continue
            node = state.nodes.get(pod.placed_node)
            if node is None or node.unschedulable:
                continue  # outside the capacity as well
            if pod.group is None:
                subtract(self.capacity, pod.requests)
                continue
            self._held(state, pod.group.key, pod)

    def _held(self, state: ClusterState, key: str, pod: PodRecord) -> None:
        if not pod.node_name:
            self.admitting.add(key)  # reserved in the gate, not bound yet
        self.placed[key] = self.placed.get(key, 0) + 1
        name = _queue_of_key(state, key, pod)
        add(self.allocated.setdefault(name, {}), pod.requests)
        add(self.held.setdefault(key, {}).setdefault(pod.placed_node, {}), pod.requests)
        _, priority, created = self.meta.get(key, (name, pod.priority, pod.created))
        self.meta[key] = (name, max(priority, pod.priority), max(created, pod.created))

    def pending(self, state: ClusterState, claimed: set[str]) -> dict[str, list[Pending]]:
        """queue -> the gangs waiting in it: not whole yet, but with members enough to be."""
        pending: dict[str, list[Pending]] = {}
        for key, pods in self.unplaced.items():
            if key in claimed:
                continue
            ref = pods[0].group
            assert ref is not None
            try:
                spec = state.group_spec(ref)
            except (GroupNotFound, PodGroupSpecError):
                continue
            have = self.placed.get(key, 0)
            if have >= spec.min_member or have + len(pods) < spec.min_member:
                continue  # whole already, or cannot be yet
            request: Resources = {}
            for pod in pods:
                add(request, pod.requests)
            created = podgroup_created(state, key, 0.0) or min(p.created for p in pods)
            pending.setdefault(queue_of(spec, pods), []).append(
                (-max(p.priority for p in pods), created, key, request)
            )
        return pending

    def running(self, state: ClusterState, claimed: set[str]) -> dict[str, Running]:
        """The gangs holding nodes that are neither claiming nor being admitted."""
        running: dict[str, Running] = {}
        for key, (name, priority, latest) in self.meta.items():
            if key in claimed or key in self.admitting:
                continue
            total: Resources = {}
            for amounts in self.held[key].values():
                add(total, amounts)
            created = podgroup_created(state, key, latest)
            running[key] = Running(key, name, priority, created, self.held[key], total)
        return running


def podgroup_created(state: ClusterState, key: str, otherwise: float) -> float:
    """The PodGroup's creation time, `otherwise` when unknown."""
    record = state.podgroups.get(key)
    return record.created if record is not None and record.created else otherwise


def _queue_of_key(state: ClusterState, key: str, pod: PodRecord) -> str:
    record = state.podgroups.get(key)
    if record is not None and record.spec is not None and record.spec.queue:
        return record.spec.queue
    return pod.queue or DEFAULT_QUEUE
