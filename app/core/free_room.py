"""Free capacity, from the nodes' allocatable and what the pods placed on them request.

Two views of it: per node as bins a packing can fill (room), and summed over
the cluster for the minResources rule (free_resources). Both skip nodes
marked unschedulable: nothing new lands there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.core.packing import Bin
from app.core.records import NodeRecord, PodRecord
from app.core.resources import Resources, add, subtract


def total_allocatable(nodes: Iterable[NodeRecord]) -> Resources:
    total: Resources = {}
    for node in nodes:
        if not node.unschedulable:
            add(total, node.allocatable)
    return total


def room(
    nodes: Iterable[NodeRecord],
    requested: Mapping[str, Resources],
    leaving: Iterable[PodRecord],
) -> list[Bin]:
    """What each schedulable node has free once the pods `leaving` it are gone.

    A fresh copy per call, for a packing to work on (gang admission, the
    preempt verb); below zero where a node is overcommitted.
    """
    leaving_on: dict[str, list[Resources]] = {}
    for pod in leaving:
        leaving_on.setdefault(pod.placed_node, []).append(pod.requests)
    bins: list[Bin] = []
    for node in nodes:
        if node.unschedulable:
            continue
        free = dict(node.allocatable)
        subtract(free, requested.get(node.name, {}))
        for requests in leaving_on.get(node.name, ()):
            add(free, requests)
        bins.append(Bin(node.name, free, node.labels, node.taints))
    return bins


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
    for node in nodes:
        if node.unschedulable:
            continue
        used = dict(requested.get(node.name, {}))
        subtract(used, own_on.get(node.name, {}))
        for name, amount in node.allocatable.items():
            left = amount - used.get(name, 0)
            if left > 0:
                free[name] = free.get(name, 0) + left
    return free
