"""Gangs made of groups: the tree of a gang's sub-groups, and its members' paths. Pure.

A gang is a tree. Its root is the gang itself (minMember, its own topology
constraint, app/core/topology/domains.py); below it are optional sub-groups:

- slices (Kueue's podset slices, app/core/topology/sources.py): consecutive
  ranks, `size` pods each, every slice in one domain of its level, up to
  three nested layers (block slices of 8 made of rack slices of 4). As in
  Kueue, the ranks past the last whole slice (a size that does not divide
  the gang) belong to no slice: they go anywhere in the gang's domain;
- Volcano subGroupPolicy sub-groups (app/core/topology/subgroup_sources.py):
  one per policy and distinct values of its matchLabelKeys, subGroupSize
  pods each, in one domain of the policy's own networkTopology;
- roles (Volcano minTaskMember, YuniKorn task groups): named groups with
  their own minimum and no level of their own;
- named sub-groups (KAI's subGroups, app/core/kai.py): a tree by name and
  parent, each leaf a role, any node with its own level.

A flat gang is a tree of one node (tree_of() says None): domains.place()
alone places it, as before. A member's *path* names the sub-groups it
belongs to, outermost first: ("block-0", "rack-1") for rank 5 of slices
[block 8, rack 4], ("worker-1",) for partition 1 of policy worker,
("head",) for role head, () for none. Placing the tree
is app/core/topology/tree.py's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.core.placement import Requirement, requirement_matches
from app.core.topology.domains import TopologyConstraint, TopologyError, short_level
from app.core.topology.sources import (
    KUEUE_SLICE_CONSTRAINTS,
    KUEUE_SLICE_REQUIRED,
    constraint_from_annotations,
    rank_of,
    slices_from_annotations,
)

Path = tuple[str, ...]

SLICE = "slice"
ROLE = "role"


@dataclass(frozen=True, slots=True)
class Slicing:
    """Kueue's podset slices: (node label key, pods per slice) per layer, outermost first."""

    layers: tuple[tuple[str, int], ...]
    # Where it was declared, for messages.
    origin: str = ""

    def path(self, rank: int | None, count: int) -> Path:
        """The slices of the member of rank `rank` among `count` pods; () for none.

        Ranks past the last whole outermost slice belong to none (Kueue's integer
        division: its assignment covers count // size slices).
        """
        if rank is None or rank < 0 or not self.layers:
            return ()
        top = self.layers[0][1]
        if rank >= count // top * top:
            return ()
        return tuple(f"{short_level(level)}-{rank // size}" for level, size in self.layers)

    def check(self, key: str, count: int) -> None:
        """Kueue's rule that a slice is not larger than the gang (TopologyError otherwise)."""
        level, size = self.layers[0]
        if size > count:
            raise TopologyError(
                f"gang {key} has {count} pod(s) but its slices of {short_level(level)} are "
                f"{size} pods each ({self.origin}): the slice size must be at most the gang's size"
            )


def slicing_from_annotations(
    annotations: Mapping[str, object] | None, where: str
) -> Slicing | None:
    """Kueue's slice annotations on a pod or PodGroup (TopologyError when unusable)."""
    layers = slices_from_annotations(annotations, where)
    if not layers:
        return None
    listed = annotations is not None and KUEUE_SLICE_CONSTRAINTS in annotations
    name = KUEUE_SLICE_CONSTRAINTS if listed else KUEUE_SLICE_REQUIRED
    return Slicing(layers, f"annotation {name} on the {where}")


def slicing_of(
    own: Slicing | None, members: Iterable[tuple[str, Slicing | None]], pod: Slicing | None = None
) -> Slicing | None:
    """A gang's slices: its group object's, else the first member's by name, else the pod's.

    The same rule as the gang's topology constraint (sources.constraint_of), so every
    member agrees.
    """
    if own is not None:
        return own
    for _, slicing in sorted(((k, s) for k, s in members if s is not None), key=lambda ks: ks[0]):
        return slicing
    return pod


@dataclass(frozen=True, slots=True)
class SubGroupPolicy:
    """One entry of a Volcano PodGroup's spec.subGroupPolicy (volcano-sh/apis v1beta1)."""

    name: str
    # subGroupSize: the pods a sub-group needs to count as ready.
    size: int
    # minSubGroups: how many of its sub-groups must be ready (0: none is required).
    min_sub_groups: int
    # labelSelector (ANDed requirements; empty: every pod) and matchLabelKeys.
    selector: tuple[Requirement, ...]
    keys: tuple[str, ...]
    # Its own networkTopology (not the PodGroup's: Volcano does not inherit it).
    constraint: TopologyConstraint | None = None
    # LWS subgroup-exclusive-topology: one sub-group per domain of its level.
    exclusive: bool = False

    def path_of(self, labels: Mapping[str, str]) -> Path | None:
        """The member's sub-group, None when this policy does not take it.

        As Volcano's scheduler reads it: the selector must match and every key
        carry a value; a policy with no matchLabelKeys takes no pod.
        """
        if not self.keys or not all(requirement_matches(r, "", labels) for r in self.selector):
            return None
        values = [labels.get(key) for key in self.keys]
        if not all(values):
            return None
        return (f"{self.name}-{'-'.join(v for v in values if v)}",)


@dataclass(frozen=True, slots=True)
class GangShape:
    """What a gang declares of its sub-groups, whichever source (tree_of() reads it)."""

    slicing: Slicing | None = None
    policies: tuple[SubGroupPolicy, ...] = ()
    roles: tuple[tuple[str, int], ...] = ()
    named: tuple[SubGroup, ...] = ()  # KAI's tree, shortest paths first


@dataclass(frozen=True, slots=True)
class SubGroup:
    """A node of the tree below the gang: its members are those whose path starts with `path`."""

    path: Path
    min_member: int
    # None: no level of its own (a role), anywhere inside its parent's domain.
    constraint: TopologyConstraint | None
    kind: str = SLICE
    # A domain of its own: no other exclusive sub-group shares it (SubGroupPolicy.exclusive).
    exclusive: bool = False

    def describe(self) -> str:
        return f"{self.kind} {self.path[-1]}"


class Member(NamedTuple):
    """What the tree needs of one member: its key, rank, role (task) and node ("": unplaced)."""

    key: str
    rank: int | None = None
    task: str = ""
    node: str = ""
    # Its labels (Volcano's subGroupPolicy matches them).
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class GangTree:
    """A gang's sub-groups (shortest paths first) and its members' paths."""

    groups: tuple[SubGroup, ...]
    # member key -> path, for the members in a sub-group.
    paths: Mapping[str, Path] = field(default_factory=dict)
    # (path, node) of the members placed already.
    placed: tuple[tuple[Path, str], ...] = ()

    def group(self, path: Path) -> SubGroup | None:
        """The deepest sub-group `path` is in (None: the gang itself)."""
        best: SubGroup | None = None
        for group in self.groups:
            if path[: len(group.path)] == group.path:
                best = group
        return best

    def children(self) -> dict[Path, list[SubGroup]]:
        """Each sub-group's (and the gang's, at ()) sub-groups right below it, in tree order."""
        known = {g.path for g in self.groups}
        found: dict[Path, list[SubGroup]] = {}
        for group in self.groups:
            parent = next(
                (
                    group.path[:d]
                    for d in range(len(group.path) - 1, 0, -1)
                    if group.path[:d] in known
                ),
                (),
            )
            found.setdefault(parent, []).append(group)
        return found

    def shortfall(self, counted: Iterable[str]) -> list[tuple[str, int, int]]:
        """(sub-group, have, need) for each slice or sub-group below its own minimum among
        the `counted` member keys (roles are Volcano's minTaskMember, counted by task)."""
        have: dict[Path, int] = {}
        for key in counted:
            path = self.paths.get(key, ())
            for depth in range(1, len(path) + 1):
                have[path[:depth]] = have.get(path[:depth], 0) + 1
        return [
            (group.describe(), have.get(group.path, 0), group.min_member)
            for group in self.groups
            if group.kind != ROLE and have.get(group.path, 0) < group.min_member
        ]

    def constrained(self, path: Path) -> list[SubGroup]:
        """The sub-groups on `path` with a topology constraint, outermost first."""
        return [
            g for g in self.groups if g.constraint is not None and path[: len(g.path)] == g.path
        ]


def tree_of(
    key: str,
    shape: GangShape,
    count: int,
    members: Iterable[Member],
) -> GangTree | None:
    """The gang's tree: its slices, else its sub-group policies, else its roles; None: flat.

    count: the gang's size (minMember; Kueue's pod-group-total-count). Raises
    TopologyError for a slice larger than the gang, or a sub-group Volcano
    would never count ready (fewer pods than its subGroupSize).
    """
    if shape.slicing is not None:
        found = _slices(key, shape.slicing, count, members)
    elif shape.policies:
        found = _policies(shape.policies, members)
    elif shape.named:
        found = _named(key, shape.named, members)
    elif shape.roles:
        found = _roles(shape.roles, members)
    else:
        return None
    groups, paths, placed = found
    ordered = tuple(sorted(groups.values(), key=lambda g: (len(g.path), g.path)))
    return GangTree(ordered, paths, tuple(placed))


_Found = tuple[dict[Path, SubGroup], dict[str, Path], list[tuple[Path, str]]]


def _slices(key: str, slicing: Slicing, count: int, members: Iterable[Member]) -> _Found:
    slicing.check(key, count)
    levels = [TopologyConstraint(level, True, origin=slicing.origin) for level, _ in slicing.layers]
    groups: dict[Path, SubGroup] = {}
    paths: dict[str, Path] = {}
    placed: list[tuple[Path, str]] = []
    for member in members:
        path = slicing.path(member.rank, count)
        if not path:
            continue
        for depth, (_, size) in enumerate(slicing.layers):
            prefix = path[: depth + 1]
            if prefix not in groups:
                groups[prefix] = SubGroup(prefix, size, levels[depth])
        paths[member.key] = path
        if member.node:
            placed.append((path, member.node))
    return groups, paths, placed


def _roles(roles: Sequence[tuple[str, int]], members: Iterable[Member]) -> _Found:
    groups: dict[Path, SubGroup] = {
        (task,): SubGroup((task,), need, None, ROLE) for task, need in roles
    }
    paths: dict[str, Path] = {}
    placed: list[tuple[Path, str]] = []
    for member in members:
        if (member.task,) in groups:
            paths[member.key] = (member.task,)
            if member.node:
                placed.append(((member.task,), member.node))
    return groups, paths, placed


def leaf_problem(key: str, named: Sequence[SubGroup], member: str, task: str) -> str | None:
    """Why a member's sub-group is no leaf of the named tree (None: it is one): KAI drops
    such a pod silently, here the gang is held and its members are told."""
    leaves = sorted(
        g.path[-1]
        for g in named
        if not any(o.path[: len(g.path)] == g.path and o.path != g.path for o in named)
    )
    if task in leaves:
        return None
    if not task:
        what = "names no sub-group"
    elif any(g.path[-1] == task for g in named):
        what = f"names sub-group {task!r}, which has sub-groups of its own"
    else:
        what = f"names sub-group {task!r}, which the PodGroup does not declare"
    return (
        f"gang {key}: member {member} {what}; set its sub-group label to one of the leaf "
        f"sub-groups ({', '.join(leaves)})"
    )


def _named(key: str, named: Sequence[SubGroup], members: Iterable[Member]) -> _Found:
    """KAI: a member's task names its leaf (none: TopologyError, leaf_problem())."""
    groups = {g.path: g for g in named}
    leaves = {g.path[-1]: g.path for g in named}
    paths: dict[str, Path] = {}
    placed: list[tuple[Path, str]] = []
    for member in members:
        problem = leaf_problem(key, named, member.key, member.task)
        if problem is not None:
            raise TopologyError(problem)
        path = leaves[member.task]
        paths[member.key] = path
        if member.node:
            placed.append((path, member.node))
    return groups, paths, placed


def _policies(policies: Sequence[SubGroupPolicy], members: Iterable[Member]) -> _Found:
    """Volcano: a sub-group per policy and distinct values of its matchLabelKeys.

    The first `minSubGroups` sub-groups of a policy (by name) must each reach
    subGroupSize; the others may start short (Volcano: at least that many whole).
    """
    paths: dict[str, Path] = {}
    placed: list[tuple[Path, str]] = []
    counts: dict[Path, int] = {}
    policy_of: dict[Path, SubGroupPolicy] = {}
    for member in members:
        for policy in policies:
            path = policy.path_of(member.labels or {})
            if path is None:
                continue
            paths[member.key] = path
            counts[path] = counts.get(path, 0) + 1
            policy_of[path] = policy
            if member.node:
                placed.append((path, member.node))
            break
    groups: dict[Path, SubGroup] = {}
    for policy in policies:
        own = sorted(path for path, p in policy_of.items() if p is policy)
        for i, path in enumerate(own):
            required = i < policy.min_sub_groups
            if required and counts[path] < policy.size:
                raise TopologyError(
                    f"sub-group {path[-1]} (subGroupPolicy {policy.name}) has {counts[path]} "
                    f"pod(s), fewer than its subGroupSize {policy.size}: Volcano never counts "
                    "it ready; create its missing pods or lower subGroupSize"
                )
            size = policy.size if required else 0
            groups[path] = SubGroup(path, size, policy.constraint, "sub-group", policy.exclusive)
    return groups, paths, placed


class PodShape(NamedTuple):
    """What a member's own annotations say of its place: its gang's constraint and slices,
    and its rank (records and the verbs' view of a pod read it alike)."""

    topology: TopologyConstraint | None = None
    slicing: Slicing | None = None
    rank: int | None = None


def pod_shape(meta: Mapping[str, Any]) -> PodShape:
    """The pod's Kueue/Volcano topology annotations, slices and rank (TopologyError if bad)."""
    annotations = meta.get("annotations")
    slicing = slicing_from_annotations(annotations, "pod")
    return PodShape(
        constraint_from_annotations(annotations, "pod"),
        slicing,
        # Read even without slices on the pod: its PodGroup may declare them.
        rank_of(meta.get("labels"), annotations),
    )
