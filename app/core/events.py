"""Kubernetes Events for gangs, the rules: what each Event says, and on which object.

kube-scheduler already puts FailedScheduling and Scheduled events on pods;
these add what only the extender knows, on the PodGroup (so `kubectl
describe podgroup` tells the gang's story) and, where a single pod is
affected, on that pod. Label-only groups have no object: their events go on
the pods.

Four modules make an Event, one job each: this one (pure) decides what an
Event says (GangEvents turns the gate's and filter's reports into reasons
and messages); app/core/event_aggregation.py decides how repeats aggregate
and which are dropped, and the body written; app/ops/event_recorder.py sends
them; app/kube/events.py is the API writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.core import composite
from app.core.admission import FilterReason, WaitPolicy
from app.core.event_aggregation import (
    ObjectRef,
)
from app.core.groups import GROUP_APIS, GroupSpec
from app.core.observer import MemberRef
from app.core.records import PodGroupRecord, PodRecord
from app.core.state import ClusterState

__all__ = ["GangEvents", "Recorder", "pod_ref", "podgroup_ref"]

NORMAL = "Normal"
WARNING = "Warning"

WAITING_FOR_SIBLINGS = "WaitingForSiblings"
GANG_WAITING = "GangWaiting"
GANG_ADMITTED = "GangAdmitted"
GANG_TIMED_OUT = "GangTimedOut"
GANG_BIND_ROLLED_BACK = "GangBindRolledBack"
GANG_PARTLY_BOUND = "GangPartlyBound"
INVALID_POD_GROUP = "InvalidPodGroup"
INSUFFICIENT_RESOURCES = "InsufficientResources"
GANG_QUEUED = "GangQueued"
GANG_RELEASED = "GangReleased"
GANG_RECLAIMED = "GangReclaimed"
PREEMPTED = "Preempted"
PREEMPTION_PLANNED = "PreemptionPlanned"
TOPOLOGY_PLACED = "TopologyPlaced"
GANG_HELD = "GangHeldInLine"
PREEMPTION_ENDED = "PreemptionPlanEnded"
PREEMPTION_REFUSED = "PreemptionRefused"
GANG_MEMBER_NOT_MARKED = "GangMemberNotMarked"
PREEMPTOR_NOT_MARKED = "PreemptorNotMarked"

_MAX_NAMES = 10


# ---- what an Event is about ----------------------------------------------------


def pod_ref(member: MemberRef) -> ObjectRef:
    return ObjectRef("Pod", "v1", member.namespace, member.name, member.uid)


def podgroup_ref(record: PodGroupRecord) -> ObjectRef:
    if record.composite:
        kind, version = composite.COMPOSITE_KIND, composite.COMPOSITE_API_VERSION
        return ObjectRef(kind, version, record.namespace, record.name, record.uid)
    api = GROUP_APIS[record.source]
    return ObjectRef(api.kind, api.api_version, record.namespace, record.name, record.uid)


# ---- the observer ----------------------------------------------------------------------


class Recorder(Protocol):
    def record(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


# Bound on the groups GangEvents remembers as told GangWaiting.
_MAX_TOLD = 10_000
# Bound on the groups whose Events wait for a first member in the watch.
_MAX_UNSEEN = 1_000


class GangEvents:
    """GangObserver: turns the gate's and filter's reports into Events users can act on."""

    def __init__(
        self,
        state: ClusterState,
        recorder: Recorder,
        wait: WaitPolicy,
        retry_after_seconds: float,
    ) -> None:
        self._state = state
        self._recorder = recorder
        self._wait = wait
        self._retry = retry_after_seconds
        # Groups told GangWaiting in their current admission (until admitted,
        # timed out or released): one event per admission, not one per member.
        # Per member, it was an Event write per gang pod, as costly as the
        # binding itself (bench/e2e.py's profile); the PodGroup's status counts
        # the members as they come.
        self._waiting_told: set[str] = set()
        # Events about a group with no object and no member in our watch yet, by group
        # (oldest first): recorded on its first member the watch delivers.
        self._unseen: dict[str, list[tuple[str, str, str]]] = {}

    def member_rejected(
        self, member: MemberRef, group_key: str, reason: str, message: str, *, held: bool = False
    ) -> None:
        """The filter turned a member away, or kube-scheduler holds one before any filter (then
        on the pod too); the filter's message, with what to do about it."""
        if reason == FilterReason.TOO_FEW_SIBLINGS:
            self._on_group(
                group_key,
                [member],
                NORMAL,
                WAITING_FOR_SIBLINGS,
                f"{message}; create the missing pods, or lower minMember",
                pods=held,
            )
        elif reason == FilterReason.BAD_GROUP:
            self._on_group(
                group_key,
                [member],
                WARNING,
                INVALID_POD_GROUP,
                f"{message}; its pods are turned away until the PodGroup is fixed",
                pods=held,
            )
        elif reason == FilterReason.MIN_RESOURCES:
            self._on_group(
                group_key,
                [member],
                WARNING,
                INSUFFICIENT_RESOURCES,
                f"{message}; checked again in {self._retry:g}s: free that much capacity "
                "(or lower spec.minResources) for the gang to start",
                pods=held,
            )
        elif reason == FilterReason.WAITING_BEHIND:
            self._on_group(group_key, [member], NORMAL, GANG_QUEUED, message, pods=held)
        elif reason == FilterReason.INSUFFICIENT_CAPACITY:
            self._on_group(
                group_key,
                [member],
                WARNING,
                INSUFFICIENT_RESOURCES,
                f"{message}; nothing is reserved until all of them fit: free capacity, or "
                "lower minMember",
                pods=held,
            )

    def member_held(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        """A member kube-scheduler holds before any filter: as a rejection, on its pod too."""
        self.member_rejected(member, group_key, reason, message, held=True)

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        """The first member of an admission was reserved on a node and waits in the permit gate
        (once per admission; the PodGroup's status counts the members that follow)."""
        if group_key in self._waiting_told:
            return
        if len(self._waiting_told) >= _MAX_TOLD:
            self._waiting_told.clear()  # groups deleted mid-admission never end theirs
        self._waiting_told.add(group_key)
        wait = self._wait_seconds(group_key, needed)
        self._on_group(
            group_key,
            [member],
            NORMAL,
            GANG_WAITING,
            f"{present} of minMember {needed} members placed; waiting up to {wait:g}s in the "
            f"permit gate for the rest (all are bound together once {needed} are placed)",
        )

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        """The gate opened and the members were bound together."""
        self._waiting_told.discard(group_key)
        longest = max((m.waited_seconds for m in bound), default=0.0)
        self._on_group(
            group_key,
            bound,
            NORMAL,
            GANG_ADMITTED,
            f"gang {group_key} admitted: {len(bound)} member(s) bound together "
            f"({_names(bound)}) after up to {longest:.1f}s in the permit gate",
        )

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        # kube-scheduler already reports the failed binding on the pod (FailedScheduling).
        return None

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        """The gate's wait ran out; every waiting member was released."""
        self._waiting_told.discard(group_key)
        text = (
            f"{message}; the group is retried in {self._retry:g}s. If it never completes, "
            "check that minMember pods exist and that the cluster can hold all of them at once "
            "(kubectl describe pods)"
        )
        self._on_group_and_pods(group_key, released, GANG_TIMED_OUT, text)

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        """A binding was refused after the gate opened, leaving the gang below minMember: its
        bound members are deleted (--on-partial-bind=delete-bound) or stay bound (leave)."""
        self._waiting_told.discard(group_key)
        reason = GANG_BIND_ROLLED_BACK if rolled_back else GANG_PARTLY_BOUND
        text = f"gang {group_key} was admitted but {message}"
        self._on_group_and_pods(group_key, bound, reason, text)

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        """A member of a gang holding a claim found no node (fail fast), or a higher-priority
        gang took the capacity: the gang's reservations were released at once."""
        self._waiting_told.discard(group_key)
        self._on_group_and_pods(group_key, released, GANG_RELEASED, message)

    def gang_reclaimed(self, group_key: str, evicted: Sequence[MemberRef], message: str) -> None:
        """The gang is evicted whole so that a queue below its deserved share gets room."""
        self._on_group_and_pods(group_key, evicted, GANG_RECLAIMED, message)

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        """kube-scheduler's preemption (or --gang-victim-policy=whole-gang) evicts this pod."""
        if by in self._state.podgroups or self._state.members(by):
            beneficiary = f"gang {by}"
        elif by in self._state.pods:
            beneficiary = f"pod {by}"
        else:
            beneficiary = by
        text = f"evicted by kube-scheduler's preemption so that {beneficiary} can be placed"
        if victim_group is not None:
            text += f" (this pod was a member of gang {victim_group})"
        self._recorder.record(pod_ref(victim), WARNING, PREEMPTED, text)

    def preemption_planned(self, group_key: str, message: str) -> None:
        """A gang's first preempting member made the gang's plan."""
        self._on_group(group_key, self._pending(group_key), NORMAL, PREEMPTION_PLANNED, message)

    def preemption_ended(self, group_key: str, message: str) -> None:
        """The plan expired or was cancelled before the gang held minMember."""
        self._on_group(group_key, self._pending(group_key), WARNING, PREEMPTION_ENDED, message)

    def preemption_refused(self, group_key: str, message: str) -> None:
        """The gang asked to preempt but may evict nothing (once per reason)."""
        self._on_group(group_key, self._pending(group_key), WARNING, PREEMPTION_REFUSED, message)

    def gang_placed(self, group_key: str, message: str) -> None:
        """A gang with a topology constraint was admitted in one domain (or, preferred,
        anywhere)."""
        self._on_group(group_key, self._pending(group_key), NORMAL, TOPOLOGY_PLACED, message)

    def gang_held(self, group_key: str, message: str) -> None:
        """--hold-waiting-gangs: the gang waits in line with its members out of kube-scheduler's
        queue (their PodScheduled condition says only SchedulingGated), so this says why."""
        self._on_group(group_key, self._pending(group_key), NORMAL, GANG_HELD, message)

    def member_not_marked(self, member: MemberRef, group_key: str, message: str) -> None:
        """gang-only mode: a pending member of our schedulers has no gang-extender.dev/member
        mark (webhook down and no policy refused it), so kube-scheduler may bind it alone
        without calling us. On the pod itself (app/runtime/unmarked.py)."""
        self._recorder.record(pod_ref(member), WARNING, GANG_MEMBER_NOT_MARKED, message)

    def preemptor_not_marked(self, pod: MemberRef, message: str) -> None:
        """--expect-marked-preemptors: a pending plain pod that may preempt has no
        gang-extender.dev/preemptor mark, so kube-scheduler would preempt for it without
        asking us. On the pod itself (app/runtime/unmarked.py)."""
        self._recorder.record(pod_ref(pod), WARNING, PREEMPTOR_NOT_MARKED, message)

    # ---- helpers -----------------------------------------------------------------------

    def _pending(self, group_key: str) -> list[MemberRef]:
        """A label-only gang's Events go on its members still waiting for a node."""
        return [
            MemberRef(p.namespace, p.name, p.uid)
            for p in self._state.members(group_key)
            if not p.placed_node
        ]

    def _on_group(
        self,
        group_key: str,
        members: Sequence[MemberRef],
        type_: str,
        reason: str,
        message: str,
        *,
        pods: bool = False,
    ) -> None:
        """On the PodGroup (and the pods concerned: `pods`); for a group with no object, them."""
        record = self._state.podgroups.get(group_key)
        if record is not None:
            self._recorder.record(podgroup_ref(record), type_, reason, message)
            for member in members if pods else ():
                self._recorder.record(pod_ref(member), type_, reason, message)
            return
        if not members and not self._state.members(group_key):
            # No object and no member in our watch yet (the filter may see the leader
            # first): kept for the first member the watch delivers (on_pod_change).
            if len(self._unseen) >= _MAX_UNSEEN:
                del self._unseen[next(iter(self._unseen))]
            self._unseen.setdefault(group_key, []).append((type_, reason, message))
            return
        for member in members:
            self._recorder.record(pod_ref(member), type_, reason, message)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A group's first member reaches our watch: the Events kept for it go on it."""
        if not self._unseen or new is None or old is not None or new.group is None:
            return
        kept = self._unseen.pop(new.group.key, None)
        if kept:
            self._tell_late(MemberRef(new.namespace, new.name, new.uid), kept)

    def _tell_late(self, member: MemberRef, kept: list[tuple[str, str, str]]) -> None:
        """The Events kept for a group (each listed under its own reason) on its member."""
        for type_, reason, message in kept:
            self._recorder.record(pod_ref(member), type_, reason, message)

    def _on_group_and_pods(
        self, group_key: str, members: Sequence[MemberRef], reason: str, message: str
    ) -> None:
        """A warning every member concerned sees, on its pod, as well as on the PodGroup."""
        record = self._state.podgroups.get(group_key)
        if record is not None:
            self._recorder.record(podgroup_ref(record), WARNING, reason, message)
        for member in members:
            self._recorder.record(pod_ref(member), WARNING, reason, message)

    def _wait_seconds(self, group_key: str, needed: int) -> float:
        record = self._state.podgroups.get(group_key)
        spec = record.spec if record is not None and record.spec is not None else None
        return self._wait.for_group(spec or GroupSpec(group_key, needed))


def _names(members: Sequence[MemberRef]) -> str:
    names = sorted(m.name for m in members)
    shown = ", ".join(names[:_MAX_NAMES])
    return shown if len(names) <= _MAX_NAMES else f"{shown} and {len(names) - _MAX_NAMES} more"
