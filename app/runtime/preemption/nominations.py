"""Every planned member nominated for its node, so no lower-priority pod takes the room.

kube-scheduler nominates only the member whose preempt answer it acted on
(status.nominatedNodeName: the node whose victims it deleted). A plan's
other members have none: those whose room was free, those whose room a
sibling's victims free, and every member of a plan the extender started itself
(app/runtime/preemption/unasked.py). Once the victims are gone, kube-scheduler
sees that room as free for any pod; in gang-only mode a plain pod never
reaches our filter, so a lower-priority one created meanwhile takes it. The
gang then waits out its plan, and the next plan evicts more (the soak's
finding, issue 49).

kube-scheduler's filters count a nominated pod's requests on its node for
every pod of no higher priority, whoever wrote the nomination: its queue's
nominator reads status.nominatedNodeName of each pod it is told of
(pkg/scheduler/backend/queue/nominator.go, v1.37.2). So while a plan lives,
the extender writes it for one unplaced member per slot: the member the slot
was given to, else the member the planner placed there, else another that
fits the slot. When the plan ends without a member placed, what was written
is removed (unless kube-scheduler has nominated the pod elsewhere since), and
so is a nomination a restarted extender finds on a waiting member of a gang
with no plan (its plan ended with the process that made it).

Admitted gangs' members that are slow to reach the gate are nominated the same
way, for the nodes their admission promised (app/runtime/claim_nominees.py, a
source added with `add_source`).

No plan, no work: `sync` walks the live plans' slots, what the sources want and the
pods written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol, TypeAlias

from cachetools import TTLCache

from app.base.tasks import TaskSet
from app.core.clock import Clock, monotonic
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.kube.errors import ApiError
from app.runtime.preemption.plan import Plan, PlanKind, Slot

log = logging.getLogger(__name__)

# A write not seen back through the watch within this is sent again by the next sync.
RESEND_SECONDS = 5.0

# uid -> (the pod, the node it should be nominated for).
Wanted: TypeAlias = dict[str, tuple[PodRecord, str]]


class PodNominator(Protocol):
    async def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None: ...


async def requeue(api: PodNominator, pod: PodRecord, node: str) -> bool:
    """Make kube-scheduler retry a pod it parked: remove its nomination (set on `node`
    first if it has none); False, logged, when a write failed.

    kube-scheduler takes a nomination removed as room given back on that node: it
    moves every parked pod of no higher priority, this one included, back to its
    queues (eventhandlers.go updatePodInSchedulingQueue, v1.37.2), whatever plugin
    rejected them. Used where the event that freed the room is one its queueing hints
    skip (app/runtime/preemption/parked.py, kept_waiters.py).
    """
    try:
        if not pod.nominated_node:
            await api.nominate_pod(pod.namespace, pod.name, pod.uid, node)
        await api.nominate_pod(pod.namespace, pod.name, pod.uid, "")
    except ApiError as err:
        log.warning("could not requeue a parked pod: %s", err, extra={"pod": pod.key})
        return False
    return True


class Nominations:
    def __init__(
        self,
        state: ClusterState,
        api: PodNominator,
        plans: Callable[[], Iterable[Plan]],
        *,
        clock: Clock = monotonic,
    ) -> None:
        self._state = state
        self._api = api
        self._plans = plans
        self._clock = clock
        # uid -> node this wrote, kept until the pod is placed, gone or nominated elsewhere.
        self._ours: dict[str, str] = {}
        # uid -> value sent and not yet seen back ("" clears): no second write meanwhile.
        self._sent: TTLCache[str, str] = TTLCache(100_000, RESEND_SECONDS, timer=clock)
        # uid -> the pod and the value its next write sends (one write per pod at a time).
        self._next: dict[str, tuple[PodRecord, str]] = {}
        # uid -> the task writing its values, while one is under way.
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._writes = TaskSet()
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at: float | None = None  # the deadline the timer is set for
        self._expire: Callable[[], None] = lambda: None
        # Other nominations wanted besides the plans' (a plan's slot wins over them).
        self._sources: list[Callable[[], Wanted]] = []
        self.written = 0

    @property
    def ours(self) -> dict[str, str]:
        """Pods nominated by this and not yet placed or cleared: uid -> node (for /debug, tests)."""
        return dict(self._ours)

    def concerns(self, pod: PodRecord) -> bool:
        """Is this pod one this nominated (so a change of it may call for a write)?"""
        return pod.uid in self._ours

    def adopt(self, pod: PodRecord) -> bool:
        """Take over a nomination left by a plan this process never knew (it ended with
        an extender that restarted): a pending gang member kube-scheduler reported
        unschedulable, nominated while its gang has no live plan. The next sync removes
        it, or keeps it if a plan made meanwhile wants it there. True: adopted."""
        if (
            pod.group is None
            or not pod.nominated_node
            or pod.placed_node
            or not pod.unschedulable
            or pod.uid in self._ours
        ):
            return False
        self._ours[pod.uid] = pod.nominated_node
        return True

    def add_source(self, wanted: Callable[[], Wanted]) -> None:
        """Nominate what `wanted` returns as well, from the next sync on."""
        self._sources.append(wanted)

    def on_expiry(self, check: Callable[[], None]) -> None:
        """What to run at the earliest live plan's deadline (plans end by time, not events)."""
        self._expire = check

    def sync(self) -> None:
        """Write what the live plans want nominated; remove what ended plans left."""
        wanted = self._wanted()
        for uid, (pod, node) in wanted.items():
            self._ours[uid] = node
            if pod.nominated_node != node:
                self._write(pod, node)
            else:
                self._seen(pod)
        for uid, node in list(self._ours.items()):
            if uid not in wanted:
                self._unwant(uid, node)
        self._time_expiry()

    def _unwant(self, uid: str, node: str) -> None:
        """A pod this nominated that no live plan wants there now: remove the nomination."""
        pod = self._state.pod_by_uid(uid)
        if pod is None or pod.placed_node or not pod.counts_as_member:
            del self._ours[uid]  # placed or going: kube-scheduler forgets it anyway
        elif pod.nominated_node != node and self._sent.get(uid) != node:
            del self._ours[uid]  # cleared, or nominated elsewhere by kube-scheduler
            self._seen(pod)
        else:
            self._write(pod, "")

    def cancel(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry, self._expiry_at = None, None

    async def drain(self) -> None:
        await self._writes.drain()

    def _wanted(self) -> Wanted:
        """uid -> (pod, node): one unplaced member per open slot of every live plan, and
        what the sources want."""
        wanted: Wanted = {}
        for source in self._sources:
            wanted.update(source())
        for plan in self._plans():
            if not plan.live or plan.kind is not PlanKind.PREEMPTION:
                continue
            free = [
                p
                for p in self._state.members(plan.group)
                if not p.placed_node and p.counts_as_member
            ]
            taken = {slot.member for slot in plan.slots if slot.member}
            for slot in plan.slots:
                pod = self._nominee(plan, slot, free, taken)
                if pod is not None:
                    taken.add(pod.uid)
                    wanted[pod.uid] = (pod, slot.node)
        return wanted

    def _nominee(
        self, plan: Plan, slot: Slot, free: list[PodRecord], taken: set[str]
    ) -> PodRecord | None:
        """The slot's member if one asked for it; else the planner's choice; else one that
        fits it (same requests and sub-groups). None once its member is placed."""
        if slot.member:
            pod = self._state.pod_by_uid(slot.member)
            return pod if pod is not None and not pod.placed_node else None
        fits = [
            p
            for p in free
            if p.uid not in taken
            and p.requests == slot.requests
            and plan.paths.get(p.key, ()) == slot.path
        ]
        return next((p for p in fits if p.key == slot.planned), fits[0] if fits else None)

    def _write(self, pod: PodRecord, node: str) -> None:
        if self._sent.get(pod.uid) == node:
            return  # sent, not seen back yet
        self._sent[pod.uid] = node
        idle = pod.uid not in self._next
        self._next[pod.uid] = (pod, node)
        if idle:
            self._sending[pod.uid] = self._writes.spawn(self._send_latest(pod.uid))

    def _seen(self, pod: PodRecord) -> None:
        """The watch shows the pod as written: a later change (kube-scheduler cleared it) is
        written again at once."""
        if self._sent.get(pod.uid) == pod.nominated_node:
            self._sent.pop(pod.uid, None)

    async def _send_latest(self, uid: str) -> None:
        """One write at a time per pod, the latest value last (two in flight could land
        in either order)."""
        try:
            while (item := self._next.get(uid)) is not None:
                pod, node = item
                await self._send(pod, node)
                if self._next.get(uid, item)[1] == node:
                    self._next.pop(uid, None)
        finally:
            self._sending.pop(uid, None)

    async def sent(self, uids: Iterable[str]) -> None:
        """Wait until the writes under way for these pods are answered. A plan's evictions
        come after its members' nominations: kube-scheduler's one watch of pods brings
        both in the order written, so it keeps the room before the room frees (evicted
        first, the room went to a pod kube-scheduler tried in between: issue 49's soak)."""
        tasks = [task for uid in uids if (task := self._sending.get(uid)) is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self, pod: PodRecord, node: str) -> None:
        try:
            await self._api.nominate_pod(pod.namespace, pod.name, pod.uid, node)
        except (ApiError, OSError) as error:  # logged; a sync after RESEND_SECONDS writes again
            log.warning(
                "%s the nominated node of %s failed: %s",
                "setting" if node else "removing",
                pod.key,
                error,
                extra={"pod": pod.key, "podgroup": pod.group.key if pod.group else ""},
            )
            return
        self.written += 1
        log.debug(
            "nominated node %s",
            node or "removed",
            extra={"pod": pod.key, "node": node, "verb": "preempt"},
        )

    def _time_expiry(self) -> None:
        """Check the plans again at the earliest live plan's deadline (a sync runs on every
        change of a planned member: the timer is set anew only when that deadline moves)."""
        earliest = min((p.deadline for p in self._plans() if p.live), default=None)
        if earliest == self._expiry_at:
            return
        self.cancel()
        if earliest is None:
            return
        delay = max(0.0, earliest - self._clock()) + 0.05
        self._expiry_at = earliest
        self._expiry = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._expiry, self._expiry_at = None, None
        self._expire()
