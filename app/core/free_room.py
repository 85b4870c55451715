"""Free capacity, from the nodes' allocatable and what the pods placed on them request.

Two views of it: per node as bins a packing can fill (FreeRoom, kept up to
date node by node), and summed over the cluster for the minResources rule
(free_resources). Both skip nodes marked unschedulable: nothing new lands there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from app.core.packing import Bin
from app.core.records import NodeRecord, PodRecord
from app.core.resources import Resources, add, subtract


def total_allocatable(nodes: Iterable[NodeRecord]) -> Resources:
    total: Resources = {}
    for node in nodes:
        if not node.unschedulable:
            add(total, node.allocatable)
    return total


class FreeRoom:
    """Each schedulable node as a bin, kept between calls: what it has free, and its
    allocatable (the empty cluster).

    A gang admission asks for both every time, and between two admissions only
    the nodes a pod came to or left, or whose record changed, need computing
    again (`changed_since`: the state's nodes_changed_since()). The bins
    handed out are shared with later calls (a node that changes gets new
    bins, never changed ones): read them, copy any you change.
    """

    def __init__(
        self,
        requested: Mapping[str, Resources],
        changed_since: Callable[[int], tuple[int, list[str] | None]],
    ) -> None:
        self._requested = requested
        self._changed_since = changed_since
        # Schedulable node -> its bins, in node order; where each is in that order.
        self._free: dict[str, Bin] = {}
        self._allocatable: dict[str, Bin] = {}
        self._position: dict[str, int] = {}
        # The change stamp they are up to date with (-1: none, build them all).
        self._stamp = -1

    def forget(self) -> None:
        """Nodes came, went or changed whether they take pods: build every bin again."""
        self._stamp = -1

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
                out[i] = Bin(b.name, free, b.labels, b.taints)
        return out

    def allocatable(self, nodes: Mapping[str, NodeRecord]) -> list[Bin]:
        """The allocatable bins (sharing the node records' dicts)."""
        self._catch_up(nodes)
        return list(self._allocatable.values())

    def _catch_up(self, nodes: Mapping[str, NodeRecord]) -> None:
        stamp, changed = self._changed_since(self._stamp)
        if changed is None or self._stamp < 0:
            schedulable = [n for n in nodes.values() if not n.unschedulable]
            self._free = {n.name: self._free_bin(n) for n in schedulable}
            self._allocatable = {n.name: _allocatable_bin(n) for n in schedulable}
            self._position = {name: i for i, name in enumerate(self._free)}
        else:
            for name in set(changed):
                node = nodes.get(name)
                if node is not None and name in self._free:
                    self._free[name] = self._free_bin(node)
                    self._allocatable[name] = _allocatable_bin(node)
        self._stamp = stamp

    def _free_bin(self, node: NodeRecord) -> Bin:
        free = dict(node.allocatable)
        subtract(free, self._requested.get(node.name, {}))
        return Bin(node.name, free, node.labels, node.taints)


def _allocatable_bin(node: NodeRecord) -> Bin:
    return Bin(node.name, node.allocatable, node.labels, node.taints)


def free_resources(
    nodes: Iterable[NodeRecord],
    requested: Mapping[str, Resources],
    own: Iterable[PodRecord] = (),
) -> Resources:
    """Allocatable minus what placed pods request, over schedulable nodes.

    The `own` pods (a group's members) do not count as used: a group that
    already has members placed needs only the rest (Coscheduling's
    minResources rule). Each node contributes what is left on it, never less
    than zero.
    """
    own_on: dict[str, Resources] = {}
    for pod in own:
        if pod.placed_node:
            add(own_on.setdefault(pod.placed_node, {}), pod.requests)
    free: Resources = {}
    nothing: Resources = {}
    for node in nodes:
        if node.unschedulable:
            continue
        used = requested.get(node.name, nothing)
        if node.name in own_on:  # a few nodes of thousands: copy only theirs
            used = dict(used)
            subtract(used, own_on[node.name])
        for name, amount in node.allocatable.items():
            left = amount - used.get(name, 0)
            if left > 0:
                free[name] = free.get(name, 0) + left
    return free
