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
from app.core.devices.distinct import DistinctDevices
from app.core.devices.offers import NodeOffers
from app.core.devices.records import (
    SelectorEngine,
    SliceRecord,
    claim_from,
    class_from,
    pod_claims_of,
    slice_from,
    template_from,
)
from app.core.devices.refs import CLAIMS, TEMPLATES, PodRefs
from app.core.devices.shared import SharedPools, placed_claims
from app.core.pod_index import PodIndex
from app.core.records import NodeRecord, PodRecord
from app.core.resources import DEVICE_PREFIX, Resources, add, pod_requests, subtract
from app.core.shared_pools import PoolHold

log = logging.getLogger(__name__)

SLICES, CLASSES = "resourceslices", "deviceclasses"


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
        self.offers = NodeOffers(self.model, nodes, changes)
        # Pods that have claims: the only ones a DRA change can bear on.
        self._device_pods: set[str] = set()
        self._refs = PodRefs()
        # A DRA watch runs (it delivered a list or an event): until then, with DRA not
        # served or not readable, a pod's claims are not counted (they could never fit).
        self.watching = False
        # Pods whose demand depends on what the nodes offer (All, firstAvailable).
        self._volatile: set[str] = set()
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
        return self.offers.node(record)

    def replace_nodes(self, records: Iterable[NodeRecord]) -> list[NodeRecord]:
        """A fresh list of nodes: each with its devices; those it left out are forgotten."""
        self.version += 1
        self.distinct.invalidate()
        return self.offers.replace(records)

    def node_gone(self, name: str) -> None:
        self.version += 1
        self.distinct.invalidate()
        self.offers.gone(name)

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
        self._refs.point(record.key, record.namespace, record.claims)
        signatures = len(self.model.signatures)
        demand = self._demand(record)
        if demand:
            record.requests = _with_demand(record.requests, demand)
            record.claim_extras = _extras(demand)
        self._count_new_signatures(signatures, skip=record.key)
        return touched

    def unseen_requests(self, namespace: str, key: str, spec: Mapping[str, Any]) -> Resources:
        """What a pod our watch has not delivered yet asks for, its claims' devices included.

        The filter may meet a gang's last member before the watch does: counted
        by its containers alone, a gang was admitted that the cluster's devices
        could not hold (its members then took devices in kube-scheduler while
        they waited in the gate). Raises QuantityError as pod_requests does.
        """
        requests = pod_requests(spec)
        claims = pod_claims_of(spec, {})
        if not claims or not self.watching:
            return requests
        signatures = len(self.model.signatures)
        demand = self.model.demand(namespace, key, claims)
        self._count_new_signatures(signatures, skip=key)
        return _with_demand(requests, demand)

    def _count_new_signatures(
        self, before: int, *, skip: str = "", also: Iterable[str] = ()
    ) -> None:
        """A selector set first asked for since `before` signatures: count it on every
        node, then recount the pods whose allocated devices it covers and `also` (not
        `skip`, the pod being counted)."""
        if len(self.model.signatures) != before:
            self.offers.refresh()
            self._recount(sorted({*also, *self._volatile} - {skip}))

    def pod_gone(self, key: str) -> set[str]:
        if key not in self._device_pods:
            return set()
        self._device_pods.discard(key)
        self._refs.point(key, "", ())
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
        self._store(kind, _key(raw, kind in (CLAIMS, TEMPLATES)), raw)

    def delete(self, kind: str, raw: Mapping[str, Any]) -> None:
        self._store(kind, _key(raw, kind in (CLAIMS, TEMPLATES)), None)

    def replace(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        self.watching = True
        self.version += 1
        self._table(kind).clear()
        for raw in objects:
            _store(self._table(kind), kind, _key(raw, kind in (CLAIMS, TEMPLATES)), raw)
        self._refresh(kind, None, None)
        if kind == CLAIMS:
            self._changes.nodes_changed()  # a fresh list may have freed devices

    def _store(self, kind: str, key: str, raw: Mapping[str, Any] | None) -> None:
        self.version += 1
        old = self._table(kind).get(key)
        _store(self._table(kind), kind, key, raw)
        self._refresh(kind, key, old)
        if kind != CLAIMS or old is None:
            return
        new = self.model.claims.get(key)
        if not set(old.allocated) <= set(new.allocated if new is not None else ()):
            # Devices given back: the claim's pod ended, and kube-controller-manager cleared
            # its allocation (or deleted it), maybe well after. No pod changes then, so no
            # pod event tells the line: say it as room on nodes (gangs in line are looked at
            # again, kube-scheduler is told to retry those that fit now).
            self._changes.nodes_changed()

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
            self.offers.slices_changed()
            self.model.slices_changed()
            nodes = (
                None
                if key is None
                else _pool_nodes(self.model.slices.values(), old, self.model.slices.get(key))
            )
            self.offers.refresh(nodes)
            self._refresh_pods(self._device_pods if key is None else self._volatile)
        elif kind == CLASSES:
            self.model.slices_changed()
            self.offers.refresh()
            self._refresh_pods(self._device_pods)
        elif key is None:
            self._refresh_pods(self._device_pods)
        else:
            self._refresh_pods(self._refs.pods(kind, key))

    def _refresh_pods(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        signatures = len(self.model.signatures)
        self._recount(keys)
        self._count_new_signatures(signatures, also=keys)

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
