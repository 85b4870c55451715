"""PodGroup status: the gang's lifecycle phase and member counts, as `kubectl get podgroup` shows.

Phases: Pending (not enough members, or not admitted) -> Scheduling (a
member is reserved in the permit gate) -> Scheduled (minMember bound) ->
Running (minMember running) -> Finished (minMember succeeded), or Failed (a
member failed and fewer than minMember can still make it). The phase is a
pure function of the members' pod records (compute_status), so it is the
same after a restart and needs no history.

Writes go through the status subresource as a JSON merge patch carrying
metadata.resourceVersion (on 409 we read again and retry) and only the fields
we own: never occupiedBy or anything else another controller keeps there.
They are batched: pod changes and gate reports only mark a group dirty; a
tick computes dirty groups and writes one when its status differs from what
we last wrote and its previous write is at least `min_interval_seconds`
old, so a gang of 100 pods starting at once costs a few writes, not 100 per
second. A periodic resync marks every group dirty, which writes the first
status of new PodGroups and repairs anything a missed report left behind.
Label-only groups have no object: their status is kept in memory, for
/debug/gangs and the gang_extender_podgroups metric.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.groups import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from app.kube_api import read_and_release
from app.metrics import Metrics
from app.observer import MemberRef
from app.state import ClusterState, PodRecord

log = logging.getLogger(__name__)

PENDING = "Pending"
SCHEDULING = "Scheduling"
SCHEDULED = "Scheduled"
RUNNING = "Running"
FINISHED = "Finished"
FAILED = "Failed"
PHASES = (PENDING, SCHEDULING, SCHEDULED, RUNNING, FINISHED, FAILED)
TERMINAL = frozenset({FINISHED, FAILED})

_STOP_WAIT_SECONDS = 5.0

SOURCE_PODGROUP = "podgroup"
SOURCE_LABELS = "labels"

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
        """The status fields we own, as the API spells them."""
        out: dict[str, Any] = {
            "phase": self.phase,
            "scheduled": self.scheduled,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
        }
        if self.schedule_start_time:
            out["scheduleStartTime"] = self.schedule_start_time
        return out


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
        phase = SCHEDULED
    elif waiting_in_gate:
        phase = SCHEDULING
    else:
        phase = PENDING
    return GroupStatus(phase, scheduled, running, succeeded, failed)


def status_patch(current: Mapping[str, Any], wanted: GroupStatus) -> dict[str, Any] | None:
    """The merge patch that makes `current` (a PodGroup) show `wanted`; None if it already does.

    Carries only the fields that differ, plus metadata.uid and
    resourceVersion as preconditions. A scheduleStartTime already on the
    object (written before a restart) is kept.
    """
    meta = current.get("metadata") or {}
    status = current.get("status") or {}
    fields = wanted.fields()
    if status.get("scheduleStartTime"):
        fields.pop("scheduleStartTime", None)
    changed = {k: v for k, v in fields.items() if status.get(k) != v}
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
    """Blocking calls on the PodGroup status subresource (run on worker threads)."""

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PodGroup as JSON, None if it does not exist."""

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """JSON merge patch of the status subresource; StatusConflict on 409."""


class KubeStatusApi:
    def __init__(self, custom: k8s.CustomObjectsApi, *, timeout_seconds: float = 10) -> None:
        self._custom = custom
        self._timeout = timeout_seconds

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response: Any = self._custom.get_namespaced_custom_object_status(
                PODGROUP_GROUP,
                PODGROUP_VERSION,
                namespace,
                PODGROUP_PLURAL,
                name,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        obj: dict[str, Any] = json.loads(read_and_release(response))
        return obj

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        try:
            response: Any = self._custom.patch_namespaced_custom_object_status(
                PODGROUP_GROUP,
                PODGROUP_VERSION,
                namespace,
                PODGROUP_PLURAL,
                name,
                body,
                _preload_content=False,
                _request_timeout=self._timeout,
                _content_type="application/merge-patch+json",
            )
        except ApiException as err:
            if err.status == 409:
                raise StatusConflict(name) from None
            raise
        read_and_release(response)


WRITTEN, UNCHANGED, KEPT, GONE, CONFLICT = "written", "unchanged", "kept", "gone", "conflict"


def status_from_object(obj: Mapping[str, Any]) -> GroupStatus:
    """Our fields of a PodGroup's status, as written earlier (by us or a previous run)."""
    status = obj.get("status") or {}

    def count(name: str) -> int:
        value = status.get(name)
        return value if isinstance(value, int) else 0

    return GroupStatus(
        str(status.get("phase") or PENDING),
        count("scheduled"),
        count("running"),
        count("succeeded"),
        count("failed"),
        status.get("scheduleStartTime") or None,
    )


def write_status(
    api: StatusApi,
    namespace: str,
    name: str,
    uid: str,
    wanted: GroupStatus,
    *,
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
        shown = status_from_object(current)
        if keep_terminal and shown.phase in TERMINAL:
            return KEPT, shown
        patch = status_patch(current, wanted)
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
    ) -> None:
        self._state = state
        self._api = api
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
        state.add_pod_listener(self._on_pod_change)

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

    def victim_preempted(self, victim: MemberRef, victim_group: str | None, by: str) -> None:
        if victim_group is not None:
            self._dirty.add(victim_group)

    def gang_released(self, group_key: str, released: Sequence[MemberRef], message: str) -> None:
        self._dirty.add(group_key)

    def _on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
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
        if now >= self._next_resync:
            self._next_resync = now + self._resync
            self._dirty.update(self._state.podgroups, self._pods, self.groups)
        for key in list(self._dirty):
            view = self._compute(key)
            if view is None:
                self._forget(key)
                continue
            self.groups[key] = view
            if view.source != SOURCE_PODGROUP or self._written.get(key) == view.status:
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
            source, min_member = SOURCE_PODGROUP, record.spec.min_member
        else:
            label_min = [p.group.min_available for p in pods if p.group and p.group.min_available]
            if not label_min:
                return None  # no such group, or pods naming a PodGroup that does not exist
            source, min_member = SOURCE_LABELS, max(label_min)
        waiting = any(p.reserved_node and not p.node_name for p in pods)
        previous = self.groups.get(key)
        status = compute_status(min_member, pods, waiting, previous.status if previous else None)
        start = self._start_times.get(key)
        if start is not None and status.schedule_start_time is None:
            status = dataclasses.replace(status, schedule_start_time=start)
        members = sum(1 for p in pods if p.counts_as_member)
        return GroupView(key, source, min_member, members, status)

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
        keep_terminal = view.members == 0 and view.status.phase not in (SCHEDULING, *TERMINAL)
        write = functools.partial(
            write_status,
            self._api,
            record.namespace,
            record.name,
            record.uid,
            view.status,
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
