"""The pod kube-scheduler sent, as the verbs read it: its group, its rules, and its siblings.

kube-scheduler sends the whole Pod with each call; its group is looked up
once per call, and a group that cannot be used becomes a problem to turn the
pod away with, not an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.admission import FilterReason, PermitVerdict, wholeness
from app.core.group_rules import (
    role_problem,
)
from app.core.groups import (
    SOURCE_YUNIKORN,
    GroupLabelError,
    GroupRef,
    GroupSpec,
    PodGroupSpecError,
    group_ref_of_pod,
)
from app.core.observer import MemberRef
from app.core.packing import Demand
from app.core.placement import placement_of
from app.core.records import GroupNotFound, delivered
from app.core.resources import QuantityError, Resources
from app.core.state import ClusterState
from app.core.topology.domains import TopologyConstraint, TopologyError
from app.core.topology.subgroups import PodShape, Slicing, pod_shape


@dataclass(frozen=True, slots=True)
class GroupProblem:
    """The pod names a group that cannot be used: it is turned away with this."""

    reason: FilterReason
    message: str


@dataclass(frozen=True, slots=True)
class PodView:
    """What the verbs need of the pod kube-scheduler sent, and its group, read once."""

    namespace: str
    name: str
    uid: str
    priority: int
    # The Pod's spec as sent (requests and placement are read from it when needed).
    pod_spec: Mapping[str, Any]
    ref: GroupRef | None
    spec: GroupSpec | None
    problem: GroupProblem | None
    # What the pod asks for, its DRA claims' devices included (nothing when its
    # requests cannot be read).
    requests: Resources
    # Kueue's topology annotations on the pod (app/core/topology/domains.py).
    topology: TopologyConstraint | None = None
    # Kueue's podset slices on the pod and its rank (app/core/topology/tree.py).
    slicing: Slicing | None = None
    rank: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def member(self) -> MemberRef:
        return MemberRef(self.namespace, self.name, self.uid)

    @property
    def demand(self) -> Demand:
        return Demand(self.key, self.requests, placement_of(self.pod_spec))


class PodViews:
    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def view(self, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        pod_spec = pod.get("spec") or {}
        namespace = meta.get("namespace") or "default"
        ref: GroupRef | None = None
        spec: GroupSpec | None = None
        problem: GroupProblem | None = None
        shape = PodShape()
        try:
            ref = self._state.trees.rekey(
                group_ref_of_pod(namespace, meta, pod_spec, self._state.sources)
            )
            if ref is not None:
                shape = pod_shape(meta)
        except (GroupLabelError, TopologyError) as err:
            problem = GroupProblem(FilterReason.BAD_GROUP, str(err))
        if ref is not None:
            try:
                spec = self._state.group_spec(ref)
            except GroupNotFound as err:
                problem = GroupProblem(FilterReason.NO_GROUP, str(err))
            except PodGroupSpecError as err:
                problem = GroupProblem(FilterReason.BAD_GROUP, str(err))
        if (
            spec is not None
            and problem is None
            and (spec.sub_groups or spec.source == SOURCE_YUNIKORN)
        ):
            problem = self._misnamed(spec, ref, f"{namespace}/{meta.get('name') or ''}")
        name, uid = meta.get("name") or "", meta.get("uid") or ""
        return PodView(
            namespace,
            name,
            uid,
            int(pod_spec.get("priority") or 0),
            pod_spec,
            ref,
            spec,
            problem,
            self._requests(namespace, f"{namespace}/{name}", uid, pod_spec),
            *shape,
        )

    def _requests(
        self, namespace: str, key: str, uid: str, pod_spec: Mapping[str, Any]
    ) -> Resources:
        """As our watch has the pod (its claims' devices counted), else as sent."""
        known = self._state.known_pod(key, uid)
        if known is not None:
            return known.requests
        try:
            return self._state.devices.unseen_requests(namespace, key, pod_spec)
        except QuantityError:
            return {}

    def _misnamed(self, spec: GroupSpec, ref: GroupRef | None, key: str) -> GroupProblem | None:
        """KAI, YuniKorn: a member (this pod or a sibling) naming a role its gang lacks holds
        the whole gang, each member told which pod and name (never a start without it)."""
        named = [(p.key, p.group.task) for p in self._state.members(spec.key) if p.group]
        if ref is not None:
            named.append((key, ref.task))
        for member, task in named:
            message = role_problem(spec, member, task)
            if message is not None:
                return GroupProblem(FilterReason.BAD_GROUP, message)
        return None

    def siblings(self, spec: GroupSpec, ref: GroupRef, uid: str) -> PermitVerdict:
        """The group's existing pods against its minimums (minMember, minTaskMember).

        The pod being scheduled counts even if our watch has not delivered it yet.
        """
        members = self._state.members(ref.key)
        unseen = bool(uid) and not delivered(members, uid)

        def tasks() -> list[str]:
            found = [p.group.task for p in members if p.group is not None]
            return [*found, ref.task] if unseen else found

        return wholeness(spec, len(members) + unseen, tasks)
