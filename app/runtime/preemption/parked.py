"""Requeue a pod kube-scheduler left parked on a node that has had room for it a while.

A pod in no gang that kube-scheduler nominated (it preempted for it) and
reported unschedulable is retried by kube-scheduler on the event that frees
its room, within its backoff (at most 10 s by default). When that event was
lost to kube-scheduler (app/core/preemption/parked.py: a victim's delete
missed while a watch was broken), the pod waits minutes on a node with room
for it. So PARKED_SECONDS after the last change that could give a parked pod
room (a pod leaving its nominated node, a nomination there ending, the pod
parked), it is checked: if
its node has room for it as kube-scheduler counts it, its nomination is
removed (nominations.requeue), and kube-scheduler retries it. A pod is
requeued so at most once per REQUEUE_COOLDOWN_SECONDS.

A pod whose preempt call got no answer (app/core/preemption/parked.py
unanswered: the extender was restarting) is requeued the same way
UNANSWERED_RETRY_SECONDS after kube-scheduler reported it, its victims
unknown to us: kube-scheduler runs its preemption again, asking the extender,
now up, for it.
"""

from __future__ import annotations

import asyncio
import logging

from cachetools import TTLCache

from app.base.tasks import TaskSet
from app.core.preemption.parked import parked, parked_with_room, unanswered
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.nominations import PodNominator, requeue

log = logging.getLogger(__name__)

# Past kube-scheduler's longest backoff (podMaxBackoffSeconds, 10 s by default),
# well inside the minutes a missed event costs.
PARKED_SECONDS = 15.0
REQUEUE_COOLDOWN_SECONDS = 60.0
# After kube-scheduler reported a preempt call unanswered: past its backoff's first steps.
UNANSWERED_RETRY_SECONDS = 2.0
_MAX_REMEMBERED = 10_000


class ParkedPreemptors:
    """Checks parked nominated pods PARKED_SECONDS after each change that may give them room."""

    def __init__(
        self,
        state: ClusterState,
        api: PodNominator,
        *,
        parked_seconds: float = PARKED_SECONDS,
        cooldown_seconds: float = REQUEUE_COOLDOWN_SECONDS,
        unanswered_seconds: float = UNANSWERED_RETRY_SECONDS,
    ) -> None:
        self._state = state
        self._api = api
        self._parked_seconds = parked_seconds
        self._unanswered_seconds = unanswered_seconds
        self._timers: dict[str, asyncio.TimerHandle] = {}  # node -> its check
        self._retries: dict[str, asyncio.TimerHandle] = {}  # pod uid -> its retry
        self._requeued: TTLCache[str, bool] = TTLCache(_MAX_REMEMBERED, cooldown_seconds)
        self._writes = TaskSet()

    async def drain(self) -> None:
        for timer in [*self._timers.values(), *self._retries.values()]:
            timer.cancel()
        self._timers.clear()
        self._retries.clear()
        await self._writes.drain()

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        if (
            new is not None
            and unanswered(new)
            and (old is None or old.unschedulable_message != new.unschedulable_message)
            and new.uid not in self._retries
        ):
            loop = asyncio.get_running_loop()
            retry = loop.call_later(self._unanswered_seconds, self._retry, new.key, new.uid)
            self._retries[new.uid] = retry
        if not self._state.nominated and not self._timers:
            return  # nobody nominated: the common case costs one check
        for node in _room_given_back(old, new):
            self._check_later(node)
        if new is not None and parked(new) and not _parked_on(old, new.nominated_node):
            self._check_later(new.nominated_node)

    def _check_later(self, node: str) -> None:
        """(Re)start the node's check: PARKED_SECONDS after the last change there."""
        if not any(p.nominated_node == node for p in self._state.nominated.values()):
            return
        previous = self._timers.pop(node, None)
        if previous is not None:
            previous.cancel()
        loop = asyncio.get_running_loop()
        self._timers[node] = loop.call_later(self._parked_seconds, self._check, node)

    def _check(self, node: str) -> None:
        self._timers.pop(node, None)
        for pod in parked_with_room(self._state, node):
            if pod.uid in self._requeued:
                continue
            self._requeued[pod.uid] = True
            self._writes.spawn(self._requeue(pod))

    def _retry(self, key: str, uid: str) -> None:
        self._retries.pop(uid, None)
        pod = self._state.known_pod(key, uid)
        if pod is None or not unanswered(pod) or uid in self._requeued:
            return
        # A nomination to remove: its own, else one set on some node first (requeue).
        node = pod.nominated_node or min(
            (n.name for n in self._state.nodes.values() if not n.unschedulable), default=""
        )
        if not node:
            return
        self._requeued[uid] = True
        self._writes.spawn(self._requeue_unanswered(pod, node))

    async def _requeue_unanswered(self, pod: PodRecord, node: str) -> None:
        if await requeue(self._api, pod, node):
            log.info(
                "kube-scheduler parked this pod when its preempt call got no answer (%s); "
                "it was requeued so that kube-scheduler preempts for it again",
                pod.unschedulable_message.partition("preemption: ")[2][:200],
                extra={"pod": pod.key},
            )

    async def _requeue(self, pod: PodRecord) -> None:
        if await requeue(self._api, pod, pod.nominated_node):
            log.info(
                "kube-scheduler left this pod parked for %gs although its nominated node has "
                "room for it (an event it missed); its nomination was removed so "
                "kube-scheduler tries it again",
                self._parked_seconds,
                extra={"pod": pod.key, "node": pod.nominated_node},
            )


def _room_given_back(old: PodRecord | None, new: PodRecord | None) -> set[str]:
    """The nodes where `old` held room that `new` holds no more.

    A pod placed there that left or moved; a pod nominated there (kube-scheduler
    counts its requests for every pod of no higher priority) that was placed,
    nominated elsewhere, or deleted.
    """
    if old is None:
        return set()
    nodes = set()
    if old.placed_node and (new is None or new.placed_node != old.placed_node):
        nodes.add(old.placed_node)
    nominated_there = old.nominated_node and not old.placed_node
    if nominated_there and (
        new is None or new.placed_node or new.nominated_node != old.nominated_node
    ):
        nodes.add(old.nominated_node)
    return nodes


def _parked_on(pod: PodRecord | None, node: str) -> bool:
    return pod is not None and parked(pod) and pod.nominated_node == node
