"""Free capacity, from the nodes' allocatable and what the pods placed on them request.

Two views of it, both kept up to date node by node (FreeRoom): per node as
bins a packing can fill, and summed over the cluster for the minResources
rule. Both skip nodes marked unschedulable: nothing new lands there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from app.core.packing import Bin
from app.core.records import NodeRecord, PodRecord
from app.core.resources import Resources, add, subtract
from app.core.shared_pools import SharedPool


class NodeChanges(Protocol):
    def nodes_changed_since(self, stamp: int) -> tuple[int, list[str] | None]:
        """The stamp now, and the nodes changed since `stamp` (None: too many, all)."""
        ...


class PoolSource(Protocol):
    """The device pools published for many nodes (app/core/devices/shared.py): the
    same objects in every bin of the nodes they serve, brought up to date in place."""

    def refresh(self) -> None:
        """Count the pools anew if the devices changed."""
        ...

    def for_node(self, record: NodeRecord, *, empty: bool = False) -> tuple[SharedPool, ...]:
        """The pools the node may use (`empty`: as in the empty cluster)."""
        ...


def total_allocatable(nodes: Iterable[NodeRecord]) -> Resources:
    total: Resources = {}
    for node in nodes:
        if not node.unschedulable:
            add(total, node.allocatable)
    return total


class FreeRoom:
    """Each schedulable node as a bin, kept between calls: what it has free, and its
    allocatable (the empty cluster); and what is free summed over them all.

    A gang admission asks for these every time, and between two admissions
    only the nodes a pod came to or left, or whose record changed, need
    computing again (`changed_since`: the state's nodes_changed_since()). At
    5,000 nodes, summing every node afresh would be nine tenths of a fresh
    gang member's filter. The bins handed out are shared with later calls (a
    node that changes gets new bins, never changed ones): read them, copy any
    you change.
    """

    def __init__(
        self,
        requested: Mapping[str, Resources],
        changes: NodeChanges,
        pools: PoolSource | None = None,
    ) -> None:
        """`changes`: the state's ChangeLog; `pools`: the device book's shared pools."""
        self._requested = requested
        self._pools = pools
        self._changed_since = changes.nodes_changed_since
        # Schedulable node -> its bins, in node order; where each is in that order.
        self._free: dict[str, Bin] = {}
        self._allocatable: dict[str, Bin] = {}
        self._position: dict[str, int] = {}
        # Schedulable node -> what it has left of each resource it offers (never
        # below zero); and their sum, the cluster's free capacity.
        self._left: dict[str, Resources] = {}
        self._total: Resources = {}
        # The change stamp they are up to date with (-1: none, build them all).
        self._stamp = -1
        # A rebuild of every bin done a slice at a time (warm()): the nodes left, the bins
        # built so far, and the change stamp it began at.
        self._rebuild: _Rebuild | None = None

    def forget(self) -> None:
        """Nodes came, went or changed whether they take pods: build every bin again."""
        self._stamp = -1
        self._rebuild = None

    def warm(self, nodes: Mapping[str, NodeRecord], most: int) -> bool:
        """Build at most `most` bins of a rebuild of them all (after a start, a relist, nodes
        that came, went or were cordoned), the event loop free between two calls; True: the
        bins are up to date (the next call that reads them only catches up on changes).

        5,000 nodes' bins at once took 22-55 ms on a quiet machine, a slice of 500 5 ms. Nodes that
        change meanwhile are brought up to date when the rebuild ends, as any change is."""
        if self._pools is not None:
            self._pools.refresh()
        if self._stamp >= 0 and self._rebuild is None:
            stamp, changed = self._changed_since(self._stamp)
            if changed is not None:
                return True  # a few changes: the next read catches up on them
            self._stamp = -1
        rebuild = self._rebuild
        if rebuild is None:
            stamp, _ = self._changed_since(-1)
            names = [n.name for n in nodes.values() if not n.unschedulable]
            rebuild = self._rebuild = _Rebuild(stamp, names)
        for name in rebuild.names[rebuild.done : rebuild.done + most]:
            node = nodes.get(name)
            if node is not None and not node.unschedulable:
                rebuild.add(
                    name, self._free_bin(node), self._allocatable_bin(node), self._left_on(node)
                )
        rebuild.done += most
        if rebuild.done < len(rebuild.names):
            return False
        self._install(rebuild)
        return True

    def _install(self, rebuild: _Rebuild) -> None:
        """The rebuild's bins become the bins, up to date with its stamp: their positions and
        the total were kept slice by slice (at the end, 5,000 nodes' were 3-4 ms more of the
        last slice, which the line's warm-up followed with its walk's first slice)."""
        self._rebuild = None
        self._free, self._allocatable = rebuild.free, rebuild.allocatable
        self._position = rebuild.position
        self._left, self._total = rebuild.left, rebuild.total
        self._stamp = rebuild.stamp

    def room(self, nodes: Mapping[str, NodeRecord], leaving: Iterable[PodRecord]) -> list[Bin]:
        """The free bins once the pods `leaving` are gone (below zero where overcommitted)."""
        self._catch_up(nodes)
        out = list(self._free.values())
        for pod in leaving:
            i = self._position.get(pod.placed_node)
            if i is not None:
                b = out[i]
                free = dict(b.free)
                add(free, pod.requests)
                out[i] = b.with_free(free)
        return out

    def allocatable(self, nodes: Mapping[str, NodeRecord]) -> list[Bin]:
        """The allocatable bins (sharing the node records' dicts)."""
        self._catch_up(nodes)
        return list(self._allocatable.values())

    def positions(self, nodes: Mapping[str, NodeRecord]) -> Mapping[str, int]:
        """Where each node's bin is in room()'s and allocatable()'s lists.

        Shared: never change it (a rebuild makes a new one; bins replaced in
        place keep their position).
        """
        self._catch_up(nodes)
        return self._position

    def free(self, nodes: Mapping[str, NodeRecord], own: Iterable[PodRecord] = ()) -> Resources:
        """Allocatable minus what placed pods request, summed over schedulable nodes.

        The `own` pods (a group's members) do not count as used: a group that
        already has members placed needs only the rest (Coscheduling's
        minResources rule). Each node contributes what is left on it, never
        less than zero.
        """
        self._catch_up(nodes)
        own_on: dict[str, Resources] = {}
        for pod in own:
            if pod.placed_node in self._left:
                add(own_on.setdefault(pod.placed_node, {}), pod.requests)
        total = dict(self._total)
        for name, requests in own_on.items():  # a few nodes of thousands
            used = dict(self._requested.get(name, _NOTHING))
            subtract(used, requests)
            subtract(total, self._left[name])
            add(total, _left(nodes[name].allocatable, used))
        return total

    def _catch_up(self, nodes: Mapping[str, NodeRecord]) -> None:
        if self._pools is not None:
            self._pools.refresh()  # what the bins' shared pools hold, as the devices are now
        stamp, changed = self._changed_since(self._stamp)
        if self._rebuild is not None and (changed is None or self._stamp < 0):
            # A rebuild under way (warm()): finish it, then catch up on what changed since.
            self.warm(nodes, len(nodes))
            stamp, changed = self._changed_since(self._stamp)
        if changed is None or self._stamp < 0:
            schedulable = [n for n in nodes.values() if not n.unschedulable]
            self._free = {n.name: self._free_bin(n) for n in schedulable}
            self._allocatable = {n.name: self._allocatable_bin(n) for n in schedulable}
            self._position = {name: i for i, name in enumerate(self._free)}
            self._left = {n.name: self._left_on(n) for n in schedulable}
            self._total = {}
            for left in self._left.values():
                add(self._total, left)
        else:
            for name in set(changed):
                node = nodes.get(name)
                if node is not None and name in self._free:
                    self._free[name] = self._free_bin(node)
                    self._allocatable[name] = self._allocatable_bin(node)
                    subtract(self._total, self._left[name])
                    self._left[name] = left = self._left_on(node)
                    add(self._total, left)
        self._stamp = stamp

    def _left_on(self, node: NodeRecord) -> Resources:
        return _left(node.allocatable, self._requested.get(node.name, _NOTHING))

    def _free_bin(self, node: NodeRecord) -> Bin:
        free = dict(node.allocatable)
        subtract(free, self._requested.get(node.name, _NOTHING))
        return Bin(node.name, free, node.labels, node.taints, self._pools_of(node))

    def _allocatable_bin(self, node: NodeRecord) -> Bin:
        pools = self._pools_of(node, empty=True)
        return Bin(node.name, node.allocatable, node.labels, node.taints, pools)

    def _pools_of(self, node: NodeRecord, *, empty: bool = False) -> tuple[SharedPool, ...]:
        return () if self._pools is None else self._pools.for_node(node, empty=empty)


_NOTHING: Resources = {}


class _Rebuild:
    """Every bin built anew, a slice at a time (FreeRoom.warm)."""

    def __init__(self, stamp: int, names: list[str]) -> None:
        self.stamp = stamp
        self.names = names
        self.done = 0
        self.free: dict[str, Bin] = {}
        self.allocatable: dict[str, Bin] = {}
        self.left: dict[str, Resources] = {}
        # Where each node built is in `free`'s order, and the sum of `left`.
        self.position: dict[str, int] = {}
        self.total: Resources = {}

    def add(self, name: str, free: Bin, allocatable: Bin, left: Resources) -> None:
        """Node `name`'s bins built (each node once: the names come from the nodes by name)."""
        self.position[name] = len(self.free)
        self.free[name], self.allocatable[name], self.left[name] = free, allocatable, left
        add(self.total, left)


def _left(allocatable: Resources, used: Mapping[str, int]) -> Resources:
    """What is left of each resource a node offers once `used` is taken; none below zero."""
    return {
        name: left
        for name, amount in allocatable.items()
        if (left := amount - used.get(name, 0)) > 0
    }
