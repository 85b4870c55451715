"""Keeps devices in the resource vectors of nodes and pods as the DRA objects change.

ClusterState hands every pod and node record through here before storing it,
and every DRA object (ResourceSlice, DeviceClass, ResourceClaim,
ResourceClaimTemplate) the watches deliver. A node's allocatable is what the
node advertises plus the devices it is offered (app/core/devices/counting.py); a
pod's requests are its containers' plus what its claims ask. When a DRA
object changes, only the nodes and pods it bears on are recomputed, and
stored through the same doors a watch event uses, so the free room, the
line of gangs and every listener see the change as any other.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from app.core.changes import ChangeLog
from app.core.devices.counting import DeviceModel, set_users
from app.core.devices.distinct import DistinctDevices, own_labels
from app.core.devices.records import (
    PodClaim,
    SelectorEngine,
    SliceRecord,
    claim_from,
    class_from,
    slice_from,
    template_from,
)
from app.core.devices.shared import SharedPools, placed_claims
from app.core.pod_index import PodIndex
from app.core.records import NodeRecord, PodRecord
from app.core.resources import DEVICE_PREFIX, Resources, add, subtract
from app.core.shared_pools import PoolHold

log = logging.getLogger(__name__)

SLICES, CLASSES, CLAIMS, TEMPLATES = (
    "resourceslices",
    "deviceclasses",
    "resourceclaims",
    "resourceclaimtemplates",
)


def _ref_keys(namespace: str, claims: Iterable[PodClaim]) -> set[str]:
    """ "kind:namespace/name" of each claim and template the pod names."""
    refs = {f"{CLAIMS}:{namespace}/{c.claim}" for c in claims if c.claim}
    return refs | {f"{TEMPLATES}:{namespace}/{c.template}" for c in claims if c.template}


def _index(
    refs: dict[str, set[str]], pod_refs: dict[str, set[str]], key: str, now: set[str]
) -> None:
    """Point each of `now` (claims, templates) at the pod, and forget what it named before."""
    old = pod_refs.pop(key, set())
    for ref in old - now:
        pods = refs.get(ref)
        if pods is not None:
            pods.discard(key)
            if not pods:
                del refs[ref]
    for ref in now - old:
        refs.setdefault(ref, set()).add(key)
    if now:
        pod_refs[key] = now


def _pool_nodes(slices: Iterable[SliceRecord], *changed: SliceRecord | None) -> set[str] | None:
    """The nodes a change of these slices (and their pools) bears on; None: every node."""
    given = [s for s in changed if s is not None]
    pools = {s.pool_key for s in given}
    nodes = set()
    for s in [*given, *(other for other in slices if other.pool_key in pools)]:
        if not s.node:
            return None
        nodes.add(s.node)
    return nodes


def _key(raw: Mapping[str, Any], namespaced: bool) -> str:
    meta = raw.get("metadata") or {}
    name = str(meta.get("name") or "")
    return f"{meta.get('namespace') or 'default'}/{name}" if namespaced else name


def _with_demand(requests: Resources, demand: Resources) -> Resources:
    """The pod's own requests with its claims' `demand` added (an extended resource
    name a class backs may be in both: the container's and the claims' add up)."""
    merged = dict(requests)
    add(merged, demand)
    return merged


def _extras(demand: Resources) -> Resources:
    return {k: v for k, v in demand.items() if not k.startswith(DEVICE_PREFIX)}


def _without_demand(record: PodRecord) -> Resources:
    """The pod's requests as its containers ask, without what its claims added."""
    base = {k: v for k, v in record.requests.items() if not k.startswith(DEVICE_PREFIX)}
    subtract(base, record.claim_extras)
    return base


def _store(table: dict[str, Any], kind: str, key: str, raw: Mapping[str, Any] | None) -> None:
    """Parse `raw` into `table` (None: forget the key); what cannot be read is left out."""
    if raw is None:
        table.pop(key, None)
        return
    parse: Callable[[Mapping[str, Any]], Any] = {
        SLICES: slice_from,
        CLASSES: class_from,
        CLAIMS: claim_from,
        TEMPLATES: lambda r: template_from(r)[1],
    }[kind]
    try:
        record = parse(raw)
    except (TypeError, ValueError, AttributeError, KeyError) as err:
        # The API server validates these objects; one that still cannot be read is
        # left out (as if absent: its pods wait, told what is missing), never fatal.
        log.warning("%s %s is unreadable and left out: %s", kind, key, err)
        table.pop(key, None)
        return
    table[key] = record
    error = getattr(record, "error", "") or getattr(getattr(record, "spec", None), "error", "")
    if error:
        log.warning("%s", error)


class DeviceBook:
    def __init__(
        self,
        pods: PodIndex,
        changes: ChangeLog,
        nodes: Callable[[], dict[str, NodeRecord]],
        engine: SelectorEngine | None = None,
    ) -> None:
        """`nodes`: the state's node records, changed in place when their devices change."""
        self.model = DeviceModel(engine)
        self._pods = pods
        self._nodes = nodes
        self._changes = changes
        # Node -> allocatable as the node advertises it (devices are added on top).
        self._base: dict[str, Resources] = {}
        # Pods that have claims: the only ones a DRA change can bear on.
        self._device_pods: set[str] = set()
        # "kind:namespace/name" of a claim or template -> the pods naming it, and back.
        self._refs: dict[str, set[str]] = {}
        self._pod_refs: dict[str, set[str]] = {}
        # A DRA watch runs (it delivered a list or an event): until then, with DRA not
        # served or not readable, a pod's claims are not counted (they could never fit).
        self.watching = False
        # Pods whose demand depends on what the nodes offer (All, firstAvailable).
        self._volatile: set[str] = set()
        self._newest: dict[str, list[Any]] | None = None  # node ("" = pools for many) -> slices
        # The cluster's devices counted once each (app/core/devices/distinct.py).
        self.distinct = DistinctDevices(self.model, nodes, pods)
        # Bumped by every change that may move a device count: a DRA object, a node, a
        # pod with claims (what is counted from the book is counted again after one).
        self.version = 0
        # The pools published for many nodes, as the bins carry them (shared.py).
        self.shared = SharedPools(
            self.model,
            lambda: (self.model.slices_version, self.version, changes.stamp),
            lambda: placed_claims(self.model, pods, self._device_pods),
        )

    def pool_holds(self) -> list[PoolHold]:
        """What allocated claims hold of the pools published for many nodes, and the pods
        using each (app/core/shared_pools.py PoolHold): what evicting them gives back."""
        pods = self._pods.pods
        return self.shared.holds(pods[k] for k in self._device_pods if k in pods)

    # ---- pods and nodes on their way into the state -----------------------------------

    def store_pod(self, record: PodRecord) -> None:
        """Store the pod (its device demand added); recount the users of claims it shares."""
        if record.claims or record.key in self._device_pods:
            self.version += 1
        others = self.pod(record)
        self._pods.apply(record)
        self._refresh_pods(others)

    def delete_pod(self, key: str, uid: str | None) -> None:
        known = key in self._pods.pods
        if key in self._device_pods:
            self.version += 1
        self._pods.delete(key, uid)
        if known and key not in self._pods.pods:
            self._refresh_pods(self.pod_gone(key))

    def relisted(self) -> None:
        """A fresh list of pods has landed (pod by pod, app/core/state.PodRelist): every
        device pod is counted again, with every claim's users as the list has them."""
        self.version += 1
        for key in [k for k in self._device_pods if k not in self._pods.pods]:
            self.pod_gone(key)
        self._refresh_pods(self._device_pods)

    def node(self, record: NodeRecord) -> NodeRecord:
        """The node's record with the devices it is offered added to its allocatable."""
        self.version += 1
        self.distinct.node_changed(self._nodes().get(record.name), record)
        self._base[record.name] = record.allocatable
        record.allocatable = self._with_offer(record)
        return record

    def replace_nodes(self, records: Iterable[NodeRecord]) -> list[NodeRecord]:
        """A fresh list of nodes: each with its devices; those it left out are forgotten."""
        self.version += 1
        self._base.clear()
        self.model.offered.clear()
        self.distinct.invalidate()
        return [self.node(record) for record in records]

    def node_gone(self, name: str) -> None:
        self.version += 1
        self.distinct.invalidate()
        self._base.pop(name, None)
        self.model.offered.pop(name, None)

    def pod(self, record: PodRecord) -> set[str]:
        """Add the pod's device demand to its requests; returns the other pods to recompute."""
        if not record.claims and record.key not in self._device_pods:
            return set()
        # A finished pod holds no devices: a claim it shares is counted on another user.
        users = () if record.terminal else record.claims
        touched = set_users(self.model.users, record.key, record.namespace, users)
        if record.claims:
            self._device_pods.add(record.key)
        else:
            self._device_pods.discard(record.key)
        _index(self._refs, self._pod_refs, record.key, _ref_keys(record.namespace, record.claims))
        signatures = len(self.model.signatures)
        demand = self._demand(record)
        if demand:
            record.requests = _with_demand(record.requests, demand)
            record.claim_extras = _extras(demand)
        if len(self.model.signatures) != signatures:
            # A selector set first asked for: count it on every node, and on the pods
            # whose allocated devices it covers.
            self._refresh_nodes()
            self._recount(sorted(self._volatile - {record.key}))
        return touched

    def pod_gone(self, key: str) -> set[str]:
        if key not in self._device_pods:
            return set()
        self._device_pods.discard(key)
        _index(self._refs, self._pod_refs, key, set())
        self._volatile.discard(key)
        return set_users(self.model.users, key, "", ())

    def _demand(self, record: PodRecord) -> Resources:
        if not self.watching:
            return {}  # no DRA watch (not served, or forbidden): claims are not counted
        self.model.used_offers = False
        demand = self.model.demand(record.namespace, record.key, record.claims)
        if self.model.used_offers:
            self._volatile.add(record.key)
        else:
            self._volatile.discard(record.key)
        return demand

    # ---- DRA objects --------------------------------------------------------------

    def apply(self, kind: str, raw: Mapping[str, Any]) -> None:
        self.watching = True
        self.version += 1
        key = _key(raw, kind in (CLAIMS, TEMPLATES))
        old = self._table(kind).get(key)
        _store(self._table(kind), kind, key, raw)
        self._refresh(kind, key, old)

    def delete(self, kind: str, raw: Mapping[str, Any]) -> None:
        self.version += 1
        key = _key(raw, kind in (CLAIMS, TEMPLATES))
        old = self._table(kind).get(key)
        _store(self._table(kind), kind, key, None)
        self._refresh(kind, key, old)

    def replace(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        self.watching = True
        self.version += 1
        self._table(kind).clear()
        for raw in objects:
            _store(self._table(kind), kind, _key(raw, kind in (CLAIMS, TEMPLATES)), raw)
        self._refresh(kind, None, None)

    def _table(self, kind: str) -> dict[str, Any]:
        model = self.model
        tables: dict[str, dict[str, Any]] = {
            SLICES: model.slices,
            CLASSES: model.classes,
            CLAIMS: model.claims,
            TEMPLATES: model.templates,
        }
        return tables[kind]

    def _refresh(self, kind: str, key: str | None, old: Any) -> None:
        """Recompute what the change bears on (key None: a fresh list, everything).

        A claim or template: the pods naming it. A slice: the nodes of its pool
        (every node for a pool published for many), then the pods whose demand
        depends on the offers. A class: every node and every device pod.
        """
        if kind in (SLICES, CLASSES):
            self.distinct.invalidate()
        if kind == SLICES:
            self._newest = None
            self.model.slices_changed()
            nodes = (
                None
                if key is None
                else _pool_nodes(self.model.slices.values(), old, self.model.slices.get(key))
            )
            self._refresh_nodes(nodes)
            self._refresh_pods(self._device_pods if key is None else self._volatile)
        elif kind == CLASSES:
            self.model.slices_changed()
            self._refresh_nodes()
            self._refresh_pods(self._device_pods)
        elif key is None:
            self._refresh_pods(self._device_pods)
        else:
            self._refresh_pods(self._refs.get(f"{kind}:{key}", ()))

    def _refresh_nodes(self, only: set[str] | None = None) -> None:
        nodes = self._nodes()
        changed = False
        for name in nodes if only is None else only & nodes.keys():
            record = nodes[name]
            allocatable = self._with_offer(record)
            if allocatable != record.allocatable:
                nodes[name] = dataclasses.replace(record, allocatable=allocatable)
                self._changes.node_touched(name)
                changed = True
        if changed:
            self._changes.nodes_changed()

    def _refresh_pods(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        signatures = len(self.model.signatures)
        self._recount(keys)
        if len(self.model.signatures) != signatures:
            # A selector set first asked for: count it on every node, then ask again
            # (the pods whose allocated devices it covers too).
            self._refresh_nodes()
            self._recount(sorted({*keys, *self._volatile}))

    def _recount(self, keys: list[str]) -> None:
        for key in keys:
            record = self._pods.pods.get(key)
            if record is None:
                continue
            demand = self._demand(record)
            requests = _with_demand(_without_demand(record), demand)
            if requests != record.requests:
                extras = _extras(demand)
                record = dataclasses.replace(record, requests=requests, claim_extras=extras)
                self._pods.apply(record)

    def _with_offer(self, record: NodeRecord) -> Resources:
        base = self._base.get(record.name, record.allocatable)
        if self._newest is None:
            self._newest = {}
            for s in self.model.newest_slices():
                self._newest.setdefault(s.node, []).append(s)
        slices = [*self._newest.get(record.name, ()), *self._newest.get("", ())]
        if not slices:
            self.model.offered.pop(record.name, None)
            return base
        offer = self.model.offer_of(self.model.devices_for(record.name, own_labels(record), slices))
        self.model.offered[record.name] = offer
        allocatable = dict(base)
        for resource, amount in offer.items():
            allocatable.setdefault(resource, amount)  # a name the node advertises itself wins
        return allocatable
