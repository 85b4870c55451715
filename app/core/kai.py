"""KAI scheduler's PodGroup (`scheduling.run.ai/v2alpha2`) read into the gang tree. Pure.

Fields as KAI's `pkg/apis/scheduling/v2alpha2/podgroup_types.go` has them:
`minMember`, `queue`, `priorityClassName`, `topologyConstraint`
(`topology`, `requiredTopologyLevel`, `preferredTopologyLevel`: the levels
are node label keys) and `subGroups` (`name`, `minMember`, `parent`,
`topologyConstraint`). Read as KAI's own scheduler reads them:

- the sub-groups form a tree through `parent`; only the **leaves** carry a
  minimum (`max(minMember, 1)`), a sub-group with children needs all of
  them, and once `subGroups` exist the PodGroup's own `minMember` is not
  used (the gang needs every leaf's minimum);
- a topology constraint whose `topology` (the name of KAI's Topology
  object) is empty is ignored, as KAI ignores it; a required level wins over
  a preferred one on the same constraint;
- KAI's admission webhook refuses duplicate names, unknown parents and
  cycles: so does this reader (a PodGroup created before the webhook, or
  without it, is held with the field named).

A pod names its PodGroup with the annotation `pod-group-name` and its leaf
with the label `kai.scheduler/subgroup-name` (app/core/groups.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.topology.domains import TopologyConstraint, TopologyError
from app.core.topology.subgroup_sources import ListWords, int32_count, named_entries
from app.core.topology.subgroups import SubGroup

KAI_SUB_GROUP = "sub-group"
# The PodGroup's name (no domain prefix, as KAI's podgrouper writes it) and the sub-group.
KAI_GROUP_ANNOTATION = "pod-group-name"
KAI_SUBGROUP_LABEL = "kai.scheduler/subgroup-name"


class KaiPointerError(ValueError):
    """A pod's pointer to a KAI PodGroup cannot be used; the message says how to fix it."""


def kai_pointer(
    labels: Mapping[str, Any], annotations: Mapping[str, Any]
) -> tuple[str, str] | None:
    """(PodGroup name, sub-group) the pod names, None when it names no KAI PodGroup."""
    name = annotations.get(KAI_GROUP_ANNOTATION)
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise KaiPointerError(
            f"annotation {KAI_GROUP_ANNOTATION} is empty: set it to the name of a KAI "
            "PodGroup in the pod's namespace, or remove it"
        )
    sub_group = labels.get(KAI_SUBGROUP_LABEL)
    return name, sub_group if isinstance(sub_group, str) else ""


@dataclass(frozen=True, slots=True)
class KaiSpec:
    """What a KAI PodGroup asks for, before it becomes a GroupSpec (app/core/groups.py)."""

    min_member: int
    queue: str | None
    priority_class_name: str | None
    topology: TopologyConstraint | None
    # The sub-group tree, shortest paths first (empty: a flat gang).
    sub_groups: tuple[SubGroup, ...]
    # Each leaf's (name, minimum), sorted: the role minimums the gate enforces.
    leaves: tuple[tuple[str, int], ...]


def kai_spec(spec: Mapping[str, Any]) -> KaiSpec:
    """Read the spec; TopologyError naming the field when it cannot be used."""
    min_member = _count(spec.get("minMember"), "spec.minMember", 1)
    tree, leaves = _tree(spec)
    queue = spec.get("queue")
    priority = spec.get("priorityClassName")
    return KaiSpec(
        # KAI: once subGroups exist, the gang needs every leaf's minimum and minMember is unused.
        min_member=sum(n for _, n in leaves) if leaves else min_member,
        queue=queue if isinstance(queue, str) and queue else None,
        priority_class_name=priority if isinstance(priority, str) and priority else None,
        topology=constraint_from_kai(spec.get("topologyConstraint"), "spec.topologyConstraint"),
        sub_groups=tree,
        leaves=leaves,
    )


def constraint_from_kai(raw: Any, where: str) -> TopologyConstraint | None:
    """A KAI topologyConstraint: required level, else preferred; None without a `topology`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TopologyError(f"{where} must be an object (topology, requiredTopologyLevel)")
    if not raw.get("topology"):
        return None  # KAI ignores a constraint that names no Topology object
    for field, required in (("requiredTopologyLevel", True), ("preferredTopologyLevel", False)):
        level = raw.get(field)
        if level is None or level == "":
            continue
        if not isinstance(level, str):
            raise TopologyError(f"{where}.{field} must be a node label key, got {level!r:.40}")
        return TopologyConstraint(level, required, origin=f"PodGroup {where}.{field}")
    return None


def _count(value: Any, where: str, default: int) -> int:
    """An int32 count; 0 or absent reads as `default` (KAI: max(minMember, 1))."""
    return default if value is None else max(int32_count(value, where, 0), default)


def _tree(spec: Mapping[str, Any]) -> tuple[tuple[SubGroup, ...], tuple[tuple[str, int], ...]]:
    """spec.subGroups as tree nodes (path from the top) and its leaves' minimums (both
    empty without sub-groups)."""
    words = ListWords(
        "spec.subGroups must be a list of sub-groups",
        "{where} must be an object (name, minMember, parent)",
        "{where}.name must name the sub-group (its pods' label value)",
    )
    entries: dict[str, tuple[str | None, int, TopologyConstraint | None]] = {}
    for where, name, entry in named_entries(spec, "subGroups", words):
        parent = entry.get("parent")
        if parent is not None and (not isinstance(parent, str) or not parent):
            raise TopologyError(f"{where}.parent must name another sub-group, got {parent!r:.40}")
        entries[name] = (
            parent,
            _count(entry.get("minMember"), f"{where}.minMember", 1),
            constraint_from_kai(entry.get("topologyConstraint"), f"{where}.topologyConstraint"),
        )
    paths = {name: _path(name, entries) for name in entries}
    parents = {parent for parent, _, _ in entries.values() if parent is not None}
    nodes = tuple(
        sorted(
            (
                SubGroup(
                    paths[name],
                    0 if name in parents else minimum,
                    constraint,
                    KAI_SUB_GROUP,
                )
                for name, (_, minimum, constraint) in entries.items()
            ),
            key=lambda g: (len(g.path), g.path),
        )
    )
    leaves = tuple(sorted((n, m) for n, (_, m, _) in entries.items() if n not in parents))
    return nodes, leaves


def _path(name: str, entries: Mapping[str, tuple[str | None, int, Any]]) -> tuple[str, ...]:
    """The names from the top sub-group down to `name` (TopologyError: unknown parent, cycle)."""
    path = [name]
    parent = entries[name][0]
    while parent is not None:
        if parent not in entries:
            raise TopologyError(
                f"sub-group {path[-1]} names parent {parent}, which spec.subGroups does not declare"
            )
        if parent in path:
            cycle = " -> ".join([*reversed(path), parent])
            raise TopologyError(f"spec.subGroups parents form a cycle: {cycle}")
        path.append(parent)
        parent = entries[parent][0]
    return tuple(reversed(path))
