"""Sibling wake-up: make kube-scheduler retry pending gang members now, not minutes later.

Verified against kube-scheduler v1.37 (pkg/scheduler): a pod rejected by an
extender's filter is recorded with the pseudo-plugin "Extender" as its
rejector and parked in the unschedulable queue. The "Extender" pseudo-plugin
registers every cluster event without a queueing hint, but an unscheduled
sibling being created is not one that moves parked pods; an update of the
parked pod itself is (event TargetPod/Update), after which the pod is retried
at once when the scheduler is idle (SchedulerPopFromBackoffQ). Without help,
the siblings of a gang that has just become complete would wait for some
unrelated event or for the 5-minute unschedulable flush.

So when a group becomes admissible, when our watch sees a new member of a
group that now has minMember pods, when a member starts waiting in the gate,
or when a timed-out group's denial expires, we patch an annotation on its
pending members that were turned away: rejected by our filter (remembered
here) or reported unschedulable by kube-scheduler (condition PodScheduled
False, which also covers rejections before a restart of the extender).
Members that were never turned away are in kube-scheduler's active or
backoff queue and get their turn anyway; touching them would only cost an
API write and a pod update for every scheduler and watcher per member (the
end-to-end benchmark measured that as most of a gang's cost). A member the line holds
(--hold-waiting-gangs, app/runtime/holds.py) is not in kube-scheduler's queue
at all: waking it removes the line's scheduling gate instead. Requests are
coalesced per group: a gang of 100 pods causes one patch per parked pod
per wake-up, and a group is woken at most once per `cooldown_seconds`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from cachetools import TTLCache

from app.base.tasks import TaskSet
from app.core.admission import wholeness
from app.core.clock import Clock, monotonic, wall
from app.core.groups import PodGroupSpecError
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.core.timestamps import wakeup_stamp

log = logging.getLogger(__name__)


class PodToucher(Protocol):
    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None: ...

    async def release_pod(self, namespace: str, name: str, uid: str) -> None: ...


class SiblingWaker:
    def __init__(
        self,
        state: ClusterState,
        api: PodToucher,
        *,
        cooldown_seconds: float = 1.0,
        clock: Clock = monotonic,
        wall_clock: Clock = wall,
    ) -> None:
        self._state = state
        self._api = api
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._wall = wall_clock
        self._stamps = itertools.count(1)
        # group -> when it was last woken; entries expire after the cooldown.
        self._last: TTLCache[str, float] = TTLCache(100_000, cooldown_seconds, timer=clock)
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        # group -> uids of pending members our filter rejected since they were last touched.
        self._turned_away: dict[str, set[str]] = {}
        self._touches = TaskSet()
        self.touched = 0
        # Members whose line gate was removed (app/runtime/holds.py).
        self.released = 0
        # What waking a gang's held members does (app/runtime/holds.py decides whether
        # they may go yet); without holds, they go.
        self.release_held: Callable[[str, list[PodRecord]], None] = self.release
        self._appeared_listeners: list[Callable[[str], None]] = []

    def wake(self, group_key: str, *, exclude_uid: str = "") -> None:
        """Touch the group's pending members soon (coalesced, rate-limited)."""
        if group_key in self._scheduled:
            return
        loop = asyncio.get_running_loop()
        last = self._last.get(group_key)
        delay = 0.0 if last is None else max(0.0, self._cooldown - (self._clock() - last))
        self._scheduled[group_key] = loop.call_later(delay, self._fire, group_key, exclude_uid)

    def turned_away(self, group_key: str, uid: str) -> None:
        """Our filter rejected this member: kube-scheduler parks it until something touches it."""
        if uid:
            self._turned_away.setdefault(group_key, set()).add(uid)

    def wake_pods(self, reason: str, pods: list[PodRecord]) -> None:
        """Touch these pending pods now (not coalesced: callers pick them rarely)."""
        if pods:
            self._touches.spawn(self._touch(reason, pods))

    def wake_after(self, group_key: str, seconds: float) -> None:
        """Wake the group once a denial of `seconds` has expired."""
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, self.wake, group_key)

    def cancel_all(self) -> None:
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()

    async def drain(self) -> None:
        await self._touches.drain()

    @property
    def pending(self) -> int:
        """Groups whose wake-up is scheduled and has not fired yet (tests wait on it)."""
        return len(self._scheduled)

    def podgroups_appeared(self, keys: Iterable[str]) -> None:
        """PodGroups our watch did not know: wake members turned away as "not found".

        A member filtered before the PodGroup reached our cache (just created,
        or our watch relisting after an API server restart) is parked by
        kube-scheduler, and the PodGroup's arrival is no event for it.
        """
        for key in keys:
            if any(not p.placed_node for p in self._state.members(key)):
                self.wake(key)
            for listener in self._appeared_listeners:
                listener(key)

    def add_appeared_listener(self, listener: Callable[[str], None]) -> None:
        """`listener(group key)` for each group object our watch did not know before."""
        self._appeared_listeners.append(listener)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A new member may complete a group whose earlier members were turned away.

        kube-scheduler can filter a member before our watch delivered its
        sibling ("too few siblings"); that member is then parked, and the new
        sibling's own admission may come before or never (it may not fit).
        """
        gone = old if new is None else new if new.placed_node else None
        if gone is not None and gone.group is not None:
            self._forget(gone.group.key, gone.uid)
        if new is None or new.group is None or new.placed_node or new.gated or new.held:
            return  # a held member joins the line instead (app/runtime/holds.py)
        if old is not None and not old.gated:
            # Not a new member (a gated pod whose gates were removed counts as new).
            return
        try:
            spec = self._state.group_spec(new.group)
        except (GroupNotFound, PodGroupSpecError):
            return
        if not wholeness(spec, len(self._state.members(spec.key))).missing:
            self.wake(spec.key, exclude_uid=new.uid)

    def _fire(self, group_key: str, exclude_uid: str) -> None:
        self._scheduled.pop(group_key, None)
        self._last[group_key] = self._clock()
        turned_away = self._turned_away.get(group_key, set())
        pending = [
            p for p in self._state.members(group_key) if not p.placed_node and p.uid != exclude_uid
        ]
        held = [p for p in pending if p.held]
        if held:
            self.release_held(group_key, held)
        parked = [p for p in pending if not p.held and (p.unschedulable or p.uid in turned_away)]
        if parked:
            self._touches.spawn(self._touch(group_key, parked))

    def release(self, why: str, pods: list[PodRecord]) -> None:
        """Remove the line's gate from these held pods (kube-scheduler tries them at once)."""
        if pods:
            self._touches.spawn(self._release(why, pods))

    async def _release(self, why: str, pods: list[PodRecord]) -> None:
        """Remove the line's gate from `pods`; the sweep (app/runtime/holds.py) asks again
        for any still held."""
        done = await _each(
            pods,
            lambda p: self._api.release_pod(p.namespace, p.name, p.uid),
            ("released %d held members", "releasing %d held members failed: %s"),
            {"podgroup": why, "reason": "line-release"},
        )
        self.released += sum(done)

    async def _touch(self, why: str, pods: list[PodRecord]) -> None:
        """Patch the wake-up annotation on `pods`; `why` (a group key or a reason) is logged."""
        stamp = wakeup_stamp(self._wall(), next(self._stamps))
        done = await _each(
            pods,
            lambda p: self._api.touch_pod(p.namespace, p.name, p.uid, stamp),
            ("woke %d pending members", "waking %d members failed: %s"),
            {"podgroup": why, "reason": "sibling-wakeup"},
        )
        for pod, ok in zip(pods, done, strict=True):
            if ok and pod.group is not None:
                # Requeued now; a new rejection by our filter puts it back.
                self._forget(pod.group.key, pod.uid)
        self.touched += sum(done)

    def _forget(self, group_key: str, uid: str) -> None:
        uids = self._turned_away.get(group_key)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._turned_away[group_key]


async def _each(
    pods: list[PodRecord],
    write: Callable[[PodRecord], Awaitable[None]],
    said: tuple[str, str],
    extra: dict[str, str],
) -> list[bool]:
    """`write` every pod at once; per pod whether it was written. `said`: the debug line
    (count written) and the warning (count failed, the first error), logged with `extra`."""
    results = await asyncio.gather(*(write(p) for p in pods), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    log.debug(said[0], len(pods) - len(failed), extra=extra)
    if failed:
        log.warning(said[1], len(failed), failed[0], extra={"podgroup": extra["podgroup"]})
    return [not isinstance(r, BaseException) for r in results]
