"""What a group's status should say right now, from the cache alone.

Kept apart from the reconciler (app/ops/status_reconciler.py) so that the
answer depends on nothing but the group object and its members' pod
records: no write history, no clock, no I/O. That is what makes a restarted
extender write the same status as the one it replaced, and what lets the
view be tested without a loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.groups import SOURCE_LABELS
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.core.status import GroupStatus, GroupView, TopologyPlacement, compute_status
from app.core.topology.domains import DEFAULT_LEVELS, TopologyConstraint, placed_message
from app.core.topology.sources import constraint_of


@dataclass(frozen=True, slots=True)
class _Declared:
    """What the group asks for: by its object, or (objectless) by its pods' labels."""

    source: str
    min_member: int
    topology: TopologyConstraint | None = None
    queue: str | None = None
    priority_class_name: str | None = None


class GroupViews:
    """Computes a group's GroupView from the cluster state."""

    def __init__(self, state: ClusterState, levels: tuple[str, ...] = DEFAULT_LEVELS) -> None:
        """levels: --topology-levels, for the TopologyPlaced condition."""
        self._state = state
        self._levels = levels

    def view(
        self,
        key: str,
        pods: Sequence[PodRecord],
        previous: GroupStatus | None,
        start_time: str | None,
    ) -> GroupView | None:
        """The group's view; None when there is nothing to show (no such group, no spec).

        `pods`: its members in every phase; `previous`: the status shown so far
        (a Finished or Failed outcome outlives its pods); `start_time`: when the
        first member started waiting in the gate (RFC 3339), if it did.
        """
        declared = self._declared(key, pods)
        if declared is None:
            return None
        waiting = any(p.reserved_node and not p.node_name for p in pods)
        status = compute_status(declared.min_member, pods, waiting, previous)
        if start_time is not None and status.schedule_start_time is None:
            status = dataclasses.replace(status, schedule_start_time=start_time)
        if status.gang_scheduled:
            placement = self._placement(key, declared.topology, pods)
            if placement is not None:
                status = dataclasses.replace(status, topology=placement)
        return GroupView(
            key,
            declared.source,
            declared.min_member,
            sum(1 for p in pods if p.counts_as_member),
            status,
            declared.queue,
            declared.priority_class_name,
        )

    def _declared(self, key: str, pods: Sequence[PodRecord]) -> _Declared | None:
        record = self._state.podgroups.get(key)
        if record is not None:
            spec = record.spec
            if spec is None:
                return None
            return _Declared(
                record.source, spec.min_member, spec.topology, spec.queue, spec.priority_class_name
            )
        label_min = [p.group.min_available for p in pods if p.group and p.group.min_available]
        if not label_min:
            return None  # no such group, or pods naming a PodGroup that does not exist
        # Objectless: label-only or Kueue pod groups, as the pods say.
        source = next((p.group.source for p in pods if p.group), SOURCE_LABELS)
        return _Declared(source, max(label_min))

    def _placement(
        self, key: str, own: TopologyConstraint | None, pods: Sequence[PodRecord]
    ) -> TopologyPlacement | None:
        """The domain its bound members share, for a gang with a topology constraint.

        Derived from where the members are (no history): the same after a restart.
        """
        constraint = constraint_of(own, ((p.key, p.topology) for p in pods))
        if constraint is None:
            return None
        nodes = [p.node_name for p in pods if p.node_name]
        domain = self._state.placed_domain(constraint, self._levels, nodes)
        return TopologyPlacement(domain is not None, placed_message(key, constraint, domain))
