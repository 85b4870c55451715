"""Pods in no gang refused a preemption for the room a live plan keeps: retried when it ends.

The preempt verb drops a plain preemptor's candidate node whose room a gang's
live plan keeps (app/runtime/preemption/room.py, "this pod is tried again
once that gang is placed or its plan ends"). kube-scheduler then parks the
pod, rejected by NodeResourcesFit, and the plan's end is no event that
plugin's hints accept: its members bound there by the extender are pods
added, and a nomination ended by a binding moves nothing (kubernetes issue
134859). The soak's seed 1 saw such a pod of priority 10000 wait five
minutes, for kube-scheduler's periodic flush.

So each refused pod is remembered, and when any plan ends it is requeued
(nominations.requeue): it preempts again with the plan gone.
"""

from __future__ import annotations

import logging

from app.base.tasks import TaskSet
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.nominations import PodNominator, requeue

log = logging.getLogger(__name__)

_MAX_WAITING = 10_000


class KeptRoomWaiters:
    """Remembers the refused preemptors; requeues them when a plan ends."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._waiting: dict[str, str] = {}  # pod uid -> the node it was refused
        self._writes = TaskSet()
        # Set at start-up (app/server.py through PreemptionPlans.nominate_through); None in
        # unit tests of the plans alone, where nothing is written.
        self.api: PodNominator | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def refused(self, uid: str, node: str) -> None:
        if len(self._waiting) >= _MAX_WAITING:
            self._waiting.clear()  # a pod dropped here is retried at kube-scheduler's flush
        self._waiting[uid] = node

    def plans_ended(self) -> None:
        """A plan ended: requeue every refused pod still waiting unplaced."""
        waiting, self._waiting = self._waiting, {}
        if self.api is None:
            return
        for uid, node in waiting.items():
            pod = self._state.pod_by_uid(uid)
            if pod is not None and not pod.placed_node and not pod.deleting and not pod.terminal:
                self._writes.spawn(self._requeue(self.api, pod, node))

    async def drain(self) -> None:
        await self._writes.drain()

    async def _requeue(self, api: PodNominator, pod: PodRecord, node: str) -> None:
        if await requeue(api, pod, node):
            log.info(
                "a preemption plan ended: the pod refused for the room it kept is tried again",
                extra={"pod": pod.key, "node": node, "verb": "preempt"},
            )
