"""The room a preempting gang may plan with: free room minus what others were promised.

Promised: nominated pods that rank at least as high (kube-scheduler's
filters keep their room), and the open slots of other live plans of gangs
that rank at least as high (their members are nominated too, counted
once); their handed victims count as gone. `kept` gives the open slots to
the filter, for a pod in no gang: kube-scheduler forgets a nomination it
cleared while the victims leave, and a lower-priority pod would take the
room a gang preempted for. A pod gone (leaving, or another
plan's handed victim) also gives back what its claims hold of the device
pools published for many nodes (app/core/shared_pools.py
PoolHold), which no one node's room holds; and such an open slot takes
what its member draws of those pools (Slot.pools), which no one node's room
holds either: two gangs planning at once are not both promised a pool's
devices (a higher-priority plan that needs them makes the other give way,
app/runtime/preemption/plan_book.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from app.core.packing import Bin, index_of
from app.core.preemption.victims import VictimCandidate
from app.core.resources import Resources, add, fits, subtract
from app.core.shared_pools import PoolHold, PoolShare, charged, credited, freed_by
from app.core.state import ClusterState
from app.runtime.preemption.plan import Plan, slot_filled
from app.runtime.preemption.plan_book import PlanBook


@dataclass(slots=True)
class KeptRoom:
    """A node where live plans hold open slots: the room left beside them, and for whom."""

    free: Resources
    gangs: set[str] = field(default_factory=set)


class PreemptionRoom:
    def __init__(self, state: ClusterState, book: PlanBook) -> None:
        self._state = state
        self._book = book

    def bins(self, group_key: str, priority: int) -> list[Bin]:
        """Free room per node for gang `group_key` at `priority`."""
        # Copies: the state's bins are shared (app/core/free_room.py), these are changed.
        bins = [b.with_free(dict(b.free)) for b in self._state.room()]
        by_node = index_of(bins)
        planned = self._book.plans
        for pod in self._state.nominated.values():
            # A member of a live plan is nominated for its slot: counted with the open slots.
            if pod.group is not None and (pod.group.key == group_key or pod.group.key in planned):
                continue
            if pod.priority >= priority:
                target = by_node.get(pod.nominated_node)
                if target is not None:
                    subtract(target.free, pod.requests)
        gone = set(self._state.leaving)
        drawn: list[PoolShare] = []
        for other in self._book:
            if other.group == group_key or not other.live:
                continue
            gone |= self._give_handed(other, by_node)
            if other.priority >= priority:
                drawn.extend(self._take_open_slots(other, by_node))
        if not any(b.pools for b in bins):
            return bins
        return charged(credited(bins, freed_by(self.pool_holds(), gone)), drawn)

    def kept(self, priority: int) -> dict[str, KeptRoom]:
        """The nodes where live plans of gangs at `priority` or above hold open slots: what a
        pod at `priority` may use there. Other nodes owe plans nothing (empty: no such plan).

        Counted as kube-scheduler counts a nominated pod's room: the node's free room
        now (pods leaving it, the plans' victims among them, still hold theirs) less
        the open slots. Costs the live plans' slots, not the cluster's nodes.
        """
        kept: dict[str, KeptRoom] = {}
        for plan in self._book:
            if not plan.live or plan.priority < priority:
                continue
            for slot in plan.slots:
                if slot_filled(self._state, slot):
                    continue
                held = kept.get(slot.node)
                if held is None:
                    record = self._state.nodes.get(slot.node)
                    if record is None or record.unschedulable:  # kube-scheduler offers none
                        continue
                    held = kept[slot.node] = KeptRoom(dict(record.allocatable))
                    subtract(held.free, self._state.requested_on(slot.node))
                subtract(held.free, slot.requests)
                held.gangs.add(plan.group)
        return kept

    def kept_from(
        self, requests: Mapping[str, int], priority: int, nodes: Iterable[str]
    ) -> dict[str, str]:
        """A pod in no gang: those of `nodes` where it does not fit in what `kept` leaves
        (node -> why). kube-scheduler keeps a planned member's room only while it
        remembers the nomination, and clears one when its own dry run finds nothing to
        evict (the victims are leaving already): the filter verb keeps it instead."""
        kept = self.kept(priority)
        refused: dict[str, str] = {}
        for node in nodes if kept else ():
            held = kept.get(node)
            if held is not None and not fits(requests, held.free):
                refused[node] = kept_room_message(node, held.gangs, priority)
        return refused

    def kept_after(
        self, requests: Mapping[str, int], priority: int, candidates: Iterable[VictimCandidate]
    ) -> dict[str, str]:
        """A preemptor in no gang: those of its candidates where, once the candidate's
        victims, the live plans' victims and every pod leaving the node are gone, it still
        does not fit beside the open slots of live plans at its priority or above (node ->
        why). Evicting there would only free room a gang was promised."""
        kept = self.kept(priority)
        offered = [c for c in candidates if c.node in kept]
        if not offered:
            return {}
        planned = {uid for plan in self._book if plan.live for uid in plan.victims}
        leaving = self._state.leaving
        refused: dict[str, str] = {}
        for candidate in offered:
            held = kept[candidate.node]
            victims = set(candidate.victim_uids)
            free = dict(held.free)
            for pod in self._state.pods_on(candidate.node):
                if pod.uid in victims or pod.uid in planned or pod.key in leaving:
                    add(free, pod.requests)
            if not fits(requests, free):
                refused[candidate.node] = kept_room_message(candidate.node, held.gangs, priority)
        return refused

    def pool_holds(self) -> list[PoolHold]:
        """What allocated claims hold of the shared device pools, and the pods using each."""
        return self._state.devices.pool_holds()

    def _give_handed(self, other: Plan, by_node: dict[str, Bin]) -> set[str]:
        """Give back the room of the other plan's handed victims still there; their keys."""
        leaving = self._state.leaving
        given: set[str] = set()
        for uid in other.handed:
            victim = self._state.pod_by_uid(uid)
            if victim is not None and victim.key not in leaving and not victim.terminal:
                target = by_node.get(victim.placed_node)
                if target is not None:
                    add(target.free, victim.requests)
                given.add(victim.key)
        return given

    def _take_open_slots(self, other: Plan, by_node: dict[str, Bin]) -> list[PoolShare]:
        """Take the other plan's open slots off their nodes' room; what they draw of the
        shared pools."""
        drawn: list[PoolShare] = []
        for slot in other.slots:
            if not slot_filled(self._state, slot):
                target = by_node.get(slot.node)
                if target is not None:
                    subtract(target.free, slot.requests)
                    drawn.extend((name, slot.node, amounts) for name, amounts in slot.pools.items())
        return drawn


def kept_room_message(node: str, gangs: set[str], priority: int) -> str:
    """Why a pod in no gang may not use a node's room: which gangs preempted for it."""
    return (
        f"node {node}: its free room is kept for gang {', '.join(sorted(gangs))}, which "
        f"preempted lower-priority pods to get it (a priority at or above this pod's "
        f"{priority}); this pod is tried again once that gang is placed or its plan ends"
    )
