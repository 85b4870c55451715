"""What the verbs report as gangs move: the seam for Events, PodGroup status and logs.

The gate and the filter call these methods at each step of a gang's life;
GangEvents (app/core/events.py) and PodGroupStatus (app/ops/status_reconciler.py)
implement them. Calls happen on the event loop and must not block:
implementations queue their API writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MemberRef:
    """A gang member as reported to observers."""

    namespace: str
    name: str
    uid: str
    node: str = ""
    waited_seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class GangObserver(Protocol):
    def member_rejected(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        """filter turned a member away (too-few-siblings, denied, min-resources, ...)."""

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        """kube-scheduler's queue holds a member before any verb of ours (its own gang
        gate, a tree it cannot root): what our filter would have said, which no
        FailedScheduling will carry (app/runtime/held_members.py)."""

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        """A member was reserved on member.node and waits in the gate."""

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        """The gate opened: these members were bound (failures are reported separately)."""

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        """Binding a member (or a plain pod) failed."""

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        """The gate's wait ran out: every waiting member was released."""

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        """Bindings failed after the gate opened and the gang is below minMember bound.

        `rolled_back`: the members in `bound` are being deleted
        (--on-partial-bind=delete-bound); otherwise they stay bound.
        """

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        """A pod is being evicted so that `by` (a pod or gang key) can be placed."""

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        """The gang's reservations were released before its timeout (fail fast, gave way)."""

    def gang_reclaimed(self, group_key: str, evicted: Sequence[MemberRef], message: str) -> None:
        """The whole gang is being evicted so that another queue gets its share back."""

    def preemption_planned(self, group_key: str, message: str) -> None:
        """The gang's preemption plan was made: `message` names its nodes and victims."""

    def preemption_ended(self, group_key: str, message: str) -> None:
        """The gang's preemption plan expired or was cancelled before the gang was whole."""

    def preemption_refused(self, group_key: str, message: str) -> None:
        """The gang asked to preempt and may evict nothing (why, for its users)."""

    def gang_placed(self, group_key: str, message: str) -> None:
        """A gang with a topology constraint was admitted in one domain (`message` names it)."""

    def gang_held(self, group_key: str, message: str) -> None:
        """The gang's members are held out of kube-scheduler's queue while it waits in line."""


class NullObserver:
    """Reports nowhere; the default when nothing is wired."""

    def member_rejected(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        return None

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        return None

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        return None

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        return None

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        return None

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        return None

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        return None

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        return None

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        return None

    def gang_reclaimed(self, group_key: str, evicted: Sequence[MemberRef], message: str) -> None:
        return None

    def preemption_planned(self, group_key: str, message: str) -> None:
        return None

    def preemption_ended(self, group_key: str, message: str) -> None:
        return None

    def preemption_refused(self, group_key: str, message: str) -> None:
        return None

    def gang_placed(self, group_key: str, message: str) -> None:
        return None

    def gang_held(self, group_key: str, message: str) -> None:
        return None


class Observers:
    """Fans every report out to several observers (events, status, ...)."""

    def __init__(self, *observers: GangObserver) -> None:
        self._observers = observers

    def member_rejected(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        for o in self._observers:
            o.member_rejected(member, group_key, reason, message)

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        for o in self._observers:
            o.member_held(member, group_key, reason, message)

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        for o in self._observers:
            o.member_waiting(member, group_key, present, needed)

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        for o in self._observers:
            o.gang_admitted(group_key, bound)

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        for o in self._observers:
            o.bind_failed(member, group_key, message)

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        for o in self._observers:
            o.gang_timed_out(group_key, released, message)

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        for o in self._observers:
            o.gang_partly_bound(group_key, bound, message, rolled_back)

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        for o in self._observers:
            o.victim_preempted(victim, victim_group, by)

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        for o in self._observers:
            o.gang_released(group_key, released, message)

    def gang_reclaimed(self, group_key: str, evicted: Sequence[MemberRef], message: str) -> None:
        for o in self._observers:
            o.gang_reclaimed(group_key, evicted, message)

    def preemption_planned(self, group_key: str, message: str) -> None:
        for o in self._observers:
            o.preemption_planned(group_key, message)

    def preemption_ended(self, group_key: str, message: str) -> None:
        for o in self._observers:
            o.preemption_ended(group_key, message)

    def preemption_refused(self, group_key: str, message: str) -> None:
        for o in self._observers:
            o.preemption_refused(group_key, message)

    def gang_placed(self, group_key: str, message: str) -> None:
        for o in self._observers:
            o.gang_placed(group_key, message)

    def gang_held(self, group_key: str, message: str) -> None:
        for o in self._observers:
            o.gang_held(group_key, message)
