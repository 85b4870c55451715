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

Writes are JSON merge patches carrying metadata.resourceVersion (on 409 we
read again and retry) and only the fields we own: never occupiedBy or
anything else another controller keeps there. They are batched: pod changes
and gate reports only mark a group dirty; a tick computes dirty groups and
writes one when its status differs from what we last wrote and its previous
write is at least `min_interval_seconds` old, so a gang of 100 pods starting
at once costs a few writes, not 100 per second. A periodic resync marks
every group dirty, which writes the first status of new PodGroups and
repairs anything a missed report left behind. Only the leader writes (see
app/leader.py). Label-only groups have no object: their status is kept in
memory, for /debug/gangs and the gang_extender_podgroups metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.groups import SOURCE_LABELS, SOURCE_VOLCANO, SOURCE_XK8S, XK8S_API, GroupApi
from app.kube_api import raw_request
from app.metrics import Metrics
from app.observer import MemberRef
from app.state import ClusterState, PodRecord

log = logging.getLogger(__name__)

PENDING = "Pending"
PRE_SCHEDULING = "PreScheduling"
SCHEDULING = "Scheduling"
RUNNING = "Running"
FINISHED = "Finished"
FAILED = "Failed"
UNKNOWN = "Unknown"
PHASES = (PENDING, PRE_SCHEDULING, SCHEDULING, RUNNING, FINISHED, FAILED, UNKNOWN)
TERMINAL = frozenset({FINISHED, FAILED})

_STOP_WAIT_SECONDS = 5.0

# ---- the phase (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupStatus:
    phase: str
    scheduled: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    # RFC 3339; when the first member started waiting in the gate.
    schedule_start_time: str | None = None

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
            _condition("Scheduled", status.gang_scheduled, status, current, now)
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
            "conditions": [condition],
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
    now: str = "",
) -> dict[str, Any] | None:
    """The merge patch that makes `current` (a group object) show `wanted`; None if it already does.

    Carries only the fields that differ, plus metadata.uid and
    resourceVersion as preconditions. A scheduleStartTime already on the
    object (written before a restart) is kept.
    """
    meta = current.get("metadata") or {}
    status = current.get("status") or {}
    fields = (shape or SHAPES[SOURCE_XK8S]).render(wanted, status, now or _timestamp(time.time()))
    changed = {k: v for k, v in fields.items() if not _same(status.get(k), v)}
    if not changed:
        return None
    return {
        "metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
        "status": changed,
    }


# ---- the API side ---------------------------------------------------------------------


class StatusConflict(Exception):
    """409: the object changed since we read it."""


class StatusApi(Protocol):
    """Blocking calls on a group object's status (run on worker threads)."""

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as JSON, None if it does not exist."""

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """JSON merge patch of the status; StatusConflict on 409."""


class KubeStatusApi:
    """Status of one source's objects: the status subresource, or the object itself (Volcano).

    Plain requests on the official client's connection pool: the generated
    client's per-call validation cost more CPU than the request itself.
    """

    def __init__(
        self,
        custom: k8s.CustomObjectsApi,
        api: GroupApi = XK8S_API,
        *,
        timeout_seconds: float = 10,
    ) -> None:
        self._client: k8s.ApiClient = custom.api_client
        self._api = api
        self._timeout = timeout_seconds

    def _path(self, namespace: str, name: str) -> str:
        api = self._api
        path = (
            f"/apis/{api.group}/{api.version}/namespaces/{quote(namespace, safe='')}"
            f"/{api.plural}/{quote(name, safe='')}"
        )
        return path + "/status" if api.status_subresource else path

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            data = raw_request(
                self._client, "GET", self._path(namespace, name), timeout=self._timeout
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        obj: dict[str, Any] = json.loads(data)
        return obj

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        try:
            raw_request(
                self._client,
                "PATCH",
                self._path(namespace, name),
                body,
                content_type="application/merge-patch+json",
                timeout=self._timeout,
            )
        except ApiException as err:
            if err.status == 409:
                raise StatusConflict(name) from None
            raise


WRITTEN, UNCHANGED, KEPT, GONE, CONFLICT = "written", "unchanged", "kept", "gone", "conflict"


def status_from_object(obj: Mapping[str, Any], shape: StatusShape | None = None) -> GroupStatus:
    """Our fields of a group's status, as written earlier (by us or a previous run)."""
    return (shape or SHAPES[SOURCE_XK8S]).read(obj)


def write_status(
    api: StatusApi,
    namespace: str,
    name: str,
    uid: str,
    wanted: GroupStatus,
    *,
    shape: StatusShape | None = None,
    keep_terminal: bool = False,
    attempts: int = 3,
) -> tuple[str, GroupStatus | None]:
    """Read, compare, patch; re-read and retry on a conflict. Blocking.

    keep_terminal (no member left that could run): a Finished or Failed
    status on the object stays, and is returned with KEPT. This is how a
    restarted extender, which never saw the gang's pods, learns the outcome.
    """
    for _ in range(attempts):
        current = api.read(namespace, name)
        if current is None or (current.get("metadata") or {}).get("uid") != uid:
            return GONE, None
        shown = status_from_object(current, shape)
        if keep_terminal and shown.phase in TERMINAL:
            return KEPT, shown
        patch = status_patch(current, wanted, shape)
        if patch is None:
            return UNCHANGED, wanted
        try:
            api.patch(namespace, name, patch)
        except StatusConflict:
            continue
        return WRITTEN, wanted
    return CONFLICT, None


# ---- the reconciler -------------------------------------------------------------------


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


class PodGroupStatus:
    """GangObserver and periodic reconciler of PodGroup status (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        api: StatusApi,
        executor: Executor,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        min_interval_seconds: float = 1.0,
        resync_seconds: float = 10.0,
        tick_seconds: float = 0.2,
        apis: Mapping[str, StatusApi] | None = None,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self._state = state
        # source -> its status API; a source without one (native: kube-scheduler's) is not written.
        self._apis: dict[str, StatusApi] = {SOURCE_XK8S: api, **(apis or {})}
        self._is_leader = is_leader
        self._was_leader = False
        self._executor = executor
        self._metrics = metrics
        self._clock = clock
        self._min_interval = min_interval_seconds
        self._resync = resync_seconds
        self._tick = tick_seconds
        # group key -> pod key -> record, every phase (ClusterState.members skips finished ones).
        self._pods: dict[str, dict[str, PodRecord]] = {}
        self.groups: dict[str, GroupView] = {}
        self._written: dict[str, GroupStatus] = {}
        self._uids: dict[str, str] = {}
        self._start_times: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._in_flight: set[str] = set()
        self._last_write: dict[str, float] = {}
        self._next_resync = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Future[tuple[str, GroupStatus | None]]] = set()

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop ticking and let writes in flight finish, for a few seconds at most: an
        unreachable API server must not hold shutdown up for the client's retries."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=_STOP_WAIT_SECONDS)

    async def _run(self) -> None:
        while True:
            try:
                self.reconcile()
            except Exception:
                log.exception("PodGroup status reconcile failed")
            await asyncio.sleep(self._tick)

    # ---- observer: reports only mark groups dirty -----------------------------------------

    def member_rejected(self, member: MemberRef, group_key: str, reason: str, message: str) -> None:
        self._dirty.add(group_key)

    def member_waiting(self, member: MemberRef, group_key: str, present: int, needed: int) -> None:
        if group_key not in self._start_times:
            self._start_times[group_key] = _timestamp(self._clock())
        self._dirty.add(group_key)

    def gang_admitted(self, group_key: str, bound: Sequence[MemberRef]) -> None:
        self._dirty.add(group_key)

    def bind_failed(self, member: MemberRef, group_key: str | None, message: str) -> None:
        if group_key is not None:
            self._dirty.add(group_key)

    def gang_timed_out(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def gang_partly_bound(
        self, group_key: str, bound: Sequence[MemberRef], message: str, rolled_back: bool
    ) -> None:
        self._dirty.add(group_key)

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        if victim_group is not None:
            self._dirty.add(victim_group)

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if old is not None and old.group is not None:
            members = self._pods.get(old.group.key)
            if members is not None and members.get(old.key) is old:
                del members[old.key]
                if not members:
                    del self._pods[old.group.key]
            self._dirty.add(old.group.key)
        if new is not None and new.group is not None:
            self._pods.setdefault(new.group.key, {})[new.key] = new
            self._dirty.add(new.group.key)

    # ---- reconcile ----------------------------------------------------------------------

    def reconcile(self) -> None:
        """Compute dirty groups; write those that changed and may be written now."""
        now = self._clock()
        leader = self._is_leader()
        if leader and not self._was_leader:
            # Newly elected: the standby wrote nothing, so look at every group now.
            self._next_resync = -math.inf
        self._was_leader = leader
        if now >= self._next_resync:
            self._next_resync = now + self._resync
            self._dirty.update(self._state.podgroups, self._pods, self.groups)
        for key in list(self._dirty):
            view = self._compute(key)
            if view is None:
                self._forget(key)
                continue
            self.groups[key] = view
            if view.source not in self._apis or not leader or self._written.get(key) == view.status:
                self._dirty.discard(key)
                continue
            if key in self._in_flight or now - self._last_write.get(key, -math.inf) < (
                self._min_interval
            ):
                continue  # stays dirty: written on a later tick
            self._dirty.discard(key)
            self._write(key, view, now)
        counts = dict.fromkeys(PHASES, 0)
        for view in self.groups.values():
            counts[view.status.phase] = counts.get(view.status.phase, 0) + 1
        for phase, count in counts.items():
            self._metrics.podgroups.labels(phase).set(count)

    def _compute(self, key: str) -> GroupView | None:
        pods = list(self._pods.get(key, {}).values())
        record = self._state.podgroups.get(key)
        if record is not None:
            if record.spec is None:
                return None
            known_uid = self._uids.get(key)
            if known_uid != record.uid:
                # Recreated under the same name: nothing of the old object applies.
                if known_uid is not None:
                    self._start_times.pop(key, None)
                self._written.pop(key, None)
                self.groups.pop(key, None)
                self._uids[key] = record.uid
            source, min_member = record.source, record.spec.min_member
            queue, priority_class = record.spec.queue, record.spec.priority_class_name
        else:
            label_min = [p.group.min_available for p in pods if p.group and p.group.min_available]
            if not label_min:
                return None  # no such group, or pods naming a PodGroup that does not exist
            source, min_member = SOURCE_LABELS, max(label_min)
            queue = priority_class = None
        waiting = any(p.reserved_node and not p.node_name for p in pods)
        previous = self.groups.get(key)
        status = compute_status(min_member, pods, waiting, previous.status if previous else None)
        start = self._start_times.get(key)
        if start is not None and status.schedule_start_time is None:
            status = dataclasses.replace(status, schedule_start_time=start)
        members = sum(1 for p in pods if p.counts_as_member)
        return GroupView(key, source, min_member, members, status, queue, priority_class)

    def _forget(self, key: str) -> None:
        self._dirty.discard(key)
        self.groups.pop(key, None)
        self._written.pop(key, None)
        self._uids.pop(key, None)
        self._start_times.pop(key, None)
        self._last_write.pop(key, None)

    def _write(self, key: str, view: GroupView, now: float) -> None:
        record = self._state.podgroups[key]
        self._in_flight.add(key)
        self._last_write[key] = now
        # Nothing left that could run: a Finished/Failed outcome on the object stays.
        keep_terminal = view.members == 0 and view.status.phase not in (
            PRE_SCHEDULING,
            *TERMINAL,
        )
        write = functools.partial(
            write_status,
            self._apis[record.source],
            record.namespace,
            record.name,
            record.uid,
            view.status,
            shape=SHAPES[record.source],
            keep_terminal=keep_terminal,
        )
        future = asyncio.get_running_loop().run_in_executor(self._executor, write)
        self._writes.add(future)
        future.add_done_callback(lambda f: self._written_back(key, record.uid, f))

    def _written_back(
        self, key: str, uid: str, future: asyncio.Future[tuple[str, GroupStatus | None]]
    ) -> None:
        self._writes.discard(future)
        self._in_flight.discard(key)
        if future.cancelled():
            return
        error = future.exception()
        outcome, shown = future.result() if error is None else ("failed", None)
        if outcome in ("failed", CONFLICT):
            self._metrics.status_writes.labels(outcome).inc()
            log.warning(
                "writing status of PodGroup %s failed, retrying: %s",
                key,
                error or "conflicting updates",
                extra={"podgroup": key},
            )
            self._dirty.add(key)  # retried after min_interval
            return
        if shown is None or self._uids.get(key) != uid:
            return  # gone, or recreated meanwhile
        self._written[key] = shown
        view = self.groups.get(key)
        if outcome == KEPT and view is not None:
            self.groups[key] = dataclasses.replace(view, status=shown)
        if outcome == WRITTEN:
            self._metrics.status_writes.labels(WRITTEN).inc()
            log.debug("PodGroup status: %s", shown.phase, extra={"podgroup": key})


def _timestamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
