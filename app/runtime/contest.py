"""What one admission decision weighs, gathered from the cluster state, the claims and the line."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.contention import Gang, Holder
from app.core.packing import Bin
from app.core.state import ClusterState


@dataclass(slots=True)
class Contest:
    """The room free, the empty cluster, who holds capacity, who waits (app/core/contention.py).

    Gathered once per decision, so that the queue check, the decision and
    reclaim all weigh the same moment.
    """

    free: list[Bin]
    allocatable: list[Bin]
    holders: list[Holder]
    line: list[Gang]


def capacity(state: ClusterState) -> tuple[list[Bin], list[Bin]]:
    """(what is free on each schedulable node, its allocatable): the packing's input.

    The allocatable bins share the node records' dicts: packing never
    changes the bins it is given (app/core/packing.py).
    """
    allocatable = [
        Bin(node.name, node.allocatable, node.labels, node.taints)
        for node in state.nodes.values()
        if not node.unschedulable
    ]
    return state.room(), allocatable
