"""Reclaim: a queue below its share gets its room back from queues above theirs.

kube-scheduler's preempt verb only evicts pods of lower priority, and queues
share by weight, not by priority: a gang of team B waiting below B's share
behind team A's gangs of the same priority would wait until A's gangs finish.
When the arbiter finds such a gang that does not fit, it asks `reclaim()`:
the victims are chosen by app/queues.py (whole gangs of reclaimable queues
above their share, lowest priority and most recently created first, the
fewest that make room) and evicted here through the Eviction API, so
PodDisruptionBudgets are honoured. Each victim gang gets a `GangReclaimed`
Event naming the queue that needed the room. Pods being deleted count as
free room for the packing (app/state.py `leaving`), so the waiting gang is
admitted as soon as the watch shows the evictions.

While a gang's reclaim is under way (its victims have not left, for at most
RECLAIM_WAIT_SECONDS), no second one is started for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from app.contention import Gang
from app.evictor import evict_each
from app.metrics import Metrics
from app.observer import GangObserver, MemberRef
from app.packing import Bin
from app.queues import QueueView, Running, choose_victims
from app.state import ClusterState, PodRecord
from app.tasks import TaskSet

log = logging.getLogger(__name__)

RECLAIM_WAIT_SECONDS = 30.0


class PodEvictions(Protocol):
    async def evict_through_api(self, namespace: str, name: str, uid: str) -> None: ...


class Reclaimer:
    def __init__(
        self,
        state: ClusterState,
        api: PodEvictions,
        observer: GangObserver,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._api = api
        self._observer = observer
        self._metrics = metrics
        self._clock = clock
        self._tasks = TaskSet()
        # needy gang key -> (until when, what is being reclaimed for it).
        self._under_way: dict[str, tuple[float, str]] = {}
        # victim gang key -> until when: chosen once, not again while its pods leave.
        self._evicting: dict[str, float] = {}

    async def drain(self) -> None:
        await self._tasks.drain()

    def reclaim(
        self,
        gang: Gang,
        queue: str,
        views: Mapping[str, QueueView],
        room: Sequence[Bin],
        running: Sequence[Running],
    ) -> str | None:
        """Evict whole gangs so `gang` fits in `room`; what is being done, None: nothing can.

        `room`: free capacity per node less what admitted gangs were promised.
        """
        now = self._clock()
        under_way = self._under_way.get(gang.key)
        if under_way is not None and now < under_way[0]:
            return under_way[1]
        self._evicting = {k: t for k, t in self._evicting.items() if t > now}
        running = [r for r in running if r.key not in self._evicting]
        victims = choose_victims(queue, gang.demands, gang.need, room, running, views)
        if not victims:
            return None
        by_key = {r.key: r for r in running}
        takes = ", ".join(f"{key} (queue {by_key[key].queue})" for key in victims)
        text = f"reclaiming {len(victims)} gang(s) for it from queues above their share: {takes}"
        self._under_way[gang.key] = (now + RECLAIM_WAIT_SECONDS, text)
        if len(self._under_way) > 1000:
            self._under_way = {k: v for k, v in self._under_way.items() if v[0] > now}
        for key in victims:
            self._evicting[key] = now + RECLAIM_WAIT_SECONDS
            pods = [p for p in self._state.members(key) if p.placed_node and not p.terminal]
            victim_queue = by_key[key].queue
            message = (
                f"gang {key} of queue {victim_queue} is evicted whole: queue {queue} is below "
                f"its deserved share ({views[queue].describe()}) and its gang {gang.key} needs "
                f"the room; {views[victim_queue].describe()}"
            )
            log.info(message, extra={"podgroup": key, "verb": "filter", "queue": victim_queue})
            if self._metrics is not None:
                self._metrics.queue_reclaimed_gangs.labels(victim_queue).inc()
            self._observer.gang_reclaimed(key, [_ref(p) for p in pods], message)
            self._tasks.spawn(self._evict(key, pods))
        return text

    def forget(self, gang_key: str) -> None:
        """The gang was admitted: a later shortfall may reclaim again."""
        self._under_way.pop(gang_key, None)

    async def _evict(self, group_key: str, pods: list[PodRecord]) -> None:
        await evict_each(
            self._api.evict_through_api,
            group_key,
            pods,
            " (reclaim; a PodDisruptionBudget may forbid it now)",
        )


def _ref(pod: PodRecord) -> MemberRef:
    return MemberRef(pod.namespace, pod.name, pod.uid, pod.placed_node)
