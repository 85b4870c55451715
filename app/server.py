"""Assembly: build every component from Settings and run them under one lifespan.

Nothing else in app/ constructs clients or threads; tests build the same
pieces with their own clock, binder or state where that is the point.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.admission import Admission
from app.arbiter import Arbiter
from app.config import Settings
from app.debug import GangDebug
from app.events import EventRecorder, GangEvents, KubeEventWriter
from app.evictor import PreemptionFollower
from app.extender import GangExtender, WaitPolicy
from app.gate import PermitGate
from app.groups import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from app.kube_api import KubeApi
from app.metrics import Metrics
from app.observer import Observers
from app.preemption import VictimPolicy
from app.reflector import Reflector, Sink
from app.routes import create_app
from app.scoring import ScoringPolicy
from app.state import ClusterState
from app.status import KubeStatusApi, PodGroupStatus
from app.wakeup import SiblingWaker

log = logging.getLogger(__name__)


class KubeConfigError(RuntimeError):
    """No way to reach the API server; the message says what to set."""


def api_client(settings: Settings) -> k8s.ApiClient:
    try:
        if settings.kubeconfig:
            configuration = k8s.Configuration()
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=settings.kubeconfig, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            raise KubeConfigError(
                "no kubeconfig given and not running in a cluster: pass --kubeconfig PATH "
                "(or set GANG_EXTENDER_KUBECONFIG / KUBECONFIG)"
            )
    except k8s_config.ConfigException as err:
        raise KubeConfigError(f"cannot load Kubernetes client configuration: {err}") from None
    # Enough connections for the watches plus concurrent bindings of a large gang.
    configuration.connection_pool_maxsize = 32
    return k8s.ApiClient(configuration)


def _pod_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        state.delete_pod(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid"))

    return Sink(state.replace_pods, state.apply_pod, delete, lambda: len(state.pods))


def _node_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        state.delete_node((obj.get("metadata") or {}).get("name") or "")

    return Sink(state.replace_nodes, state.apply_node, delete, lambda: len(state.nodes))


def _podgroup_sink(state: ClusterState, admission: Admission) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        state.delete_podgroup(meta.get("namespace") or "", meta.get("name") or "")
        admission.forget(f"{meta.get('namespace')}/{meta.get('name')}")

    return Sink(state.replace_podgroups, state.apply_podgroup, delete, lambda: len(state.podgroups))


def _unhealthy(reflector: Reflector) -> str:
    return f"error: {reflector.last_error}" if reflector.synced else "syncing"


@dataclass
class Apps:
    """What uvicorn serves: the verbs, and the operations routes when on their own port."""

    main: FastAPI
    ops: FastAPI | None


def build_apps(settings: Settings, client: k8s.ApiClient | None = None) -> Apps:
    """The whole extender, ready for uvicorn."""
    client = client or api_client(settings)
    core = k8s.CoreV1Api(client)
    custom = k8s.CustomObjectsApi(client)
    metrics = Metrics()
    state = ClusterState()
    admission = Admission(settings.denied_pg_expiration_seconds)
    executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kube-api")
    api = KubeApi(core, executor)
    waker = SiblingWaker(state, api)
    # Events and PodGroup status get their own threads: their writes never
    # delay a binding.
    observer_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="observers")
    wait = WaitPolicy(
        settings.permit_waiting_time_seconds, settings.max_permit_waiting_time_seconds
    )
    events = GangEvents(
        state,
        EventRecorder(KubeEventWriter(core), observer_executor.submit, metrics),
        wait,
        settings.denied_pg_expiration_seconds,
    )
    status = PodGroupStatus(state, KubeStatusApi(custom), observer_executor, metrics)
    observer = Observers(events, status)
    gate = PermitGate(state, admission, api, metrics, waker=waker, observer=observer)
    arbiter = (
        Arbiter(
            state,
            admission,
            gate,
            wait.for_group,
            waker=waker,
            observer=observer,
            aging_seconds=settings.gang_aging_seconds,
        )
        if settings.gang_feasibility
        else None
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
        victim_policy=VictimPolicy(settings.gang_victim_policy),
        arbiter=arbiter,
    )
    follower = PreemptionFollower(
        state,
        api,
        observer,
        VictimPolicy(settings.gang_victim_policy),
        extender.preemptors_by_node,
    )
    reflectors: list[Reflector] = []

    def ready() -> tuple[bool, str]:
        """Caches listed once and every watch connected: decisions rest on current data."""
        if not reflectors:
            return False, "starting"
        lines = [f"{r.kind}: {'ok' if r.healthy else _unhealthy(r)}" for r in reflectors]
        return all(r.healthy for r in reflectors), "\n".join(lines) + "\n"

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        status.start()
        list_podgroups = functools.partial(
            custom.list_cluster_custom_object, PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL
        )
        reflectors.extend(
            [
                Reflector("nodes", core.list_node, _node_sink(state), loop, metrics),
                Reflector(
                    "pods", core.list_pod_for_all_namespaces, _pod_sink(state), loop, metrics
                ),
                Reflector(
                    "podgroups", list_podgroups, _podgroup_sink(state, admission), loop, metrics
                ),
            ]
        )
        for reflector in reflectors:
            reflector.start()
        log.info("gang-extender started", extra={"verb": None})
        try:
            yield
        finally:
            gate.release_all("gang-extender is shutting down; the pod will be scheduled again")
            waker.cancel_all()
            await gate.drain()
            await waker.drain()
            await follower.drain()
            await status.stop()
            observer_executor.shutdown(wait=False, cancel_futures=True)
            for reflector in reflectors:
                reflector.stop()
            for reflector in reflectors:
                await asyncio.to_thread(reflector.join, 5)
            executor.shutdown(wait=False, cancel_futures=True)

    debug = GangDebug(
        status.groups,
        gate,
        admission,
        contention=arbiter.snapshot if arbiter is not None else None,
    )
    if settings.ops_port is None:
        return Apps(
            create_app(
                extender,
                metrics,
                url_prefix=settings.url_prefix,
                ready=ready,
                lifespan=lifespan,
                debug=debug,
            ),
            None,
        )
    # The verbs' app gets no operations extras and the operations app no verbs:
    # on the plain-HTTP port nobody can bind pods.
    main = create_app(
        extender, metrics, url_prefix=settings.url_prefix, ready=ready, lifespan=lifespan
    )
    ops = create_app(None, metrics, url_prefix=settings.url_prefix, ready=ready, debug=debug)
    return Apps(main, ops)
