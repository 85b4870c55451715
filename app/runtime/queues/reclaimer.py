"""Reclaim: a queue below its share gets its room back from queues above theirs.

kube-scheduler's preempt verb only evicts pods of lower priority, and queues
share by weight, not by priority: a gang of team B waiting below B's share
behind team A's gangs of the same priority would wait until A's gangs finish.
When the arbiter finds such a gang that does not fit, it asks `reclaim()`:
the victims are chosen by app/core/queues.py (whole gangs of reclaimable queues
above their share, lowest priority and most recently created first, the
fewest that make room the gang can use by its own placement rules: one rack
of its required level, its slices' domains) and evicted here through the Eviction API, so
PodDisruptionBudgets are honoured. Each victim gang gets a `GangReclaimed`
Event naming the queue that needed the room. Pods being deleted count as
free room for the packing (app/core/state.py `leaving`), so the waiting gang is
admitted as soon as the watch shows the evictions.

While a gang's reclaim is under way (its victims have not left, for at most
RECLAIM_WAIT_SECONDS), no second one is started for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from app.base.metrics import Metrics
from app.base.tasks import TaskSet
from app.core.clock import Clock, monotonic
from app.core.contention import Gang
from app.core.groups import GroupRef
from app.core.observer import GangObserver, MemberRef
from app.core.packing import Bin
from app.core.queues import QueueView, Running
from app.core.reclaim import Fits, choose_victims
from app.core.reclaim_slices import SliceRoom
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.runtime.preemption.evictor import evict_each
from app.runtime.preemption.plans import PreemptionPlans

log = logging.getLogger(__name__)

RECLAIM_WAIT_SECONDS = 30.0


class PodEvictions(Protocol):
    async def evict_through_api(
        self, namespace: str, name: str, uid: str, *, dry_run: bool = False
    ) -> None: ...

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod (uid-guarded), no budget asked."""


class Reclaimer:
    def __init__(
        self,
        state: ClusterState,
        api: PodEvictions,
        observer: GangObserver,
        *,
        metrics: Metrics | None = None,
        clock: Clock = monotonic,
        plans: PreemptionPlans | None = None,
    ) -> None:
        self._state = state
        self._plans = plans
        self._api = api
        self._observer = observer
        self._metrics = metrics
        self._clock = clock
        self._tasks = TaskSet()
        # Told the needy gang's key when its victims' budgets refused: look again.
        self._on_refused: Callable[[str], None] = lambda _key: None
        # needy gang key -> (until when, what is being reclaimed for it).
        self._under_way: dict[str, tuple[float, str]] = {}
        # victim gang key -> until when: chosen once, not again while its pods
        # leave (or while a PodDisruptionBudget keeps it).
        self._evicting: dict[str, float] = {}

    async def drain(self) -> None:
        await self._tasks.drain()

    def reclaim(
        self,
        gang: Gang,
        ref: GroupRef,
        queue: str,
        views: Mapping[str, QueueView],
        room: Sequence[Bin],
        running: Sequence[Running],
        fits: Fits | None = None,
        domains: Sequence[Collection[str]] = (),
        slices: SliceRoom | None = None,
    ) -> str | None:
        """Evict whole gangs so `gang` fits in `room`; what is being done, None: nothing can.

        `room`: free capacity per node less what admitted gangs were promised.
        `fits`: the gang's own fits test (its topology: app/runtime/queues/reclaim_checks.py;
        default: a flat packing), `domains` the node sets its required level has, `slices`
        the domains its slices may take, as choose_victims() takes them.
        """
        now = self._clock()
        under_way = self._under_way.get(gang.key)
        if under_way is not None and now < under_way[0]:
            return under_way[1]
        self._evicting = {k: t for k, t in self._evicting.items() if t > now}
        running = [r for r in running if r.key not in self._evicting and not self._spared(r.key)]
        # A victim's claims give back what they hold of pools published for many nodes.
        holds = self._state.devices.pool_holds() if any(b.pools for b in room) else ()
        victims = choose_victims(
            queue,
            gang.demands,
            gang.need,
            room,
            running,
            views,
            fits=fits,
            domains=domains,
            pool_holds=holds,
            slices=slices,
        )
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
            pods = self._state.placed_members(key)
            victim_queue = by_key[key].queue
            message = (
                f"gang {key} of queue {victim_queue} is evicted whole: queue {queue} is below "
                f"its deserved share ({views[queue].describe()}) and its gang {gang.key} needs "
                f"the room; {views[victim_queue].describe()}"
            )
            self._tasks.spawn(self._evict(key, victim_queue, pods, message, gang, ref))
        return text

    def when_refused(self, retry: Callable[[str], None]) -> None:
        """Who looks for other victims once a budget protected the chosen ones (the arbiter)."""
        self._on_refused = retry

    def forget(self, gang_key: str) -> None:
        """The gang was admitted: a later shortfall may reclaim again."""
        self._under_way.pop(gang_key, None)

    def _spared(self, group_key: str) -> bool:
        """Not to evict now: a member of this gang is a victim of a live preemption plan
        already, or the pods were not listed yet (PreemptionPlans.listed: a gang seen in
        part would be evicted in part)."""
        plans = self._plans
        if plans is None:
            return False
        members = self._state.members(group_key)
        return not plans.listed() or any(plans.is_victim(p.uid) for p in members)

    async def _evict(
        self,
        group_key: str,
        queue: str,
        pods: list[PodRecord],
        message: str,
        needy: Gang,
        ref: GroupRef,
    ) -> None:
        """Evict the gang whole, or not at all when a PodDisruptionBudget forbids it now.

        Every member's eviction is asked first as a dry run: a budget that
        refuses one keeps the whole gang running (it is not chosen again for
        RECLAIM_WAIT_SECONDS, and the needy gang's next filter call looks for
        other victims). Dry runs do not count against a budget, so one that
        allows fewer disruptions than the gang has members can still refuse a
        later real eviction: the members left are then deleted all the same,
        since a gang below minMember would only hold its nodes idle.
        """
        refused = await self._refusals(pods)
        if refused:
            log.warning(
                "gang %s is not reclaimed: %s; it keeps running and another gang is chosen",
                group_key,
                refused,
                extra={"podgroup": group_key, "queue": queue},
            )
            # Not chosen again for a while (it stays in _evicting).
            self._evicting[group_key] = self._clock() + RECLAIM_WAIT_SECONDS
            self._under_way.pop(needy.key, None)
            self._on_refused(needy.key)
            return
        log.info(message, extra={"podgroup": group_key, "verb": "filter", "queue": queue})
        if self._plans is not None:
            # The one owner of evictions: /debug shows it, the needy gang's own
            # preempt calls wait for it, its members are woken once the victims left.
            self._plans.reclaim(ref, needy.priority, pods)
        if self._metrics is not None:
            self._metrics.queue_reclaimed_gangs.labels(queue).inc()
        self._observer.gang_reclaimed(group_key, [_ref(p) for p in pods], message)
        evicted = await evict_each(
            self._api.evict_through_api,
            group_key,
            pods,
            " (reclaim; a PodDisruptionBudget refused it after its dry run allowed it)",
        )
        rest = [p for p in pods if p not in evicted]
        if rest:
            log.warning(
                "deleting the %d member(s) of gang %s whose eviction was refused: the rest of "
                "the gang is evicted already",
                len(rest),
                group_key,
                extra={"podgroup": group_key, "queue": queue},
            )
            await evict_each(self._api.evict_pod, group_key, rest)

    async def _refusals(self, pods: Sequence[PodRecord]) -> str:
        """Why some member may not be evicted now ("" when every dry run is allowed)."""
        results = await asyncio.gather(
            *(self._api.evict_through_api(p.namespace, p.name, p.uid, dry_run=True) for p in pods),
            return_exceptions=True,
        )
        return "; ".join(
            f"evicting {pod.key} is refused ({result})"
            for pod, result in zip(pods, results, strict=True)
            if isinstance(result, Exception)
        )


def _ref(pod: PodRecord) -> MemberRef:
    return MemberRef(pod.namespace, pod.name, pod.uid, pod.placed_node)
