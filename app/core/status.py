"""PodGroup status: the gang's lifecycle phase and member counts, in each source's own shape.

Internal phases follow scheduler-plugins' PodGroup: Pending (not enough
members, or not admitted) -> PreScheduling (a member is reserved in the
permit gate) -> Scheduling (minMember bound, not yet running) -> Running
(minMember running) -> Finished (minMember succeeded), or Failed (a member
failed and fewer than minMember can still make it); Unknown when some
members are bound, fewer than minMember, and none waits (members lost after
the start). The phase is a pure function of the members' pod records
(compute_status), so it is the same after a restart and needs no history.

Each source writes its own shape (StatusShape): x-k8s PodGroups get exactly
the upstream fields (phase, running, succeeded, failed, scheduleStartTime)
so an upstream CRD keeps them, plus a `Scheduled` condition (our CRD has a
conditions field; `kubectl wait --for=condition=Scheduled`); Volcano
PodGroups get Volcano's phases (Pending, Inqueue, Running, Completed,
Unknown), counts and conditions, written on the object (Volcano's CRD has
no status subresource). Native PodGroups' status is kube-scheduler's
(PodGroupInitiallyScheduled): we leave it alone.

Each module keeping the status has one job: this one (pure) computes the
phase, renders each source's shape and the merge patch; app/core/group_views.py
gathers a group's inputs from the cache; the reconciler
(app/ops/status_reconciler.py) decides which groups to write and when, and
app/ops/status_write.py writes one, through the API calls of app/kube/status.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core.events import TOPOLOGY_PLACED
from app.core.groups import SOURCE_VOLCANO, SOURCE_XK8S
from app.core.records import PodRecord

PENDING = "Pending"
PRE_SCHEDULING = "PreScheduling"
SCHEDULING = "Scheduling"
RUNNING = "Running"
FINISHED = "Finished"
FAILED = "Failed"
UNKNOWN = "Unknown"
PHASES = (PENDING, PRE_SCHEDULING, SCHEDULING, RUNNING, FINISHED, FAILED, UNKNOWN)
TERMINAL = frozenset({FINISHED, FAILED})

# ---- the phase (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopologyPlacement:
    """Where a scheduled gang with a topology constraint is: the `TopologyPlaced` condition."""

    # Every bound member in one domain of the gang's levels.
    in_domain: bool
    # app/core/topology.placed_message: the domain, its level and the constraint.
    message: str


@dataclass(frozen=True, slots=True)
class GroupStatus:
    phase: str
    scheduled: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    # RFC 3339; when the first member started waiting in the gate.
    schedule_start_time: str | None = None
    # Set once the gang is scheduled, if it has a topology constraint.
    topology: TopologyPlacement | None = None

    def fields(self) -> dict[str, Any]:
        """The upstream scheduler-plugins status fields, as the API spells them."""
        out: dict[str, Any] = {
            "phase": self.phase,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
        }
        if self.schedule_start_time:
            out["scheduleStartTime"] = self.schedule_start_time
        return out

    @property
    def gang_scheduled(self) -> bool:
        """minMember were bound in this round (the `Scheduled` condition)."""
        return self.phase in (SCHEDULING, RUNNING, FINISHED)


def compute_status(
    min_member: int,
    pods: Iterable[PodRecord],
    waiting_in_gate: bool,
    previous: GroupStatus | None = None,
) -> GroupStatus:
    """The group's phase and counts from its members' pods (any phase).

    scheduled counts bound pods, running/succeeded/failed the pod phases;
    pods being deleted are leaving and count as neither scheduled nor
    running. Checked from the end of the lifecycle backwards, so a group
    whose members finished is Finished even though they are also bound.
    A Finished or Failed `previous` status is kept while no member is left
    that could still run: cleaning up a finished job's pods must not turn
    its PodGroup back to Pending. New members start a new round.
    """
    scheduled = running = succeeded = failed = alive = 0
    for pod in pods:
        if pod.terminal:
            # A finished member ran on its node: it was scheduled, deleting or not.
            scheduled += bool(pod.node_name)
            succeeded += pod.phase == "Succeeded"
            failed += pod.phase == "Failed"
        elif not pod.deleting:
            alive += 1
            scheduled += bool(pod.node_name)
            running += bool(pod.node_name) and pod.phase == "Running"
    if previous is not None and previous.phase in TERMINAL and not alive and not waiting_in_gate:
        return previous
    if succeeded >= min_member:
        phase = FINISHED
    elif failed and alive + succeeded < min_member:
        phase = FAILED
    elif running and running + succeeded >= min_member:
        phase = RUNNING
    elif scheduled >= min_member:
        phase = SCHEDULING
    elif waiting_in_gate:
        phase = PRE_SCHEDULING
    elif scheduled:
        phase = UNKNOWN
    else:
        phase = PENDING
    return GroupStatus(phase, scheduled, running, succeeded, failed)


# ---- each source's shape (pure) -----------------------------------------------------

_REASONS = {
    PENDING: "WaitingForMembers",
    PRE_SCHEDULING: "WaitingInPermitGate",
    SCHEDULING: "MinMemberBound",
    RUNNING: "MinMemberRunning",
    FINISHED: "MinMemberSucceeded",
    FAILED: "MemberFailed",
    UNKNOWN: "MembersLost",
}


def _message(status: GroupStatus) -> str:
    return (
        f"{status.scheduled} member(s) bound, {status.running} running, "
        f"{status.succeeded} succeeded, {status.failed} failed (gang-extender)"
    )


def _condition(
    kind: str, true: bool, status: GroupStatus, current: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """One condition; lastTransitionTime (and Volcano's transitionID) kept while unchanged."""
    value = "True" if true else "False"
    old = next(
        (
            c
            for c in current.get("conditions") or ()
            if isinstance(c, Mapping) and c.get("type") == kind
        ),
        None,
    )
    same = old is not None and old.get("status") == value
    out = {
        "type": kind,
        "status": value,
        "reason": _REASONS.get(status.phase, status.phase),
        "message": _message(status),
        "lastTransitionTime": old.get("lastTransitionTime") if same and old else now,
    }
    return out


def _topology_conditions(
    status: GroupStatus, current: Mapping[str, Any], now: str
) -> list[dict[str, Any]]:
    """`TopologyPlaced`: the domain and level a scheduled gang was placed in (none if no
    constraint or not scheduled yet); lastTransitionTime kept while unchanged."""
    placement = status.topology
    if placement is None:
        return []
    value = "True" if placement.in_domain else "False"
    old = next(
        (
            c
            for c in current.get("conditions") or ()
            if isinstance(c, Mapping) and c.get("type") == TOPOLOGY_PLACED
        ),
        None,
    )
    same = old is not None and old.get("status") == value
    return [
        {
            "type": TOPOLOGY_PLACED,
            "status": value,
            "reason": "InOneDomain" if placement.in_domain else "NotInOneDomain",
            "message": placement.message,
            "lastTransitionTime": old.get("lastTransitionTime") if same and old else now,
        }
    ]


class StatusShape(Protocol):
    def render(self, status: GroupStatus, current: Mapping[str, Any], now: str) -> dict[str, Any]:
        """The status fields we own, given what the object's status shows now."""

    def read(self, obj: Mapping[str, Any]) -> GroupStatus:
        """Our status as written on the object earlier (by us or a previous run)."""


def _count(status: Mapping[str, Any], name: str) -> int:
    value = status.get(name)
    return value if isinstance(value, int) else 0


class XK8sShape:
    """scheduler-plugins' PodGroup status, plus the `Scheduled` condition."""

    def render(self, status: GroupStatus, current: Mapping[str, Any], now: str) -> dict[str, Any]:
        fields = status.fields()
        if current.get("scheduleStartTime"):
            fields.pop("scheduleStartTime", None)
        fields["conditions"] = [
            _condition("Scheduled", status.gang_scheduled, status, current, now),
            *_topology_conditions(status, current, now),
        ]
        if "scheduled" in current:
            fields["scheduled"] = None  # written by gang-extender < 0.2; gone upstream
        return fields

    def read(self, obj: Mapping[str, Any]) -> GroupStatus:
        status = obj.get("status") or {}
        return GroupStatus(
            str(status.get("phase") or PENDING),
            0,
            _count(status, "running"),
            _count(status, "succeeded"),
            _count(status, "failed"),
            status.get("scheduleStartTime") or None,
        )


_VOLCANO_PHASES = {
    PENDING: "Pending",
    PRE_SCHEDULING: "Inqueue",
    SCHEDULING: "Running",
    RUNNING: "Running",
    FINISHED: "Completed",
    FAILED: "Unknown",
    UNKNOWN: "Unknown",
}


class VolcanoShape:
    """Volcano's PodGroup status: its phases, counts, and a Scheduled/Unschedulable condition."""

    def render(self, status: GroupStatus, current: Mapping[str, Any], now: str) -> dict[str, Any]:
        kind = "Scheduled" if status.gang_scheduled else "Unschedulable"
        condition = _condition(kind, True, status, current, now)
        old = next((c for c in current.get("conditions") or () if isinstance(c, Mapping)), None)
        same = old is not None and old.get("type") == kind
        condition["transitionID"] = (
            str(old.get("transitionID") or "") if same and old else str(uuid.uuid4())
        )
        return {
            "phase": _VOLCANO_PHASES[status.phase],
            "running": status.running,
            "succeeded": status.succeeded,
            "failed": status.failed,
            "conditions": [condition, *_topology_conditions(status, current, now)],
        }

    def read(self, obj: Mapping[str, Any]) -> GroupStatus:
        status = obj.get("status") or {}
        phase = {"Completed": FINISHED, "Running": RUNNING, "Inqueue": PRE_SCHEDULING}.get(
            str(status.get("phase") or ""), PENDING
        )
        return GroupStatus(
            phase,
            running=_count(status, "running"),
            succeeded=_count(status, "succeeded"),
            failed=_count(status, "failed"),
        )


SHAPES: dict[str, StatusShape] = {SOURCE_XK8S: XK8sShape(), SOURCE_VOLCANO: VolcanoShape()}


def _same(old: Any, new: Any) -> bool:
    """Equal, comparing conditions without Volcano's random transitionID."""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return all(
            isinstance(a, Mapping) and isinstance(b, Mapping) and _strip(a) == _strip(b)
            for a, b in zip(old, new, strict=True)
        )
    return bool(old == new)


def _strip(condition: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in condition.items() if k != "transitionID"}


def status_patch(
    current: Mapping[str, Any],
    wanted: GroupStatus,
    shape: StatusShape | None = None,
    *,
    now: str,
) -> dict[str, Any] | None:
    """The merge patch that makes `current` (a group object) show `wanted`; None if it already does.

    Carries only the fields that differ, plus metadata.uid and
    resourceVersion as preconditions. A scheduleStartTime already on the
    object (written before a restart) is kept.
    """
    meta = current.get("metadata") or {}
    status = current.get("status") or {}
    fields = (shape or SHAPES[SOURCE_XK8S]).render(wanted, status, now)
    changed = {k: v for k, v in fields.items() if not _same(status.get(k), v)}
    if not changed:
        return None
    return {
        "metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
        "status": changed,
    }


def status_from_object(obj: Mapping[str, Any], shape: StatusShape | None = None) -> GroupStatus:
    """Our fields of a group's status, as written earlier (by us or a previous run)."""
    return (shape or SHAPES[SOURCE_XK8S]).read(obj)


@dataclass(frozen=True, slots=True)
class GroupView:
    """What we know of one group: for the status write, /debug/gangs and the metric."""

    key: str
    source: str
    min_member: int
    members: int
    status: GroupStatus
    # Volcano queue and priorityClassName (native: priorityClassName): shown, not enforced.
    queue: str | None = None
    priority_class_name: str | None = None
