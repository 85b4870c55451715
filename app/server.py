"""Assembly: build every component from Settings and run them under one lifespan.

Nothing else in app/ constructs clients or threads; tests build the same
pieces with their own clock, binder or state where that is the point.
build_apps reads as the list of what the extender is made of; Service.start
and Service.stop hold the start-up and shutdown order, each in one visible
sequence.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from kubernetes import client as k8s

from app.base.metrics import Metrics
from app.config import Settings
from app.core.admission import Admission, WaitPolicy
from app.core.events import GangEvents
from app.core.groups import SOURCE_VOLCANO, SOURCE_XK8S, VOLCANO_API
from app.core.lws import LWS_NAME_LABEL
from app.core.observer import Observers
from app.core.preemption.victims import VictimPolicy
from app.core.scoring import ScoringPolicy
from app.core.state import ClusterState
from app.kube.client import kube_configuration
from app.kube.events import KubeEventWriter
from app.kube.http import AsyncApiClient
from app.kube.pods import PodApi
from app.kube.status import KubeStatusApi, QueueStatusApi
from app.kube.webhook import WebhookApi
from app.ops.cachedump import add_cache_route
from app.ops.debug import GangDebug
from app.ops.device_metrics import DeviceCollector
from app.ops.event_recorder import EventRecorder
from app.ops.queue_status import QueueStatusWriter
from app.ops.status_reconciler import PodGroupStatus, StatusSettings
from app.runtime.arbiter import Arbiter
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.claim_nominees import ClaimNominees
from app.runtime.device_cel import CelEngine
from app.runtime.gate import PermitGate
from app.runtime.gate_settings import GateLinks, GatePolicy, PartialBindPolicy
from app.runtime.held_members import HeldMembers
from app.runtime.holds import LineHolds
from app.runtime.leader import (
    AlwaysLeader,
    LeaderCheck,
    LeaderElection,
    LeaderOnlyPodWrites,
    LeaderOnlyRecorder,
)
from app.runtime.preemption.evictor import PreemptionFollower
from app.runtime.preemption.line_check import ArbiterLineCheck
from app.runtime.preemption.plans import PlanSettings, PreemptionPlans
from app.runtime.preemption.unasked import UnaskedPreemption
from app.runtime.queues.book import QueueBook
from app.runtime.queues.reclaimer import Reclaimer
from app.runtime.unmarked import UnmarkedMembers
from app.runtime.wakeup import SiblingWaker
from app.service import Clients, Components, Leadership, Runtime, Service, Writers
from app.web.extender import GangExtender
from app.web.routes import create_app
from app.web.verb_context import VerbCore, VerbLinks
from app.web.webhook import CertSettings, WebhookApp, WebhookCerts

log = logging.getLogger(__name__)


def build_clients(settings: Settings, configuration: k8s.Configuration | None = None) -> Clients:
    # Every API call (verbs, watches, writers), at most --api-max-in-flight at once.
    requests = AsyncApiClient(
        configuration or kube_configuration(settings.kubeconfig),
        max_in_flight=settings.api_max_in_flight,
    )
    return Clients(requests, PodApi(requests))


def leadership(settings: Settings) -> Leadership:
    if not settings.leader_election_lease:
        return Leadership(None, AlwaysLeader())
    election = LeaderElection(settings.leader_identity or socket.gethostname())
    return Leadership(election, election)


def build_writers(
    settings: Settings, cluster: VerbCore, clients: Clients, leader: LeaderCheck
) -> Writers:
    state, metrics = cluster.state, cluster.metrics
    recorder = EventRecorder(KubeEventWriter(clients.requests), metrics)
    events = GangEvents(
        state,
        LeaderOnlyRecorder(recorder, leader),
        cluster.wait,
        settings.denied_pg_expiration_seconds,
    )
    status = PodGroupStatus(
        state,
        {
            SOURCE_XK8S: KubeStatusApi(clients.requests),
            SOURCE_VOLCANO: KubeStatusApi(clients.requests, VOLCANO_API),
        },
        metrics,
        settings=StatusSettings(levels=settings.levels),
        is_leader=leader.is_leader,
    )
    return Writers(recorder, events, status, Observers(events, status))


def build_runtime(
    settings: Settings, cluster: VerbCore, pods: PodApi, leader: LeaderCheck, observer: Observers
) -> Runtime:
    state, metrics = cluster.state, cluster.metrics
    # Writes that follow the watch are the leader's; the verbs (bind) need no check:
    # kube-scheduler calls only its leader's sidecar.
    pod_writes = LeaderOnlyPodWrites(pods, leader)
    waker = SiblingWaker(state, pod_writes)
    victims = VictimPolicy(settings.gang_victim_policy)
    # The one owner of preemption: the verb, the gate, the evictor and /debug ask it.
    plans = PreemptionPlans(
        state,
        victims,
        metrics,
        waker=waker,
        observer=observer,
        settings=PlanSettings(levels=settings.levels),
    )
    gate = PermitGate(
        state,
        cluster.admission,
        pods,
        metrics,
        GateLinks(waker=waker, observer=observer, deleter=pods, victims=plans),
        GatePolicy(partial_bind=PartialBindPolicy(settings.on_partial_bind)),
    )
    # Teams' shares and reclaim: idle until a Queue object exists (app/runtime/queues/book.py).
    queues = QueueBook(state, overcommit=settings.queue_overcommit_factor, metrics=metrics)
    reclaimer = Reclaimer(state, pods, observer, metrics=metrics, plans=plans)
    # With --gang-feasibility=false it still places the gangs that have a
    # topology constraint (one domain, as a whole); the others go member by member.
    arbiter = Arbiter(
        state,
        cluster.admission,
        gate,
        cluster.wait.for_group,
        ArbiterPeers(
            waker=waker, observer=observer, metrics=metrics, queues=queues, reclaimer=reclaimer
        ),
        ArbiterSettings(
            aging_seconds=settings.gang_aging_seconds,
            levels=settings.levels,
            every_gang=settings.gang_feasibility,
            hold=settings.holds_gangs,
        ),
    )
    holds = arbiter.holds
    if holds is not None:
        metrics.held_members.set_function(lambda: float(holds.members))
    # A plan evicts only for a gang the line would then admit (issue 49).
    plans.consult(ArbiterLineCheck(arbiter, state))
    nominations = plans.nominate_through(pod_writes)  # the one writer of nominations
    ClaimNominees(state, arbiter.ledger).attach(nominations)
    follower = PreemptionFollower(state, pod_writes, observer, victims, plans)
    devices = UnaskedPreemption(state, cluster.admission, plans, pod_writes, observer, victims)
    devices.nominations = nominations  # our own evictions wait for the members' nominations
    if holds is not None:
        # kube-scheduler never tries a held member: a held gang's preemption starts here.
        holds.preempting = devices.for_held
    return Runtime(waker, plans, gate, queues, reclaimer, arbiter, follower, devices)


def build_components(
    settings: Settings, configuration: k8s.Configuration | None = None
) -> Components:
    clients = build_clients(settings, configuration)
    wait = WaitPolicy(
        settings.permit_waiting_time_seconds, settings.max_permit_waiting_time_seconds
    )
    admission = Admission(settings.denied_pg_expiration_seconds)
    state = ClusterState(CelEngine())
    cluster = VerbCore(state, admission, Metrics(), wait)
    lead = leadership(settings)
    writers = build_writers(settings, cluster, clients, lead.leader)
    runtime = build_runtime(settings, cluster, clients.pods, lead.leader, writers.observer)
    waiting = runtime.arbiter.line.waiting
    cluster.metrics.registry.register(DeviceCollector(state, runtime.arbiter.holders, waiting.keys))
    queue_status = None
    if settings.gang_feasibility:
        queue_status = QueueStatusWriter(
            runtime.queues,
            runtime.arbiter.holders,
            QueueStatusApi(clients.requests),
            lead.leader.is_leader,
        )
    return Components(clients, cluster, lead, writers, runtime, queue_status)


def wire_listeners(parts: Components, unmarked: UnmarkedMembers | None) -> None:
    """Who hears of cluster changes, wired here and nowhere else.

    Pod listeners run in this order, synchronously, and may change the record
    the next one sees: the gate releases the reservation of a waiter whose pod
    is being deleted or was bound elsewhere, so the arbiter after it sees that
    room as free now (and wakes the line) rather than as held by a pod on its
    way out.
    """
    state, rt = parts.cluster.state, parts.runtime
    state.add_pod_listener(rt.waker.on_pod_change)
    state.add_pod_listener(parts.writers.status.on_pod_change)
    state.add_pod_listener(parts.writers.events.on_pod_change)
    state.add_pod_listener(rt.gate.on_pod_change)
    rt.gate.add_settle_listener(rt.arbiter.on_settled)
    rt.reclaimer.when_refused(rt.arbiter.retry_reclaim)
    state.add_pod_listener(rt.arbiter.on_pod_change)
    state.add_node_listener(rt.arbiter.on_nodes_changed)
    state.add_pod_listener(rt.follower.on_pod_change)
    state.add_pod_listener(rt.plans.on_pod_change)
    state.add_placement_listener(rt.plans.on_pod_placed)
    if rt.unasked_preemption is not None:
        # After the plans: a plan that ended with this change is gone before it asks for one.
        state.add_pod_listener(rt.unasked_preemption.on_pod_change)
        # Victims kube-scheduler was handed and did not delete (its preemption failed): ours.
        rt.plans.handed_to_scheduler = rt.unasked_preemption.follow
    if unmarked is not None:
        # Gang-only mode: a member without the mark never reaches our verbs.
        state.add_pod_listener(unmarked.on_pod_change)
    state.add_node_listener(rt.plans.on_nodes_changed)
    # Native members kube-scheduler's queue holds back: no verb of ours hears of them.
    held = HeldMembers(state, parts.writers.observer)
    state.add_pod_listener(held.on_pod_change)
    state.trees.add_listener(held.on_group_changed)
    rt.waker.add_appeared_listener(held.on_group_changed)


def build_extender(settings: Settings, parts: Components) -> GangExtender:
    cluster, rt = parts.cluster, parts.runtime
    scoring = ScoringPolicy(
        locality_weight=settings.locality_weight,
        binpack_weight=settings.binpack_weight,
        binpack_resources=dict(settings.binpack_resources),
        topology_key=settings.topology_key,
        binpack_non_gang=settings.score_non_gang == "binpack",
        pick_member_node=settings.member_node_choice == "extender",
    )
    return GangExtender(
        cluster,
        rt.gate,
        parts.clients.pods,
        VerbLinks(rt.waker, parts.writers.observer, arbiter=rt.arbiter, plans=rt.plans),
        scoring=scoring,
    )


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
    settings: Settings, metrics: Metrics, requests: AsyncApiClient, holds: LineHolds | None
) -> tuple[WebhookApp | None, WebhookCerts | None]:
    """The admission webhook, when --webhook-port asks for one."""
    if settings.webhook_port is None:
        return None, None
    certs = WebhookCerts(
        CertSettings(
            cert_file=settings.webhook_cert_file,
            key_file=settings.webhook_key_file,
            hosts=settings.webhook_hosts,
            configuration=settings.webhook_configuration,
            secret=settings.webhook_cert_secret,
        ),
        WebhookApi(requests),
    )
    return (
        WebhookApp(
            metrics,
            settings.webhook_scheduler_names,
            (LWS_NAME_LABEL,) if settings.lws_gangs == "on" else (),
            hold=holding(settings, holds),
        ),
        certs,
    )


def holding(settings: Settings, holds: LineHolds | None) -> Callable[[], bool]:
    """Whether the webhook gives a member created now the line's gate (--hold-waiting-gangs):
    always with true, while gangs wait with auto; never while Volcano queues decide."""
    if holds is None or not settings.holds_gangs:
        return lambda: False
    if settings.hold_waiting_gangs == "true":
        return lambda: holds.enabled
    return holds.gangs_wait


def build_apps(settings: Settings, configuration: k8s.Configuration | None = None) -> Apps:
    """The whole extender, ready for uvicorn."""
    parts = build_components(settings, configuration)
    metrics = parts.cluster.metrics
    holds = parts.runtime.arbiter.holds
    webhook, webhook_certs = build_webhook(settings, metrics, parts.clients.requests, holds)
    extender = build_extender(settings, parts)
    unmarked = None
    if webhook is not None:
        names = settings.webhook_scheduler_names
        unmarked = UnmarkedMembers(
            parts.writers.events, metrics, names, settings.expect_marked_preemptors
        )
    wire_listeners(parts, unmarked)
    service = Service(settings, parts)
    parts.runtime.plans.listed = service.pods_listed  # every evictor's victims wait for it
    main, ops = http_apps(settings, parts, extender, service)
    return Apps(main, ops, service.begin_shutdown, webhook, webhook_certs)


def http_apps(
    settings: Settings, parts: Components, extender: GangExtender, service: Service
) -> tuple[FastAPI, FastAPI | None]:
    """The verbs' app and, with --ops-port, the operations app.

    The verbs' app then gets no operations extras and the operations app no
    verbs: on the plain-HTTP port nobody can bind pods.
    """
    cluster, rt = parts.cluster, parts.runtime
    debug = GangDebug(
        parts.writers.status.groups,
        rt.gate,
        cluster.admission,
        contention=rt.arbiter.snapshot,
        preemption=rt.plans.snapshot,
        is_leader=parts.lead.leader.is_leader,
    )
    one_port = settings.ops_port is None
    main = create_app(
        extender,
        cluster.metrics,
        url_prefix=settings.url_prefix,
        ready=service.ready,
        lifespan=service.lifespan,
        debug=debug if one_port else None,
        guard=service.guard,
    )
    ops = main
    if not one_port:
        ops = create_app(
            None, cluster.metrics, url_prefix=settings.url_prefix, ready=service.ready, debug=debug
        )
    add_cache_route(ops, cluster.state)
    return main, None if one_port else ops
