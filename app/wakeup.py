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
pending members. Requests are coalesced per group: a gang of 100 pods
causes one patch per pending pod per wake-up, and a group is woken at most
once per `cooldown_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from cachetools import TTLCache

from app.groups import PodGroupSpecError
from app.state import ClusterState, GroupNotFound, PodRecord

log = logging.getLogger(__name__)


class PodToucher(Protocol):
    async def touch_pod(self, namespace: str, name: str, uid: str, value: str) -> None: ...


class SiblingWaker:
    def __init__(
        self, state: ClusterState, api: PodToucher, *, cooldown_seconds: float = 1.0
    ) -> None:
        self._state = state
        self._api = api
        self._cooldown = cooldown_seconds
        # group -> when it was last woken; entries expire after the cooldown.
        self._last: TTLCache[str, float] = TTLCache(100_000, cooldown_seconds, timer=time.monotonic)
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.touched = 0
        state.add_pod_listener(self._on_pod_change)

    def wake(self, group_key: str, *, exclude_uid: str = "") -> None:
        """Touch the group's pending members soon (coalesced, rate-limited)."""
        if group_key in self._scheduled:
            return
        loop = asyncio.get_running_loop()
        last = self._last.get(group_key)
        delay = 0.0 if last is None else max(0.0, self._cooldown - (time.monotonic() - last))
        self._scheduled[group_key] = loop.call_later(delay, self._fire, group_key, exclude_uid)

    def wake_pods(self, reason: str, pods: list[PodRecord]) -> None:
        """Touch these pending pods now (not coalesced: callers pick them rarely)."""
        if not pods:
            return
        task = asyncio.get_running_loop().create_task(self._touch(reason, pods))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def wake_after(self, group_key: str, seconds: float) -> None:
        """Wake the group once a denial of `seconds` has expired."""
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, self.wake, group_key)

    def cancel_all(self) -> None:
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A new member may complete a group whose earlier members were turned away.

        kube-scheduler can filter a member before our watch delivered its
        sibling ("too few siblings"); that member is then parked, and the new
        sibling's own admission may come before or never (it may not fit).
        """
        if new is None or new.group is None or new.placed_node or new.gated:
            return
        if old is not None and not old.gated:
            # Not a new member (a gated pod whose gates were removed counts as new).
            return
        try:
            spec = self._state.group_spec(new.group)
        except (GroupNotFound, PodGroupSpecError):
            return
        if len(self._state.members(spec.key)) >= spec.min_member:
            self.wake(spec.key, exclude_uid=new.uid)

    def _fire(self, group_key: str, exclude_uid: str) -> None:
        self._scheduled.pop(group_key, None)
        loop = asyncio.get_running_loop()
        self._last[group_key] = time.monotonic()
        pending = [
            p for p in self._state.members(group_key) if not p.placed_node and p.uid != exclude_uid
        ]
        if not pending:
            return
        task = loop.create_task(self._touch(group_key, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _touch(self, group_key: str, pods: list[PodRecord]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f"#{time.monotonic_ns()}"
        results = await asyncio.gather(
            *(self._api.touch_pod(p.namespace, p.name, p.uid, stamp) for p in pods),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        self.touched += len(pods) - len(failed)
        log.debug(
            "woke %d pending members",
            len(pods) - len(failed),
            extra={"podgroup": group_key, "reason": "sibling-wakeup"},
        )
        if failed:
            log.warning(
                "waking %d members failed: %s",
                len(failed),
                failed[0],
                extra={"podgroup": group_key},
            )
