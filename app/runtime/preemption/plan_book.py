"""The live preemption plans, one per gang, and their life: done, expired or cancelled.

A plan holds room and victims for its gang only while the facts it rests on
hold; every question about plans checks them first, so an expired plan never
keeps room from anyone. Ending a plan is counted, logged, and (unless done)
told to the gang's users.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from app.base.metrics import Metrics
from app.core.admission import wholeness
from app.core.clock import Clock
from app.core.groups import GroupRef, PodGroupSpecError
from app.core.observer import GangObserver
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.plan import (
    Plan,
    PlanKind,
    PlanPhase,
    room_taken,
    stalled,
    still_there,
)

log = logging.getLogger(__name__)

# How long a plan may take from the first eviction to the gang holding its
# nodes: victims' grace period (30 s by default) and the members' scheduling.
PLAN_SECONDS = 60.0


class PlanBook:
    def __init__(
        self,
        state: ClusterState,
        metrics: Metrics,
        observer: GangObserver,
        clock: Clock,
        plan_seconds: float = PLAN_SECONDS,
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._observer = observer
        self._clock = clock
        self.plan_seconds = plan_seconds
        self.plans: dict[str, Plan] = {}
        # Told after a plan ended: the nominations follow (app/runtime/preemption/nominations.py),
        # and so do preemptors refused for its room (app/runtime/preemption/kept_waiters.py).
        self.end_listeners: list[Callable[[], None]] = []

    def __iter__(self) -> Iterator[Plan]:
        return iter(list(self.plans.values()))

    def get(self, group_key: str) -> Plan | None:
        return self.plans.get(group_key)

    def deadline(self, now: float) -> float:
        return now + self.plan_seconds

    def taken(self) -> set[str]:
        """Every victim of a live plan: no other plan may count on evicting it."""
        return {uid for p in self.plans.values() if p.live for uid in p.victims}

    def check_all(self, now: float) -> None:
        for current in self:
            self.check(current, now)

    def landed(self, pod: PodRecord, now: float) -> None:
        """A pod was placed on a node: the other gangs' plans with a slot there are checked
        at once, as it may have taken their room (room_taken)."""
        for current in self:
            mine = pod.group is not None and pod.group.key == current.group
            if not mine and any(s.node == pod.placed_node for s in current.slots):
                self.check(current, now)

    def lives(self, group_key: str) -> bool:
        """Has this gang a plan that still holds (checked against the cluster now)?"""
        current = self.plans.get(group_key)
        if current is None:
            return False
        self.check(current, self._clock())
        return group_key in self.plans

    def add(self, made: Plan) -> None:
        """Keep a new plan; a lower-priority gang's plan on its nodes gives way."""
        self._cancel_lower(made)
        self.plans[made.group] = made
        self._metrics.preemption_plan_evictions.observe(made.evictions)

    def reclaim(self, ref: GroupRef, priority: int, victims: Sequence[PodRecord]) -> None:
        """Record queue reclaim's victims as gang `ref`'s plan (a preemption plan gives way)."""
        now = self._clock()
        current = self.plans.get(ref.key)
        if current is not None and current.kind is not PlanKind.RECLAIM:
            self.end(current, PlanPhase.CANCELLED, "queue reclaim makes the room instead")
            current = None
        if current is None:
            current = Plan(
                ref,
                priority,
                now,
                self.deadline(now),
                [],
                {},
                0,
                PlanPhase.EVICTING,
                kind=PlanKind.RECLAIM,
            )
            self.plans[ref.key] = current
        for pod in victims:
            current.victims[pod.uid] = (pod.key, pod.placed_node)
            current.handed.add(pod.uid)
        current.evictions = len(current.victims)

    def stalled(self, group_key: str) -> tuple[list[str], float | None]:
        """The victims of the gang's live plan kube-scheduler was handed and has not started
        deleting (plan.stalled), handed now to our evictor; and in how many seconds to look
        again (None: no victim handed to kube-scheduler is left to watch)."""
        current = self.plans.get(group_key)
        if current is None or not self.lives(group_key):
            return [], None
        now = self._clock()
        due, again = stalled(self._state, current, now)
        if due:
            current.hand(due, now, ours=True)
        return due, again

    def check(self, current: Plan, now: float) -> None:
        """End the plan if the gang is whole, its deadline passed or a planned node is gone."""
        if not current.live:
            return
        ended = self._ended_by_cluster(current)
        if ended is not None:
            self.end(current, *ended)
            return
        remaining = [uid for uid in current.victims if still_there(self._state, uid)]
        if current.phase is PlanPhase.EVICTING and not remaining:
            current.phase = PlanPhase.PLACING
        if now > current.deadline:
            late = [current.victims[uid][0] for uid in remaining if uid in current.handed]
            why = (
                f"victim(s) {', '.join(sorted(late))} did not leave within {self.plan_seconds:g}s"
                if late
                else f"the members were not placed within {self.plan_seconds:g}s"
            )
            self.end(current, PlanPhase.EXPIRED, why)

    def _ended_by_cluster(self, current: Plan) -> tuple[PlanPhase, str] | None:
        """How the cluster ends the plan now: its gang whole, its group or every member gone,
        or a planned node gone."""
        try:
            spec = self._state.group_spec(current.ref)
        except (GroupNotFound, PodGroupSpecError):
            return PlanPhase.CANCELLED, "its group is gone or invalid"
        placed = len(self._state.placed_members(current.group))
        if not wholeness(spec, placed).missing:
            return PlanPhase.DONE, "the gang holds minMember"
        pods = self._state.group_pods(current.group)
        if not any(not p.terminal and not p.deleting for p in pods):
            # Its Job deleted; a PodGroup may outlive its pods (until its namespace goes).
            return PlanPhase.CANCELLED, "its members are gone"
        nodes = self._state.nodes
        gone = sorted(
            {s.node for s in current.slots if (n := nodes.get(s.node)) is None or n.unschedulable}
        )
        if gone:
            return PlanPhase.CANCELLED, f"node(s) {', '.join(gone)} gone or cordoned"
        taken = room_taken(self._state, current)
        if taken is not None:
            return PlanPhase.CANCELLED, (
                f"pods placed on {taken} since took the room planned there (before the "
                "members' nominations were seen); the gang plans again at its next try"
            )
        return None

    def end(self, current: Plan, phase: PlanPhase, reason: str) -> None:
        current.phase = phase
        current.reason = reason
        self.plans.pop(current.group, None)
        self._metrics.preemption_plans.labels(phase.value).inc()
        level = logging.INFO if phase is PlanPhase.DONE else logging.WARNING
        log.log(
            level,
            "preemption plan %s: %s",
            phase.value,
            reason,
            extra={"podgroup": current.group, "verb": "preempt"},
        )
        if phase is not PlanPhase.DONE:
            self._observer.preemption_ended(
                current.group, f"preemption plan {phase.value}: {reason}"
            )
        for listener in self.end_listeners:
            listener()

    def _cancel_lower(self, made: Plan) -> None:
        """A lower-priority gang's live plan on the same nodes, or drawing on the same shared
        device pools (app/runtime/preemption/room.py: its draw was not counted against this
        one), gives way to this one."""
        nodes = {s.node for s in made.slots}
        pools = {name for s in made.slots for name in s.pools}
        for other in self:
            if other.group != made.group and other.priority < made.priority and other.live:
                shared = nodes & {s.node for s in other.slots}
                drawn = pools & {name for s in other.slots for name in s.pools}
                if shared or drawn:
                    self.end(other, PlanPhase.CANCELLED, _gives_way(made.group, shared, drawn))


def _gives_way(group: str, nodes: set[str], pools: set[str]) -> str:
    """Why a lower-priority plan was cancelled: the nodes and shared pools it had in common."""
    where = ", ".join(sorted(nodes))
    drawn = ", ".join(sorted(pools))
    if not pools:
        return f"higher-priority gang {group} needs node(s) {where}"
    if not nodes:
        return f"higher-priority gang {group} needs devices of shared pool(s) {drawn}"
    return (
        f"higher-priority gang {group} needs node(s) {where} and devices of shared pool(s) {drawn}"
    )
