"""Kubernetes' CompositePodGroup (scheduling.k8s.io/v1alpha3, 1.37 alpha) read as a gang tree. Pure.

KEP-6012: a tree of CompositePodGroups (gate `CompositePodGroup`) whose leaves
are v1beta1 PodGroups; each node names its parent with
`spec.parentCompositePodGroupName` (nil: the root). A pod points at its leaf
PodGroup only (`spec.schedulingGroup.podGroupName`). As kube-scheduler's
GangScheduling plugin reads it:

- a PodGroup is admissible when its pods reach `schedulingPolicy.gang.minCount`
  (the `basic` policy: any number, 0 needed);
- a CompositePodGroup is admissible when `schedulingPolicy.gang.minGroupCount`
  of its children are (`basic`: every child counts, none is needed);
- `schedulingConstraints.topology[0].key` (at most one) on any node: all of its
  pods in one domain of that node label, applied top-down (a child's domain
  inside its parent's);
- depth at most 4; a cycle, a deeper tree or a missing parent is invalid.

Here the whole tree is one gang keyed by its root (`composite:<ns>/<root>`), so two
leaves of one tree never form separate gangs. Its minimum is the pods the
cheapest admissible selection needs: a leaf's minCount; a composite's
smallest `minGroupCount` children's minimums summed. Where the plugin leaves
a choice (which children must be whole), the first `minGroupCount` children
by name are held to their minimum, as Volcano's minSubGroups is read
(app/core/topology/subgroups.py); the others may start with fewer.

This module reads the objects and builds the tree (GangTree);
app/core/composite_trees.py keeps every namespace's trees as the watches
deliver them and turns each root into a gang.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.api_ints import INT32_MAX, is_int32
from app.core.groups import SOURCE_NATIVE, GroupSpec
from app.core.topology.domains import TopologyConstraint, TopologyError
from app.core.topology.sources import constraint_from_native
from app.core.topology.subgroups import GangTree, Path, SubGroup

COMPOSITE_GROUP = "scheduling.k8s.io"
COMPOSITE_VERSION = "v1alpha3"
COMPOSITE_PLURAL = "compositepodgroups"
COMPOSITE_KIND = "CompositePodGroup"
COMPOSITE_API_VERSION = f"{COMPOSITE_GROUP}/{COMPOSITE_VERSION}"
# KEP-6012: the tree is at most four levels deep (the root included).
MAX_DEPTH = 4


class CompositeError(ValueError):
    """A CompositePodGroup tree that cannot be used; the message names the object and field."""


@dataclass(frozen=True, slots=True)
class GroupNode:
    """One CompositePodGroup or leaf PodGroup of a tree."""

    name: str
    # spec.parentCompositePodGroupName ("" for the root).
    parent: str
    leaf: bool
    # minCount (leaf) or minGroupCount (composite); None: the basic policy.
    minimum: int | None
    constraint: TopologyConstraint | None


def node_from(raw: Mapping[str, Any], leaf: bool) -> GroupNode:
    """A CompositePodGroup (leaf False) or PodGroup (leaf True) object as a tree node."""
    meta = raw.get("metadata") or {}
    name = str(meta.get("name") or "")
    kind = "PodGroup" if leaf else COMPOSITE_KIND
    spec = raw.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise CompositeError(f"{kind} {name}: spec must be an object")
    parent = spec.get("parentCompositePodGroupName") or ""
    if not isinstance(parent, str):
        raise CompositeError(f"{kind} {name}: spec.parentCompositePodGroupName must be a name")
    policy = spec.get("schedulingPolicy") or {}
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    minimum: int | None = None
    if isinstance(gang, Mapping):
        field = "minCount" if leaf else "minGroupCount"
        value = gang.get(field)
        if not is_int32(value, 1):
            raise CompositeError(
                f"{kind} {name}: spec.schedulingPolicy.gang.{field} must be an integer "
                f"between 1 and {INT32_MAX}, got {value!r:.40}"
            )
        minimum = value
    try:
        constraint = constraint_from_native(spec)
    except TopologyError as err:
        raise CompositeError(f"{kind} {name}: {err}") from None
    if constraint is not None:
        constraint = TopologyConstraint(
            constraint.key, True, origin=f"{kind} {name} spec.schedulingConstraints.topology"
        )
    return GroupNode(name, parent, leaf, minimum, constraint)


def root_of(leaf: str, composites: Mapping[str, GroupNode], parent: str) -> list[str]:
    """The chain of CompositePodGroups above `leaf` (whose parent is `parent`), root first.

    CompositeError for a missing parent, a cycle or a tree deeper than MAX_DEPTH.
    """
    chain: list[str] = []
    name = parent
    while name:
        if name in chain:
            raise CompositeError(
                f"CompositePodGroup {name} is its own ancestor ({' -> '.join([*chain, name])}): "
                "a cycle; kube-scheduler marks such a tree Invalid"
            )
        node = composites.get(name)
        if node is None:
            below = chain[-1] if chain else f"PodGroup {leaf}"
            raise CompositeError(
                f"CompositePodGroup {name} not found (the parent of {below}): create it "
                f"(apiVersion {COMPOSITE_GROUP}/{COMPOSITE_VERSION}) or fix "
                "spec.parentCompositePodGroupName"
            )
        chain.append(name)
        if len(chain) + 1 > MAX_DEPTH:
            raise CompositeError(
                f"the tree above PodGroup {leaf} is deeper than {MAX_DEPTH} levels "
                f"({' -> '.join(reversed(chain))} -> {leaf}), the most KEP-6012 allows"
            )
        name = node.parent
    return list(reversed(chain))


@dataclass(frozen=True, slots=True)
class CompositeGang:
    """A CompositePodGroup tree as one gang: its root, minimum, constraint and sub-groups."""

    root: str
    min_member: int
    constraint: TopologyConstraint | None
    tree: GangTree


def composite_gang(
    root: str,
    composites: Mapping[str, GroupNode],
    leaves: Iterable[GroupNode],
    members: Iterable[tuple[str, str, str]],
) -> CompositeGang:
    """The gang of the tree under `root`.

    members: (pod key, its leaf PodGroup, its node or ""). A leaf whose minCount
    is above its pods is not refused here: the gang waits for them, as any gang.
    """
    nodes: dict[str, GroupNode] = {n.name: n for n in composites.values()}
    for leaf in leaves:
        nodes[leaf.name] = leaf
    if root not in nodes or nodes[root].leaf:
        raise CompositeError(f"CompositePodGroup {root} not found")
    children = _children_of(nodes.values())
    paths: dict[str, Path] = {}
    groups: list[SubGroup] = []

    def need(name: str, path: Path, depth: int) -> int:
        node = nodes[name]
        if depth > MAX_DEPTH:
            raise CompositeError(
                f"the tree under CompositePodGroup {root} is deeper than {MAX_DEPTH}"
            )
        if node.leaf:
            own = node.minimum or 0
            if path:
                paths[name] = path
            return own
        kids = sorted(children.get(name, ()))
        minimums = [need(kid, (*path, kid), depth + 1) for kid in kids]
        count = len(kids) if node.minimum is None else node.minimum
        if node.minimum is not None and node.minimum > len(kids):
            raise CompositeError(
                f"CompositePodGroup {name}: spec.schedulingPolicy.gang.minGroupCount "
                f"{node.minimum} is above its {len(kids)} child group(s): it can never start; "
                "create the missing groups or lower minGroupCount"
            )
        required = kids[:count] if node.minimum is not None else []
        for kid, minimum in zip(kids, minimums, strict=True):
            kid_node = nodes[kid]
            groups.append(
                SubGroup(
                    (*path, kid),
                    minimum if kid in required else 0,
                    kid_node.constraint,
                    "group",
                )
            )
        return sum(sorted(minimums)[:count]) if node.minimum is not None else 0

    min_member = need(root, (), 1)
    ordered = tuple(sorted(groups, key=lambda g: (len(g.path), g.path)))
    return CompositeGang(
        root, max(min_member, 1), nodes[root].constraint, _tree(ordered, paths, members)
    )


def _children_of(nodes: Iterable[GroupNode]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for node in nodes:
        if node.parent:
            children.setdefault(node.parent, []).append(node.name)
    return children


def _tree(
    groups: tuple[SubGroup, ...], paths: Mapping[str, Path], members: Iterable[tuple[str, str, str]]
) -> GangTree:
    """The tree with each member's path (its leaf's) and the placed members' nodes."""
    member_paths: dict[str, Path] = {}
    placed: list[tuple[Path, str]] = []
    for key, leaf_name, node_name in members:
        path = paths.get(leaf_name)
        if path is None:
            continue
        member_paths[key] = path
        if node_name:
            placed.append((path, node_name))
    return GangTree(groups, member_paths, tuple(placed))


def composite_spec(key: str, gang: CompositeGang) -> GroupSpec:
    """The tree's gang as every source's GroupSpec: its nodes as named sub-groups (as KAI's,
    a member's leaf is its `task`), each leaf the root holds to its minCount a role."""
    groups = gang.tree.groups
    required = {g.path: g.min_member for g in groups}
    inner = {g.path[:-1] for g in groups}
    roles = sorted(
        (g.path[-1], g.min_member)
        for g in groups
        if g.path not in inner
        and g.min_member > 0
        and all(required.get(g.path[:depth], 1) > 0 for depth in range(1, len(g.path)))
    )
    return GroupSpec(
        key=key,
        min_member=gang.min_member,
        source=SOURCE_NATIVE,
        topology=gang.constraint,
        sub_groups=groups,
        min_task_member=tuple(roles),
    )
