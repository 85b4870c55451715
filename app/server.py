"""Assembly: build every component from Settings and run them under one lifespan.

Nothing else in app/ constructs clients or threads; tests build the same
pieces with their own clock, binder or state where that is the point.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI
from kubernetes import client as k8s

from app.config import Settings
from app.core import hypernode
from app.core.admission import Admission, WaitPolicy
from app.core.clock import monotonic
from app.core.events import GangEvents
from app.core.groups import (
    GROUP_APIS,
    SOURCE_VOLCANO,
    SOURCE_XK8S,
    VOLCANO_API,
    GroupApi,
    group_key,
)
from app.core.observer import Observers
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from app.core.scoring import ScoringPolicy
from app.core.state import ClusterState
from app.kube.aio import AsyncApiClient, uses_proxy
from app.kube.client import ThreadedRequests, api_client
from app.kube.discovery import discover_queues, discover_sources, hypernodes_served
from app.kube.events import KubeEventWriter
from app.kube.pods import PodApi
from app.kube.reflector import Reflector, Sink
from app.kube.status import KubeStatusApi, QueueStatusApi
from app.kube.webhook import WebhookApi
from app.ops.cachedump import add_cache_route
from app.ops.debug import GangDebug
from app.ops.event_recorder import EventRecorder
from app.ops.leader import (
    AlwaysLeader,
    LeaderCheck,
    LeaderElection,
    LeaderOnlyPodWrites,
    LeaderOnlyRecorder,
)
from app.ops.metrics import Metrics
from app.ops.queue_status import QueueStatusWriter
from app.ops.status_reconciler import PodGroupStatus
from app.runtime.arbiter import Arbiter
from app.runtime.evictor import PreemptionFollower
from app.runtime.gate import PartialBindPolicy, PermitGate
from app.runtime.preemption import PreemptionPlans, VictimPolicy
from app.runtime.queue_book import QueueBook
from app.runtime.reclaimer import Reclaimer
from app.runtime.unmarked import UnmarkedMembers
from app.runtime.wakeup import SiblingWaker
from app.web.extender import GangExtender
from app.web.routes import create_app
from app.web.verbs_asgi import VerbGuard
from app.web.webhook import WebhookApp, WebhookCerts

log = logging.getLogger(__name__)


def verb_requests(client: k8s.ApiClient, max_in_flight: int) -> AsyncApiClient | ThreadedRequests:
    """The verbs' requests and the watches: on the event loop, or through a proxy on threads.

    At most `max_in_flight` requests are under way at once (--api-max-in-flight):
    the slots of AsyncApiClient, or the threads of the pool (see app/kube/aio.py).
    """
    if uses_proxy(client.configuration):
        log.info(
            "API server behind a proxy: the verbs' requests and the watches run on threads",
            extra={"verb": None},
        )
        executor = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="kube-api")
        return ThreadedRequests(client, executor)
    return AsyncApiClient(client, max_in_flight=max_in_flight)


def _pod_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        state.delete_pod(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid"))

    return Sink(state.replace_pods, state.apply_pod, delete, lambda: len(state.pods))


def _node_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        state.delete_node((obj.get("metadata") or {}).get("name") or "")

    return Sink(state.replace_nodes, state.apply_node, delete, lambda: len(state.nodes))


# A burst of HyperNode events (a topology being created object by object) is
# applied at once this long after its first event: relabelling every node
# takes ~0.2 s at 5,000 nodes (BENCHMARKS.md).
_HYPERNODE_SETTLE_SECONDS = 0.5


def _hypernode_sink(state: ClusterState) -> Sink:
    pending: list[asyncio.TimerHandle] = []

    def relabel() -> None:
        pending.clear()
        state.relabel_hypernodes()

    def later() -> None:
        if not pending:
            loop = asyncio.get_running_loop()
            pending.append(loop.call_later(_HYPERNODE_SETTLE_SECONDS, relabel))

    def upsert(obj: Mapping[str, Any]) -> None:
        state.apply_hypernode(obj, relabel=False)
        later()

    def delete(obj: Mapping[str, Any]) -> None:
        state.delete_hypernode((obj.get("metadata") or {}).get("name") or "", relabel=False)
        later()

    return Sink(state.replace_hypernodes, upsert, delete, lambda: len(state.hypernodes.hypernodes))


def _podgroup_sink(
    state: ClusterState, admission: Admission, source: str, waker: SiblingWaker
) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        state.delete_podgroup(namespace, name, source)
        admission.forget(group_key(source, namespace, name))

    def replace(objects: list[Mapping[str, Any]]) -> None:
        known = set(state.podgroups)
        state.replace_podgroups(objects, source)
        waker.podgroups_appeared(set(state.podgroups) - known)

    def upsert(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = group_key(source, meta.get("namespace") or "default", meta.get("name") or "")
        new = key not in state.podgroups
        state.apply_podgroup(obj, source)
        if new:
            waker.podgroups_appeared([key])

    return Sink(
        replace,
        upsert,
        delete,
        lambda: sum(1 for r in state.podgroups.values() if r.source == source),
    )


def _queue_sink(book: QueueBook, changed: Callable[[], None]) -> Sink:
    """Queue objects into the book; any change may let gangs in line in (or hold them)."""

    def then(apply: Callable[[Any], None]) -> Callable[[Any], None]:
        def run(arg: Any) -> None:
            apply(arg)
            changed()

        return run

    return Sink(then(book.replace), then(book.upsert), then(book.delete), lambda: len(book.specs))


async def freeze_heap_when_synced(
    reflectors: Sequence[Reflector], poll_seconds: float = 0.5, give_up_seconds: float = 600
) -> None:
    """Once every cache has its first list, keep what they hold out of full GC passes.

    The caches hold tens of thousands of long-lived objects (a record, its
    requests and labels per pod), and every full collection walks them all:
    40 ms with 50,000 pods, spent inside whichever verb call was running.
    gc.freeze() after the first lists moves them out of the collector's
    view; records replaced later are freed by reference counting as before.
    Once only: whatever is alive at that moment stays outside the collector
    for good, so freezing again and again would keep cyclic garbage of
    requests in flight at each freeze.
    """
    deadline = monotonic() + give_up_seconds
    while not all(r.synced for r in reflectors):
        if monotonic() > deadline:
            return
        await asyncio.sleep(poll_seconds)
    gc.collect()
    gc.freeze()
    log.info("caches listed: %d objects frozen", gc.get_freeze_count(), extra={"verb": None})


def reflector_kind(api: GroupApi) -> str:
    """The reflector (and metric label) of a source: x-k8s's predates the others, unprefixed."""
    return api.plural if api.source == SOURCE_XK8S else f"{api.source}-{api.plural}"


def _unhealthy(reflector: Reflector) -> str:
    return f"error: {reflector.last_error}" if reflector.synced else "syncing"


@dataclass
class Apps:
    """What uvicorn serves: the verbs, and the operations routes when on their own port."""

    main: FastAPI
    ops: FastAPI | None
    # Called from the SIGTERM/SIGINT handler, before uvicorn stops listening.
    begin_shutdown: Callable[[], None] = lambda: None
    # The admission webhook (--webhook-port) and its certificates.
    webhook: WebhookApp | None = None
    webhook_certs: WebhookCerts | None = None


def build_webhook(
    settings: Settings, metrics: Metrics, client: k8s.ApiClient
) -> tuple[WebhookApp | None, WebhookCerts | None]:
    """The admission webhook, when --webhook-port asks for one."""
    if settings.webhook_port is None:
        return None, None
    certs = WebhookCerts(
        cert_file=settings.webhook_cert_file,
        key_file=settings.webhook_key_file,
        hosts=settings.webhook_hosts,
        api=WebhookApi(client),
        configuration=settings.webhook_configuration,
        secret=settings.webhook_cert_secret,
    )
    return WebhookApp(metrics, settings.webhook_scheduler_names), certs


def build_apps(settings: Settings, client: k8s.ApiClient | None = None) -> Apps:
    """The whole extender, ready for uvicorn."""
    # Enough connections for the watches, the observers' writes and one per
    # API thread if the verbs need them (a request finding the pool empty opens
    # a new TLS connection; the pool keeps no more connections than were used).
    client = client or api_client(settings.kubeconfig, pool_size=settings.api_max_in_flight + 16)
    core = k8s.CoreV1Api(client)
    custom = k8s.CustomObjectsApi(client)
    metrics = Metrics()
    webhook, webhook_certs = build_webhook(settings, metrics, client)
    state = ClusterState()
    admission = Admission(settings.denied_pg_expiration_seconds)
    requests = verb_requests(client, settings.api_max_in_flight)
    api = PodApi(requests)
    election: LeaderElection | None = None
    leader: LeaderCheck = AlwaysLeader()
    if settings.leader_election_lease:
        election = LeaderElection(settings.leader_identity or socket.gethostname())
        leader = election
    # Writes that follow the watch are the leader's; the verbs (bind) need no check:
    # kube-scheduler calls only its leader's sidecar.
    pod_writes = LeaderOnlyPodWrites(api, leader)
    waker = SiblingWaker(state, pod_writes)
    # Events and PodGroup status get their own threads: their writes never
    # delay a binding.
    observer_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="observers")
    wait = WaitPolicy(
        settings.permit_waiting_time_seconds, settings.max_permit_waiting_time_seconds
    )
    events = GangEvents(
        state,
        LeaderOnlyRecorder(
            EventRecorder(KubeEventWriter(core), observer_executor.submit, metrics), leader
        ),
        wait,
        settings.denied_pg_expiration_seconds,
    )
    status = PodGroupStatus(
        state,
        KubeStatusApi(custom),
        observer_executor,
        metrics,
        apis={SOURCE_VOLCANO: KubeStatusApi(custom, VOLCANO_API)},
        is_leader=leader.is_leader,
        levels=settings.levels,
    )
    observer = Observers(events, status)
    # The one owner of preemption: the verb, the gate, the evictor and /debug ask it.
    plans = PreemptionPlans(
        state,
        VictimPolicy(settings.gang_victim_policy),
        metrics,
        waker=waker,
        observer=observer,
        levels=settings.levels,
    )
    gate = PermitGate(
        state,
        admission,
        api,
        metrics,
        waker=waker,
        observer=observer,
        partial_bind=PartialBindPolicy(settings.on_partial_bind),
        deleter=api,
        victims=plans,
    )
    # Teams' shares and reclaim: idle until a Queue object exists (app/runtime/queue_book.py).
    queues = QueueBook(state, overcommit=settings.queue_overcommit_factor, metrics=metrics)
    reclaimer = Reclaimer(state, api, observer, metrics=metrics, plans=plans)
    # With --gang-feasibility=false it still places the gangs that have a
    # topology constraint (one domain, as a whole); the others go member by member.
    arbiter = Arbiter(
        state,
        admission,
        gate,
        wait.for_group,
        waker=waker,
        observer=observer,
        aging_seconds=settings.gang_aging_seconds,
        levels=settings.levels,
        metrics=metrics,
        every_gang=settings.gang_feasibility,
        queues=queues,
        reclaimer=reclaimer,
    )
    extender = GangExtender(
        state,
        admission,
        gate,
        api,
        metrics,
        wait,
        waker,
        observer,
        scoring=ScoringPolicy(
            locality_weight=settings.locality_weight,
            binpack_weight=settings.binpack_weight,
            binpack_resources=dict(settings.binpack_resources),
            topology_key=settings.topology_key,
            binpack_non_gang=settings.score_non_gang == "binpack",
        ),
        arbiter=arbiter,
        plans=plans,
    )
    queue_status = (
        QueueStatusWriter(
            queues, arbiter.holders, QueueStatusApi(custom), observer_executor, leader.is_leader
        )
        if settings.gang_feasibility
        else None
    )
    follower = PreemptionFollower(
        state,
        pod_writes,
        observer,
        VictimPolicy(settings.gang_victim_policy),
        plans,
    )
    # Who hears of cluster changes, wired here and nowhere else. Pod listeners run
    # in this order, synchronously, and may change the record the next one sees:
    # the gate releases the reservation of a waiter whose pod is being deleted or
    # was bound elsewhere, so the arbiter after it sees that room as free now (and
    # wakes the line) rather than as held by a pod on its way out. The order is
    # the one the components had when each registered itself in its constructor.
    state.add_pod_listener(waker.on_pod_change)
    state.add_pod_listener(status.on_pod_change)
    state.add_pod_listener(gate.on_pod_change)
    gate.add_settle_listener(arbiter.on_settled)
    reclaimer.when_refused(arbiter.retry_reclaim)
    state.add_pod_listener(arbiter.on_pod_change)
    state.add_node_listener(arbiter.on_nodes_changed)
    state.add_pod_listener(follower.on_pod_change)
    state.add_pod_listener(plans.on_pod_change)
    if webhook is not None:
        # Gang-only mode: a member without the mark never reaches our verbs.
        state.add_pod_listener(
            UnmarkedMembers(events, metrics, settings.webhook_scheduler_names).on_pod_change
        )
    state.add_node_listener(plans.on_nodes_changed)
    reflectors: list[Reflector] = []
    guard = VerbGuard(max_request_bytes=settings.max_request_bytes)
    running: list[asyncio.AbstractEventLoop] = []

    def begin_shutdown() -> None:
        """SIGTERM: refuse new verbs and answer every gate waiter now, not at its timeout.

        Runs in the signal handler, so the gate is touched on the loop's own turn.
        """
        if guard.stopping is not None:
            return
        guard.stopping = "gang-extender is shutting down; the pod will be scheduled again"
        log.info("shutting down: verbs refused, gate waiters released", extra={"verb": None})
        for loop in running:
            loop.call_soon_threadsafe(gate.release_all, guard.stopping)

    def ready() -> tuple[bool, str]:
        """Caches listed once and every watch connected: decisions rest on current data."""
        if not reflectors:
            return False, "starting"
        lines = [f"{r.kind}: {'ok' if r.healthy else _unhealthy(r)}" for r in reflectors]
        return all(r.healthy for r in reflectors), "\n".join(lines) + "\n"

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        running.append(loop)
        state.sources = await asyncio.to_thread(discover_sources, custom, settings)
        hypernodes = await asyncio.to_thread(hypernodes_served, custom, state.sources)
        status.start()
        reflectors.extend(
            [
                Reflector("nodes", "/api/v1/nodes", _node_sink(state), requests, metrics),
                Reflector("pods", "/api/v1/pods", _pod_sink(state), requests, metrics),
            ]
        )
        for source, group_api in GROUP_APIS.items():
            if source not in state.sources:
                continue
            path = f"/apis/{group_api.group}/{group_api.version}/{group_api.plural}"
            sink = _podgroup_sink(state, admission, source, waker)
            reflectors.append(Reflector(reflector_kind(group_api), path, sink, requests, metrics))
        if hypernodes:
            path = f"/apis/{hypernode.API_GROUP}/{hypernode.API_VERSION}/{hypernode.PLURAL}"
            reflectors.append(
                Reflector("hypernodes", path, _hypernode_sink(state), requests, metrics)
            )
        if settings.gang_feasibility and await asyncio.to_thread(discover_queues, custom, settings):
            reflectors.append(
                Reflector(
                    "volcano-queues",
                    f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}",
                    _queue_sink(queues, arbiter.on_queues_changed),
                    requests,
                    metrics,
                )
            )
            if queue_status is not None:
                queue_status.start()
        if election is not None and settings.leader_election_lease:
            lease_ns, _sep, lease_name = settings.leader_election_lease.partition("/")
            reflectors.append(
                Reflector(
                    "leases",
                    f"/apis/coordination.k8s.io/v1/namespaces/{quote(lease_ns, safe='')}/leases",
                    Sink(election.replace, election.apply, election.delete, lambda: 1),
                    requests,
                    metrics,
                    params={"fieldSelector": f"metadata.name={lease_name}"},
                )
            )
        for reflector in reflectors:
            reflector.start()
        heap = asyncio.create_task(freeze_heap_when_synced(reflectors))
        log.info("gang-extender started", extra={"verb": None})
        try:
            yield
        finally:
            heap.cancel()
            gate.release_all("gang-extender is shutting down; the pod will be scheduled again")
            waker.cancel_all()
            await gate.drain()
            await waker.drain()
            await follower.drain()
            await reclaimer.drain()
            if queue_status is not None:
                await queue_status.stop()
            await status.stop()
            observer_executor.shutdown(wait=False, cancel_futures=True)
            await asyncio.gather(*(reflector.stop() for reflector in reflectors))
            await requests.close()

    debug = GangDebug(
        status.groups,
        gate,
        admission,
        contention=arbiter.snapshot,
        preemption=plans.snapshot,
    )
    if settings.ops_port is None:
        main = create_app(
            extender,
            metrics,
            url_prefix=settings.url_prefix,
            ready=ready,
            lifespan=lifespan,
            debug=debug,
            guard=guard,
        )
        add_cache_route(main, state)
        return Apps(main, None, begin_shutdown, webhook, webhook_certs)
    # The verbs' app gets no operations extras and the operations app no verbs:
    # on the plain-HTTP port nobody can bind pods.
    main = create_app(
        extender,
        metrics,
        url_prefix=settings.url_prefix,
        ready=ready,
        lifespan=lifespan,
        guard=guard,
    )
    ops = create_app(None, metrics, url_prefix=settings.url_prefix, ready=ready, debug=debug)
    add_cache_route(ops, state)
    return Apps(main, ops, begin_shutdown, webhook, webhook_certs)
