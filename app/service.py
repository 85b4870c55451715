"""The running extender: what it is made of, and its lifespan.

app/server.py builds these parts from Settings; Service starts them in one
visible order (Service.start), reports readiness, and stops them in one
visible order (Service.stop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI

from app.config import Settings
from app.core.events import GangEvents
from app.core.observer import Observers
from app.kube.discovery import (
    composites_served,
    discover_dra,
    discover_queues,
    discover_sources,
    hypernodes_served,
)
from app.kube.http import AsyncApiClient
from app.kube.pods import PodApi
from app.kube.reflector import Reflector
from app.ops.event_recorder import EventRecorder
from app.ops.heap import keep_heap
from app.ops.queue_status import QueueStatusWriter
from app.ops.status_reconciler import PodGroupStatus
from app.runtime.arbiter import Arbiter
from app.runtime.gate import PermitGate
from app.runtime.leader import LeaderCheck, LeaderElection
from app.runtime.preemption.evictor import PreemptionFollower
from app.runtime.preemption.plans import PreemptionPlans
from app.runtime.preemption.unasked import UnaskedPreemption
from app.runtime.queues.book import QueueBook
from app.runtime.queues.reclaimer import Reclaimer
from app.runtime.wakeup import SiblingWaker
from app.runtime.watches import Watches
from app.web.verb_context import VerbCore
from app.web.verbs_asgi import VerbGuard

log = logging.getLogger(__name__)

_SHUTTING_DOWN = "gang-extender is shutting down; the pod will be scheduled again"


@dataclass
class Clients:
    """The ways to the API server: built by build_clients, closed by Service.stop."""

    requests: AsyncApiClient
    pods: PodApi


@dataclass
class Leadership:
    """Whose writes follow the watch: this replica's, or only the leader's (--leader-*)."""

    election: LeaderElection | None
    leader: LeaderCheck


@dataclass
class Writers:
    """Events and PodGroup status: what the gangs' progress is written as."""

    recorder: EventRecorder
    events: GangEvents
    status: PodGroupStatus
    observer: Observers


@dataclass
class Runtime:
    """State over time: the pieces that hold, admit, wake, preempt and reclaim gangs."""

    waker: SiblingWaker
    plans: PreemptionPlans
    gate: PermitGate
    queues: QueueBook
    reclaimer: Reclaimer
    arbiter: Arbiter
    follower: PreemptionFollower
    # Preemption for gangs short of DRA devices (kube-scheduler starts none for them).
    unasked_preemption: UnaskedPreemption | None = None


@dataclass
class Components:
    """Everything build_apps builds, for the lifespan to start and stop."""

    clients: Clients
    # What every piece shares: the cluster as watched, the admission memory, the metrics.
    cluster: VerbCore
    lead: Leadership
    writers: Writers
    runtime: Runtime
    # Queue status is written only where queues decide admission (--gang-feasibility).
    queue_status: QueueStatusWriter | None


class Service:
    """The lifespan of the components: started in one order, ready when watched, then stopped."""

    def __init__(self, settings: Settings, parts: Components) -> None:
        self._settings = settings
        self._parts = parts
        self.guard = VerbGuard(max_request_bytes=settings.max_request_bytes)
        self.reflectors: list[Reflector] = []
        self._loops: list[asyncio.AbstractEventLoop] = []

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new verbs and answer every gate waiter now, not at its timeout.

        Runs in the signal handler, so the gate is touched on the loop's own turn.
        """
        if self.guard.stopping is not None:
            return
        self.guard.stopping = _SHUTTING_DOWN
        log.info("shutting down: verbs refused, gate waiters released", extra={"verb": None})
        for loop in self._loops:
            loop.call_soon_threadsafe(self._parts.runtime.gate.release_all, _SHUTTING_DOWN)

    def ready(self) -> tuple[bool, str]:
        """Caches listed once and every watch connected: decisions rest on current data."""
        if not self.reflectors:
            return False, "starting"
        lines = [f"{r.kind}: {'ok' if r.healthy else _unhealthy(r)}" for r in self.reflectors]
        return all(r.healthy for r in self.reflectors), "\n".join(lines) + "\n"

    def pods_listed(self) -> bool:
        """The pod cache has been listed once (PreemptionPlans.listed: no victim before)."""
        return any(r.kind == "pods" and r.synced for r in self.reflectors)

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        await self.start()
        heap = asyncio.create_task(
            keep_heap(self.reflectors, self._settings.full_gc_interval_seconds)
        )
        log.info("gang-extender started", extra={"verb": None})
        try:
            yield
        finally:
            heap.cancel()
            await self.stop()

    async def start(self) -> None:
        """Find what the API server serves, then start the writers and the watches."""
        settings, parts = self._settings, self._parts
        state, requests, rt = parts.cluster.state, parts.clients.requests, parts.runtime
        self._loops.append(asyncio.get_running_loop())
        state.sources = await discover_sources(requests, settings)
        hypernodes = await hypernodes_served(requests, state.sources)
        state.trees.watched = await composites_served(requests, state.sources)
        parts.writers.status.start()
        watches = Watches(state, parts.cluster.admission, rt.waker, requests, parts.cluster.metrics)
        self.reflectors.extend(watches.cluster(state.sources, hypernodes, state.trees.watched))
        if await discover_dra(requests):
            self.reflectors.extend(watches.devices())
        if settings.gang_feasibility and await discover_queues(requests, settings):
            self.reflectors.append(watches.queues(rt.queues, rt.arbiter.on_queues_changed))
            if parts.queue_status is not None:
                parts.queue_status.start()
        election, lease = parts.lead.election, settings.leader_election_lease
        if election is not None and lease:
            self.reflectors.append(watches.lease(election, lease))
        for reflector in self.reflectors:
            reflector.start()
        rt.arbiter.warmup.start()
        if rt.arbiter.holds is not None:
            rt.arbiter.holds.start()

    async def stop(self) -> None:
        """Answer the gate's waiters, let the work under way finish, then close the clients."""
        parts, rt = self._parts, self._parts.runtime
        rt.gate.release_all(_SHUTTING_DOWN)
        rt.waker.cancel_all()
        await rt.gate.drain()
        await rt.waker.drain()
        await rt.follower.drain()
        await rt.plans.stop()
        await rt.reclaimer.drain()
        await rt.arbiter.warmup.stop()
        if rt.arbiter.holds is not None:
            await rt.arbiter.holds.stop()
        if parts.queue_status is not None:
            await parts.queue_status.stop()
        await parts.writers.status.stop()
        await parts.writers.recorder.stop()
        await asyncio.gather(*(reflector.stop() for reflector in self.reflectors))
        await parts.clients.requests.close()


def _unhealthy(reflector: Reflector) -> str:
    return f"error: {reflector.last_error}" if reflector.synced else "syncing"
