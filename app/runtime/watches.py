"""The watches that keep the cluster state current: which kinds, and how each lands.

Every decision rests on what these watches have applied: nodes and pods,
the PodGroups of each source the API server serves, HyperNodes, Volcano
Queues and kube-scheduler's leader Lease. A reflector (app/kube/reflector.py)
lists and watches one kind; its sink, made here, applies what it reads to
ClusterState (or the queue book, or the leader election) the way the rules
expect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from app.base.metrics import Metrics
from app.base.tasks import let_others_run
from app.core.admission import Admission
from app.core.composite import COMPOSITE_GROUP, COMPOSITE_PLURAL, COMPOSITE_VERSION
from app.core.devices.records import API_GROUP as DRA_GROUP
from app.core.devices.records import API_VERSION as DRA_VERSION
from app.core.devices.records import PLURALS as DRA_PLURALS
from app.core.groups import GROUP_APIS, SOURCE_NATIVE, SOURCE_XK8S, GroupApi, group_key
from app.core.pod_relist import PodRelist
from app.core.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from app.core.state import ClusterState
from app.core.topology import hypernode
from app.kube.reflector import Collection, ListWatch, Reflector, Sink
from app.runtime.leader import LeaderElection
from app.runtime.queues.book import QueueBook
from app.runtime.wakeup import SiblingWaker

# A burst of HyperNode events (a topology being created object by object) is
# applied at once this long after its first event: relabelling every node
# takes ~0.2 s at 5,000 nodes (BENCHMARKS.md).
_HYPERNODE_SETTLE_SECONDS = 0.5

# Pods landed per slice of a relist: a few milliseconds of the event loop each (a relist
# of 90,000 pods at once held it 2.7 s, BENCHMARKS.md).
_RELIST_SLICE = 200


def reflector_kind(api: GroupApi) -> str:
    """The reflector (and metric label) of a source: x-k8s's predates the others, unprefixed."""
    return api.plural if api.source == SOURCE_XK8S else f"{api.source}-{api.plural}"


class Watches:
    """Makes the reflectors of each kind, all reading through one client into one state."""

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        waker: SiblingWaker,
        requests: ListWatch,
        metrics: Metrics,
    ) -> None:
        self._state = state
        self._admission = admission
        self._waker = waker
        self._requests = requests
        self._metrics = metrics

    def cluster(
        self, sources: Iterable[str], hypernodes: bool, composites: bool = False
    ) -> list[Reflector]:
        """Nodes, pods, the PodGroups of `sources` and, when served, HyperNodes and
        CompositePodGroups; in that order."""
        state = self._state
        reflectors = [
            self._reflector("nodes", "/api/v1/nodes", _node_sink(state)),
            self._reflector("pods", "/api/v1/pods", _pod_sink(state)),
        ]
        for source, api in GROUP_APIS.items():
            if source in sources:
                path = f"/apis/{api.group}/{api.version}/{api.plural}"
                sink = _podgroup_sink(state, self._admission, source, self._waker)
                reflectors.append(self._reflector(reflector_kind(api), path, sink))
        if hypernodes:
            path = f"/apis/{hypernode.API_GROUP}/{hypernode.API_VERSION}/{hypernode.PLURAL}"
            reflectors.append(self._reflector("hypernodes", path, _hypernode_sink(state)))
        if composites:
            path = f"/apis/{COMPOSITE_GROUP}/{COMPOSITE_VERSION}/{COMPOSITE_PLURAL}"
            sink = _composite_sink(state, self._admission, self._waker)
            reflectors.append(self._reflector("native-compositepodgroups", path, sink))
        return reflectors

    def devices(self) -> list[Reflector]:
        """DRA objects (resource.k8s.io/v1): the devices counted in nodes and pods' resources."""
        return [
            self._reflector(
                kind, f"/apis/{DRA_GROUP}/{DRA_VERSION}/{kind}", _dra_sink(self._state, kind)
            )
            for kind in DRA_PLURALS
        ]

    def queues(self, book: QueueBook, changed: Callable[[], None]) -> Reflector:
        """Volcano Queues into the book; `changed` after each change."""
        path = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
        return self._reflector("volcano-queues", path, _queue_sink(book, changed))

    def lease(self, election: LeaderElection, lease: str) -> Reflector:
        """kube-scheduler's leader Lease (NAMESPACE/NAME) into the election."""
        namespace, _sep, name = lease.partition("/")
        return self._reflector(
            "leases",
            f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases",
            Sink(election.replace, election.apply, election.delete, lambda: 1),
            params={"fieldSelector": f"metadata.name={name}"},
        )

    def _reflector(
        self, kind: str, path: str, sink: Sink, params: Mapping[str, str] | None = None
    ) -> Reflector:
        collection = Collection(kind, path, params or {})
        return Reflector(collection, sink, self._requests, self._metrics)


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


async def land_pods(
    state: ClusterState, objects: Sequence[Mapping[str, Any]], most: int = _RELIST_SLICE
) -> None:
    """Adopt a fresh list of pods `most` at a time, the event loop free between slices:
    verbs answer meanwhile from a state that loses and double-counts no pod
    (app/core/state.PodRelist says what they see)."""
    relist = PodRelist.of(state, objects)
    while not relist.advance(most):
        await let_others_run()


def _pod_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        state.delete_pod(*_name(obj), (obj.get("metadata") or {}).get("uid"))

    def replace(objects: list[Mapping[str, Any]]) -> Awaitable[None]:
        return land_pods(state, objects)

    return Sink(replace, state.apply_pod, delete, lambda: len(state.pods))


def _node_sink(state: ClusterState) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        state.delete_node(_name(obj)[1])

    return Sink(state.replace_nodes, state.apply_node, delete, lambda: len(state.nodes))


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
        state.delete_hypernode(_name(obj)[1], relabel=False)
        later()

    return Sink(state.replace_hypernodes, upsert, delete, lambda: len(state.hypernodes.hypernodes))


def _podgroup_sink(
    state: ClusterState, admission: Admission, source: str, waker: SiblingWaker
) -> Sink:
    def delete(obj: Mapping[str, Any]) -> None:
        namespace, name = _name(obj)
        state.delete_podgroup(namespace, name, source)
        admission.forget(group_key(source, namespace, name))

    def replace(objects: list[Mapping[str, Any]]) -> None:
        known = set(state.podgroups)
        state.replace_podgroups(objects, source)
        waker.podgroups_appeared(set(state.podgroups) - known)

    def upsert(obj: Mapping[str, Any]) -> None:
        namespace, name = _name(obj)
        key = group_key(source, namespace or "default", name)
        new = key not in state.podgroups
        roots = state.apply_podgroup(obj, source)
        if new or roots:
            waker.podgroups_appeared([key, *roots] if new else roots)

    return Sink(
        replace,
        upsert,
        delete,
        lambda: sum(1 for r in state.podgroups.values() if r.source == source),
    )


def _composite_sink(state: ClusterState, admission: Admission, waker: SiblingWaker) -> Sink:
    """CompositePodGroups into their trees (app/core/composite.py): a root's gang appears,
    changes or goes as its tree does."""

    def delete(obj: Mapping[str, Any]) -> None:
        namespace, name = _name(obj)
        state.trees.delete(namespace or "default", name)
        admission.forget(group_key(SOURCE_NATIVE, namespace or "default", name, composite=True))

    def replace(objects: list[Mapping[str, Any]]) -> None:
        waker.podgroups_appeared(state.trees.replace(objects))

    def upsert(obj: Mapping[str, Any]) -> None:
        if roots := state.trees.apply(obj):
            waker.podgroups_appeared(roots)

    return Sink(replace, upsert, delete, state.trees.count)


def _dra_sink(state: ClusterState, kind: str) -> Sink:
    """One DRA kind into the device book: devices recounted on the nodes and pods it bears on."""
    book = state.devices

    def size() -> int:
        return len(getattr(book.model, _DRA_TABLES[kind]))

    return Sink(
        lambda objects: book.replace(kind, objects),
        lambda obj: book.apply(kind, obj),
        lambda obj: book.delete(kind, obj),
        size,
    )


_DRA_TABLES = {
    "resourceslices": "slices",
    "deviceclasses": "classes",
    "resourceclaims": "claims",
    "resourceclaimtemplates": "templates",
}


def _queue_sink(book: QueueBook, changed: Callable[[], None]) -> Sink:
    """Queue objects into the book; any change may let gangs in line in (or hold them)."""

    def then(apply: Callable[[Any], None]) -> Callable[[Any], None]:
        def run(arg: Any) -> None:
            apply(arg)
            changed()

        return run

    return Sink(then(book.replace), then(book.upsert), then(book.delete), lambda: len(book.specs))
