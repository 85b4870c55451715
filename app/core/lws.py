"""LeaderWorkerSet's group labels as a group source: each replica a gang of its size. Pure.

A LeaderWorkerSet (kubernetes-sigs/lws, api/leaderworkerset/v1) runs
`replicas` groups of `size` pods: a leader and size-1 workers. It creates no
group object; every pod of a replica carries (set by LWS's controller and
pod webhook):

- label `leaderworkerset.sigs.k8s.io/name` (the set) and
  `leaderworkerset.sigs.k8s.io/group-index` (the replica, 0..replicas-1);
- annotation `leaderworkerset.sigs.k8s.io/size` (leader included): the gang's
  size, as LWS's Volcano provider uses it for the PodGroup's minMember;
- with a subGroupPolicy: annotation `leaderworkerset.sigs.k8s.io/subgroup-size`
  and label `leaderworkerset.sigs.k8s.io/subgroup-index` (the leader has none
  under `LeaderExcluded`);
- annotations `leaderworkerset.sigs.k8s.io/exclusive-topology` and
  `.../subgroup-exclusive-topology` (copied from the set): a node label key,
  one replica (sub-group) per domain of it. Read here as a *required* level
  for the replica (each sub-group): it lands whole in one domain.

exclusive-topology: LWS's controller creates a replica's workers only once
its leader has a node (pkg/controllers/pod_controller.go: "if exclusive
placement is enabled but leader pod is not scheduled, don't create the
worker sts"), then pins them to the leader's domain with a nodeSelector; its
pod webhook gives the leader pod affinity to its own group and anti-affinity
to every other group on that key. A gang of `size` would never start (the
leader would wait for workers that are not created), so such a replica is
read as under LeaderReady: minMember 1, the leader placed alone, but only in
a domain that holds no other LWS group and has room for the whole replica
(app/core/topology/exclusive.py); whatever of the replica exists when it is
admitted is placed together.

The gang key is `lws:<namespace>/<name>-<group-index>`. The source is opt-in
(--lws-gangs): LWS's labels are on every LWS pod, so turning it on makes every
replica of every set a gang.

startupPolicy LeaderReady: LWS creates the workers only once the leader is
Ready, so a gang of `size` would never start. LWS puts nothing on the pods
that says which policy its set has (its keys in api/leaderworkerset/v1 hold
none), so a set using it says so on its templates with the annotation
`gang-extender.dev/lws-startup-policy: LeaderReady`. Such a replica is read
as LWS's own Volcano provider reads it: minMember 1 (the leader starts alone;
the workers join the replica's domain, never held for each other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.api_ints import is_int32
from app.core.topology.domains import TopologyConstraint
from app.core.topology.subgroups import SubGroupPolicy

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LWS_SUBGROUP_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/subgroup-size"
LWS_SUBGROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/subgroup-index"
LWS_EXCLUSIVE_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LWS_SUBGROUP_EXCLUSIVE_ANNOTATION = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
# Not LWS's: what a LeaderReady set adds to its templates (module doc).
LWS_STARTUP_POLICY_ANNOTATION = "gang-extender.dev/lws-startup-policy"
LEADER_READY = "LeaderReady"
LEADER_CREATED = "LeaderCreated"

# The sub-groups' names: subgroup-0, subgroup-1, ... (SubGroupPolicy.path_of).
SUBGROUP = "subgroup"


class LwsLabelError(ValueError):
    """The pod's LWS labels or annotations cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class LwsGang:
    """What one LWS replica asks for, read from one of its pods."""

    name: str
    group_index: str
    size: int
    # size, or 1 under startupPolicy LeaderReady or with exclusive-topology (module doc).
    min_member: int
    # exclusive-topology as a required level for the replica (None: none).
    constraint: TopologyConstraint | None
    # The replica's sub-groups (subgroup-index label), () without a subGroupPolicy.
    policies: tuple[SubGroupPolicy, ...]

    @property
    def group_name(self) -> str:
        """The replica's gang name (its key is lws:<namespace>/<group_name>)."""
        return f"{self.name}-{self.group_index}"


def _count(annotations: Mapping[str, Any], key: str, name: str) -> int:
    raw = annotations.get(key)
    value = int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() else 0
    if not is_int32(value, 1):
        raise LwsLabelError(
            f"LeaderWorkerSet {name}: annotation {key} must be a whole number >= 1, "
            f"got {raw!r:.40}; LWS's controller sets it on every pod of the set "
            "(recreate the pod from its LeaderWorkerSet, or remove the label "
            f"{LWS_NAME_LABEL})"
        )
    return value


def _level(annotations: Mapping[str, Any], key: str, name: str) -> str | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or " " in raw:
        raise LwsLabelError(
            f"LeaderWorkerSet {name}: annotation {key} must name a node label key, got {raw!r:.40}"
        )
    return raw


def lws_gang_of(labels: Mapping[str, str], annotations: Mapping[str, Any]) -> LwsGang | None:
    """The replica the pod belongs to, None when it carries no LWS name label.

    Raises LwsLabelError for labels that name a set but cannot be used (no
    group index, a size that is not a whole number, a sub-group size larger
    than the group, a startup policy LWS does not have): the pod is turned
    away with the message, never scheduled alone.
    """
    name = labels.get(LWS_NAME_LABEL)
    if name is None:
        return None
    if not name:
        raise LwsLabelError(f"label {LWS_NAME_LABEL} is empty: LWS sets it to the set's name")
    index = labels.get(LWS_GROUP_INDEX_LABEL)
    if not index or not (index.isascii() and index.isdigit()):
        raise LwsLabelError(
            f"LeaderWorkerSet {name}: label {LWS_GROUP_INDEX_LABEL} must be the replica's "
            f"index (a whole number), got {index!r:.40}; LWS's pod webhook sets it"
        )
    size = _count(annotations, LWS_SIZE_ANNOTATION, name)
    policy = annotations.get(LWS_STARTUP_POLICY_ANNOTATION, LEADER_CREATED)
    if policy not in (LEADER_CREATED, LEADER_READY):
        raise LwsLabelError(
            f"LeaderWorkerSet {name}: annotation {LWS_STARTUP_POLICY_ANNOTATION} must be "
            f"{LEADER_CREATED} or {LEADER_READY} (the set's spec.startupPolicy), "
            f"got {policy!r:.40}"
        )
    exclusive = _level(annotations, LWS_EXCLUSIVE_ANNOTATION, name)
    constraint = (
        TopologyConstraint(
            exclusive, True, origin=f"annotation {LWS_EXCLUSIVE_ANNOTATION} on the pod"
        )
        if exclusive
        else None
    )
    policies = _sub_groups(annotations, name, size)
    # Workers come only once the leader has a node (LeaderReady; exclusive-topology: module doc).
    alone = policy == LEADER_READY or constraint is not None
    return LwsGang(name, index, size, 1 if alone else size, constraint, policies)


def _sub_groups(annotations: Mapping[str, Any], name: str, size: int) -> tuple[SubGroupPolicy, ...]:
    """The replica's sub-groups (subgroup-index label), () without a subGroupPolicy."""
    if LWS_SUBGROUP_SIZE_ANNOTATION not in annotations:
        return ()
    sub_size = _count(annotations, LWS_SUBGROUP_SIZE_ANNOTATION, name)
    if sub_size > size:
        raise LwsLabelError(
            f"LeaderWorkerSet {name}: annotation {LWS_SUBGROUP_SIZE_ANNOTATION}={sub_size} "
            f"is larger than the group's size {size} ({LWS_SIZE_ANNOTATION}); LWS's own "
            "validation allows at most the size"
        )
    sub_level = _level(annotations, LWS_SUBGROUP_EXCLUSIVE_ANNOTATION, name)
    return (
        SubGroupPolicy(
            SUBGROUP,
            sub_size,
            # Every sub-group is whole once the replica is (the gang's minimum is all
            # of it): no sub-group is held on its own count.
            0,
            (),
            (LWS_SUBGROUP_INDEX_LABEL,),
            TopologyConstraint(
                sub_level,
                True,
                origin=f"annotation {LWS_SUBGROUP_EXCLUSIVE_ANNOTATION} on the pod",
            )
            if sub_level
            else None,
            exclusive=bool(sub_level),
        ),
    )
