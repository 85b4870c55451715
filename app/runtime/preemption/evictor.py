"""Follow-up of kube-scheduler's preemption: report victims, evict whole gangs, requeue.

kube-scheduler marks each victim with the condition DisruptionTarget
(reason PreemptionByScheduler) before deleting it. We watch for that mark:
every victim is reported to the observers (an Event names the gang it made
room for), and under --gang-victim-policy=whole-gang the other members of a
victim's gang are evicted too, on every node, so a gang never keeps running
below minMember. The preempt verb already refused candidates that would
evict a gang member together with pods of higher priority than the preemptor.
A preemptor kube-scheduler left parked on a node with room for it is
requeued (app/runtime/preemption/parked.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from app.base.tasks import TaskSet
from app.core.observer import GangObserver, MemberRef
from app.core.preemption.victims import VictimPolicy
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.nominations import PodNominator
from app.runtime.preemption.parked import ParkedPreemptors
from app.runtime.preemption.plans import PreemptionPlans

log = logging.getLogger(__name__)

# kube-scheduler deletes its chosen victims right after marking them; one it
# has not deleted by then (another candidate won, an API error) is ours to evict.
SCHEDULER_DELETES_WITHIN_SECONDS = 5.0


class PodEvicter(Protocol):
    async def evict_pod(self, namespace: str, name: str, uid: str) -> None: ...


class FollowerApi(PodEvicter, PodNominator, Protocol):
    """Evictions (whole gangs) and nominations removed (parked preemptors)."""


class PreemptionFollower:
    def __init__(
        self,
        state: ClusterState,
        api: FollowerApi,
        observer: GangObserver,
        policy: VictimPolicy,
        plans: PreemptionPlans,
        scheduler_deletes_within_seconds: float = SCHEDULER_DELETES_WITHIN_SECONDS,
    ) -> None:
        self._state = state
        self._scheduler_deletes_within = scheduler_deletes_within_seconds
        self._api = api
        self._observer = observer
        self._policy = policy
        self._plans = plans
        self._evictions = TaskSet()
        self.parked = ParkedPreemptors(state, api)

    async def drain(self) -> None:
        await self._evictions.drain()
        await self.parked.drain()

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """A pod kube-scheduler marked as a preemption victim: report it, maybe evict its gang."""
        self.parked.on_pod_change(old, new)
        if new is None or not new.preempted or (old is not None and old.preempted):
            return
        by = self._plans.beneficiary(new.uid) or "a higher-priority pod"
        group_key = new.group.key if new.group is not None else None
        self._observer.victim_preempted(_ref(new), group_key, by)
        if self._policy is not VictimPolicy.WHOLE_GANG or group_key is None:
            return
        rest = [
            p
            for p in self._state.members(group_key)
            if p.placed_node and p.uid != new.uid and not p.preempted
        ]
        if not rest:
            return
        # kube-scheduler deletes the victims it chose on this node itself, the
        # last one after the others: its preemptor is retried when that last
        # deletion arrives, and a deletion of ours arriving first is dropped
        # while the preemption still runs, which parks the preemptor for
        # minutes. Those are left to kube-scheduler, checked again later.
        theirs = [
            p for p in rest if p.placed_node == new.placed_node and self._plans.is_victim(p.uid)
        ]
        ours = [p for p in rest if p not in theirs]
        log.info(
            "evicting the %d other members of gang %s (whole-gang policy): member %s was preempted",
            len(rest),
            group_key,
            new.key,
            extra={"podgroup": group_key, "verb": "preempt"},
        )
        if ours:
            self._evictions.spawn(self._evict(group_key, ours, by))
        if theirs:
            self._evictions.spawn(self._evict_left(group_key, [p.uid for p in theirs], by))

    async def _evict_left(self, group_key: str, uids: list[str], by: str) -> None:
        """Evict the victims kube-scheduler was to delete but has not, after a while."""
        await asyncio.sleep(self._scheduler_deletes_within)
        left = [
            p
            for uid in uids
            if (p := self._state.pod_by_uid(uid)) is not None
            and p.placed_node
            and not p.deleting
            and not p.terminal
        ]
        if left:
            await self._evict(group_key, left, by)

    async def _evict(self, group_key: str, pods: list[PodRecord], by: str) -> None:
        for pod in await evict_each(self._api.evict_pod, group_key, pods):
            self._observer.victim_preempted(_ref(pod), group_key, by)


async def evict_each(
    evict: Callable[[str, str, str], Awaitable[None]],
    group_key: str,
    pods: list[PodRecord],
    why_failed: str = "",
) -> list[PodRecord]:
    """Evict a gang's pods at once (`evict(namespace, name, uid)`); the ones that went.

    A failure is logged with the pod and gang (and `why_failed`, a hint) and
    leaves the others be.
    """
    results = await asyncio.gather(
        *(evict(p.namespace, p.name, p.uid) for p in pods), return_exceptions=True
    )
    evicted: list[PodRecord] = []
    for pod, result in zip(pods, results, strict=True):
        if isinstance(result, BaseException):
            log.warning(
                "evicting %s failed%s: %s",
                pod.key,
                why_failed,
                result,
                extra={"pod": pod.key, "podgroup": group_key},
            )
        else:
            evicted.append(pod)
    return evicted


def _ref(pod: PodRecord) -> MemberRef:
    return MemberRef(pod.namespace, pod.name, pod.uid, pod.placed_node)
