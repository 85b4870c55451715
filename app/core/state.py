"""The cluster as the verbs need to see it: slim records of Nodes, Pods and PodGroups.

Fed by the watches in app/kube/reflector.py and by the permit gate (reservations
and bindings it made itself), read by the verbs. It is plain in-memory data
with no I/O and no locking: every mutation and every read happens on the
asyncio event loop thread, so a verb sees one consistent picture.

ClusterState is the one door to that picture; behind it each part has one
job: the pod indexes (app/core/pod_index.py), who hears of changes
(app/core/changes.py), free capacity (app/core/free_room.py), HyperNode tiers
as node labels (app/core/topology/hypernode_labels.py) and DRA devices as resources
(app/core/devices/book.py; `selectors` is its CEL engine, None: count by class).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from app.core import free_room
from app.core.changes import ChangeLog, ChangeReader
from app.core.composite_state import CompositeTrees
from app.core.devices.book import DeviceBook
from app.core.devices.records import SelectorEngine
from app.core.group_rules import spec_from_labels
from app.core.groups import (
    ALL_SOURCES,
    SOURCE_XK8S,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
)
from app.core.groups import group_key as make_group_key
from app.core.packing import Bin
from app.core.pod_index import PodIndex
from app.core.pod_relist import PodRelist
from app.core.records import (
    GroupNotFound,
    NodeRecord,
    PodGroupRecord,
    PodRecord,
    node_record_from,
    not_found_message,
    podgroup_record_from,
)
from app.core.resources import Resources
from app.core.topology.domains import Domain, TopologyConstraint, placed_domain
from app.core.topology.hypernode import HyperNodeIndex
from app.core.topology.hypernode_labels import HyperNodeLabels

__all__ = ["ClusterState"]


class ClusterState(ChangeReader):
    def __init__(self, selectors: SelectorEngine | None = None) -> None:
        super().__init__(ChangeLog())
        self._pods = PodIndex(self._changes)
        self._hypernodes = HyperNodeLabels()
        self.nodes: dict[str, NodeRecord] = {}
        self.podgroups: dict[str, PodGroupRecord] = {}
        self.devices = DeviceBook(self._pods, self._changes, lambda: self.nodes, selectors)
        self._bins = free_room.FreeRoom(self._pods.requested, self._changes, self.devices.shared)
        # Group sources in use (flags and API discovery); pods naming another are plain pods.
        self.sources: frozenset[str] = ALL_SOURCES
        # Kubernetes' CompositePodGroup trees (app/core/composite_state.py), once served.
        self.trees = CompositeTrees(
            self._changes, self._pods, self.devices.store_pod, lambda: self.podgroups
        )
        self._schedulable_version = 0  # see schedulable_version
        self.gone = self._pods.gone  # pods lately deleted, for a pod read while the watch lagged

    # ---- who hears of changes: ChangeReader (listeners, stamps) -------------------------

    @property
    def schedulable_version(self) -> int:
        """Changes whenever nodes come, go, or change whether they take pods."""
        return self._schedulable_version

    # ---- pods -------------------------------------------------------------------

    @property
    def pods(self) -> dict[str, PodRecord]:
        return self._pods.pods

    @property
    def leaving(self) -> dict[str, PodRecord]:
        """Placed pods on their way out, by key: their room is as good as free for a gang."""
        return self._pods.leaving

    @property
    def nominated(self) -> dict[str, PodRecord]:
        """Unplaced pods kube-scheduler nominated for a node (status.nominatedNodeName)."""
        return self._pods.nominated

    def apply_pod(self, raw: Mapping[str, Any]) -> None:
        """Insert or replace a pod from its API object (ADDED/MODIFIED event or list item)."""
        self.devices.store_pod(self.trees.pod_record(raw, self.sources))

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.devices.delete_pod(f"{namespace}/{name}", uid)

    def replace_pods(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Adopt a fresh list at once (the watches land one in slices: app/core/pod_relist.py)."""
        PodRelist.of(self, list(objects)).advance(sys.maxsize)

    def reserve(self, pod_key: str, node: str) -> None:
        """The gate holds the pod on `node`: count its requests there from now on."""
        self._pods.reserve(pod_key, node)

    def unreserve(self, pod_key: str) -> None:
        """The gate answered the pod's bind call with an error: its node is free again."""
        self._pods.unreserve(pod_key)

    def assume_bound(self, pod_key: str, node: str) -> None:
        """We created the binding; record it before the watch echoes it back."""
        self._pods.assume_bound(pod_key, node)

    def members(self, group_key: str) -> list[PodRecord]:
        """Siblings that can still take part (not finished, not being deleted)."""
        return self._pods.members(group_key)

    def group_pods(self, group_key: str) -> list[PodRecord]:
        """Every pod labelled into the group, in any phase (members() keeps those that count)."""
        return self._pods.labelled(group_key)

    def group_keys(self) -> list[str]:
        return self._pods.group_keys()

    def placed_members(self, group_key: str) -> list[PodRecord]:
        """Members holding a node now: bound by the API or reserved in the gate."""
        return self._pods.placed_members(group_key)

    def bound_members(self, group_key: str) -> list[PodRecord]:
        """Members the API has bound (not those only reserved in the gate)."""
        return self._pods.bound_members(group_key)

    def pod_by_uid(self, uid: str) -> PodRecord | None:
        return self._pods.pod_by_uid(uid)

    def known_pod(self, pod_key: str, uid: str) -> PodRecord | None:
        """The pod kube-scheduler names, if our watch delivered it (that very pod, when `uid`)."""
        return self._pods.known(pod_key, uid)

    def pods_on(self, node: str) -> list[PodRecord]:
        """The non-terminal pods placed on `node` (bound, or reserved in the gate)."""
        return self._pods.pods_on(node)

    # ---- nodes ----------------------------------------------------------------------

    def apply_node(self, raw: Mapping[str, Any]) -> None:
        record = self._hypernodes.label(self.devices.node(node_record_from(raw)))
        old = self.nodes.get(record.name)
        self.nodes[record.name] = record
        self._changes.node_touched(record.name)
        if old is None or old.unschedulable != record.unschedulable:
            self._schedulable_changed()
        self._changes.nodes_changed()

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.devices.node_gone(name)
        self._changes.node_touched(name)
        self._schedulable_changed()
        self._changes.nodes_changed()

    def replace_nodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        records = self.devices.replace_nodes(map(node_record_from, objects))
        fresh = {r.name: self._hypernodes.label(r) for r in records}
        for name in {*self.nodes, *fresh}:
            self._changes.node_touched(name)
        self.nodes = fresh
        self._schedulable_changed()
        self._changes.nodes_changed()

    def _schedulable_changed(self) -> None:
        self._bins.forget()
        self._schedulable_version += 1

    def requested_on(self, node: str) -> Resources:
        return self._pods.requested.get(node, {})

    def total_allocatable(self) -> Resources:
        return free_room.total_allocatable(self.nodes.values())

    def allocatable_bins(self) -> list[Bin]:
        """Each schedulable node's allocatable (the empty cluster); shared: never change them."""
        return self._bins.allocatable(self.nodes)

    def room(self, *, leaving: bool = True) -> list[Bin]:
        """What each schedulable node has free once the pods `leaving` it are gone (not
        `leaving`: while they hold it, as kube-scheduler counts); shared until their node
        changes: never change these bins, copy the ones to change."""
        return self._bins.room(self.nodes, self.leaving.values() if leaving else ())

    def warm_room(self, most: int) -> bool:
        """Build at most `most` nodes' bins of a rebuild of them all, a slice of the warm-up
        (app/runtime/line_warmup.py); True: room() has nothing left to build at once."""
        return self._bins.warm(self.nodes, most)

    def room_positions(self) -> Mapping[str, int]:
        """Where each node is in room()'s list (and allocatable_bins()'s): kept between calls."""
        return self._bins.positions(self.nodes)

    def free_resources(self, exclude_group: str | None = None) -> Resources:
        """Free capacity summed over schedulable nodes; a group's own placed pods
        (`exclude_group`) count as free: it needs only the rest (Coscheduling's minResources)."""
        own = self.members(exclude_group) if exclude_group is not None else ()
        return self._bins.free(self.nodes, own)

    # ---- Volcano HyperNodes and topology -------------------------------------------

    @property
    def hypernodes(self) -> HyperNodeIndex:
        return self._hypernodes.index

    @property
    def hypernode_errors(self) -> dict[str, str]:
        """HyperNode name -> why it is not used."""
        return self._hypernodes.errors

    def apply_hypernode(self, raw: Mapping[str, Any], *, relabel: bool = True) -> None:
        """relabel=False: only note it; relabel_hypernodes() then applies every change at
        once (a burst of HyperNode events costs one relabelling of the nodes, not one each)."""
        self._hypernodes.note(raw)
        if relabel:
            self.relabel_hypernodes()

    def delete_hypernode(self, name: str, *, relabel: bool = True) -> None:
        self._hypernodes.forget(name)
        if relabel:
            self.relabel_hypernodes()

    def replace_hypernodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._hypernodes.replace(objects)
        self.relabel_hypernodes()

    def relabel_hypernodes(self) -> None:
        """Make the node labels follow the HyperNodes seen, if they changed."""
        changed = self._hypernodes.relabel(self.nodes.values())
        for name in changed:
            self._changes.node_touched(name)
        if changed:
            self._changes.nodes_changed()

    def labels_of(self, node: str) -> Mapping[str, str]:
        """A node's labels (HyperNode tiers included); {} for a node not (or no longer) known."""
        record = self.nodes.get(node)
        return record.labels if record is not None else {}

    def placed_domain(
        self, constraint: TopologyConstraint, configured: tuple[str, ...], nodes: list[str]
    ) -> Domain | None:
        """The lowest domain of the constraint's levels all `nodes` share (topology/domains.py)."""
        return placed_domain(
            constraint,
            self.topology_levels(configured),
            nodes,
            self.labels_of,
            self.hypernodes.tier_names,
        )

    def topology_levels(self, configured: tuple[str, ...]) -> tuple[str, ...]:
        """The configured levels, then the HyperNode tiers there are, lowest first."""
        levels = self.hypernodes.levels
        return (*configured, *levels) if levels else configured

    # ---- podgroups --------------------------------------------------------------------

    def apply_podgroup(self, raw: Mapping[str, Any], source: str = SOURCE_XK8S) -> list[str]:
        """Store the group object; returns the CompositePodGroup roots whose gang it made."""
        record = podgroup_record_from(raw, source)
        self.podgroups[record.key] = record
        self._changes.group_object_changed(record.key)
        return self.trees.leaf_changed(source, record.namespace, raw)

    def delete_podgroup(self, namespace: str, name: str, source: str = SOURCE_XK8S) -> None:
        if self.podgroups.pop(key := make_group_key(source, namespace, name), None) is not None:
            self._changes.group_object_changed(key)
        self.trees.leaf_gone(source, namespace, name)

    def replace_podgroups(
        self, objects: Iterable[Mapping[str, Any]], source: str = SOURCE_XK8S
    ) -> None:
        """Adopt a fresh list of one source's objects; the other sources' records stay."""
        objects = list(objects)
        fresh = {r.key: r for r in (podgroup_record_from(o, source) for o in objects)}
        kept = {k: r for k, r in self.podgroups.items() if r.source != source}
        for key in {k for k, r in self.podgroups.items() if r.source == source} | set(fresh):
            self._changes.group_object_changed(key)
        self.podgroups = {**kept, **fresh}
        self.trees.relist_leaves(source, objects)

    def group_spec(self, ref: GroupRef) -> GroupSpec:
        """The group's rules; raises GroupNotFound or PodGroupSpecError with a usable message."""
        if ref.min_available is not None:  # objectless: labels, Kueue, YuniKorn
            return spec_from_labels(ref, self._pods.labelled)
        self.trees.check_leaf(ref)
        record = self.podgroups.get(ref.key)
        if record is None:
            raise GroupNotFound(not_found_message(ref))
        if record.spec is None:
            raise PodGroupSpecError(record.error or f"PodGroup {ref.key} has an unusable spec")
        return record.spec
