"""Volcano HyperNodes as topology levels: which hypernode of each tier a node is in. Pure.

A cluster that runs Volcano's network-topology-aware scheduling describes its
network with cluster-scoped `topology.volcano.sh/v1alpha1` HyperNode objects:
`spec.tier` (1 is the lowest, e.g. a leaf switch), optional `spec.tierName`,
and `spec.members[]`, each `{type: Node|HyperNode, selector: {exactMatch:
{name}} | {regexMatch: {pattern}} | {labelMatch: <label selector, nodes
only>}}`. A hypernode's node set is the union of its member nodes and of the
node sets of its member hypernodes.

The rest of the topology code (app/core/topology/domains.py) thinks in node labels: a
level is a label, a domain is one of its values. Each HyperNode tier becomes
one level, `hypernode.topology.volcano.sh/tier-<N>`, whose value on a node is
the name of the tier-N hypernode holding it; app/core/state.py adds these labels
to its node records. A node that two hypernodes of one tier select (a
misconfigured tree) is given the first by name, and the index reports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.placement import Requirement, requirement_matches

API_GROUP = "topology.volcano.sh"
API_VERSION = "v1alpha1"
PLURAL = "hypernodes"

# The synthetic node label of tier N: not a label anyone sets on a node.
LEVEL_PREFIX = "hypernode.topology.volcano.sh/tier-"


class MemberType(StrEnum):
    NODE = "Node"
    HYPERNODE = "HyperNode"


class HyperNodeError(ValueError):
    """A HyperNode that cannot be used; the message says what to fix."""


def tier_level(tier: int) -> str:
    """The level (synthetic node label) of HyperNode tier `tier`."""
    return f"{LEVEL_PREFIX}{tier}"


def tier_of(level: str) -> int | None:
    """The HyperNode tier a level stands for; None for a real node label."""
    if not level.startswith(LEVEL_PREFIX):
        return None
    suffix = level[len(LEVEL_PREFIX) :]
    return int(suffix) if suffix.isdigit() else None


@dataclass(frozen=True, slots=True)
class Member:
    """One entry of spec.members: exactly one of the three selectors is set."""

    type: MemberType
    exact: str | None = None
    pattern: re.Pattern[str] | None = None
    match_labels: tuple[tuple[str, str], ...] | None = None
    # labelMatch.matchExpressions (In, NotIn, Exists, DoesNotExist), as node affinity reads them.
    expressions: tuple[Requirement, ...] = ()

    def selects(self, name: str, labels: Mapping[str, str] | None = None) -> bool:
        """Does it select the node (or, for type HyperNode, the hypernode) `name`?"""
        if self.exact is not None:
            return name == self.exact
        if self.pattern is not None:
            # Go's regexp MatchString: the pattern may match anywhere in the name.
            return self.pattern.search(name) is not None
        if self.match_labels is None or labels is None:
            return False
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            requirement_matches(e, name, labels) for e in self.expressions
        )


@dataclass(frozen=True, slots=True)
class HyperNode:
    name: str
    tier: int
    tier_name: str | None
    members: tuple[Member, ...]


def hypernode_from(raw: Mapping[str, Any]) -> HyperNode:
    """Read a HyperNode object; HyperNodeError names the field at fault."""
    name = (raw.get("metadata") or {}).get("name") or ""
    spec = raw.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise HyperNodeError(f"HyperNode {name}: spec must be an object")
    tier = spec.get("tier")
    if isinstance(tier, str) and tier.isdigit():  # the first API version had a string
        tier = int(tier)
    # Volcano's CRD allows 0; tier 1 is the usual lowest.
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 0:
        raise HyperNodeError(
            f"HyperNode {name}: spec.tier must be an integer >= 0, got {tier!r:.40}"
        )
    tier_name = spec.get("tierName")
    members = tuple(_member(name, i, m) for i, m in enumerate(spec.get("members") or ()))
    return HyperNode(
        name, tier, tier_name if isinstance(tier_name, str) and tier_name else None, members
    )


def _member(hypernode: str, index: int, raw: Any) -> Member:
    where = f"HyperNode {hypernode}: spec.members[{index}]"
    if not isinstance(raw, Mapping):
        raise HyperNodeError(f"{where} must be an object")
    try:
        kind = MemberType(raw.get("type") or MemberType.NODE)
    except ValueError:
        raise HyperNodeError(f"{where}.type must be Node or HyperNode") from None
    selector = raw.get("selector") or {}
    exact = (selector.get("exactMatch") or {}).get("name")
    pattern = (selector.get("regexMatch") or {}).get("pattern")
    label = selector.get("labelMatch")
    given = [s for s in (exact, pattern, label) if s]
    if len(given) != 1:
        raise HyperNodeError(
            f"{where}.selector must set exactly one of exactMatch.name, regexMatch.pattern, "
            "labelMatch"
        )
    if exact:
        return Member(kind, exact=str(exact))
    if pattern:
        try:
            return Member(kind, pattern=re.compile(str(pattern)))
        except re.error as err:
            raise HyperNodeError(f"{where}.selector.regexMatch.pattern: {err}") from None
    if kind is MemberType.HYPERNODE:
        raise HyperNodeError(f"{where}: labelMatch selects nodes only (type Node)")
    if not isinstance(label, Mapping):
        raise HyperNodeError(f"{where}.selector.labelMatch must be a label selector")
    match_labels = label.get("matchLabels") or {}
    expressions = []
    for e in label.get("matchExpressions") or ():
        op = e.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise HyperNodeError(f"{where}.selector.labelMatch: unknown operator {op!r:.20}")
        values = tuple(str(v) for v in e.get("values") or ())
        expressions.append(Requirement(str(e.get("key")), op, values))
    return Member(
        kind,
        match_labels=tuple(sorted((str(k), str(v)) for k, v in match_labels.items())),
        expressions=tuple(expressions),
    )


@dataclass
class HyperNodeIndex:
    """The hypernodes by name, with what answering "which hypernodes hold node X" needs.

    Built once per change of any HyperNode (rare); asked once per node change.
    """

    hypernodes: dict[str, HyperNode] = field(default_factory=dict)
    # Levels of the tiers that have hypernodes, lowest tier first.
    levels: tuple[str, ...] = ()
    # spec.tierName -> tier.
    tier_names: dict[str, int] = field(default_factory=dict)
    # hypernode -> the hypernodes that have it as a member.
    _parents: dict[str, list[str]] = field(default_factory=dict)
    # Node name -> hypernodes naming it with exactMatch (most members are).
    _by_exact: dict[str, list[str]] = field(default_factory=dict)
    # (hypernode, member) for the regex and label selectors of nodes.
    _scanned: list[tuple[str, Member]] = field(default_factory=list)
    # What is wrong with the tree (shown in the log): cycles, conflicting tier names.
    problems: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, hypernodes: Iterable[HyperNode]) -> HyperNodeIndex:
        index = cls(hypernodes={h.name: h for h in hypernodes})
        by_name = index.hypernodes
        index.levels = tuple(tier_level(t) for t in sorted({h.tier for h in by_name.values()}))
        for h in sorted(by_name.values(), key=lambda h: h.name):
            if h.tier_name is None:
                continue
            known = index.tier_names.setdefault(h.tier_name, h.tier)
            if known != h.tier:
                index.problems.append(
                    f"tierName {h.tier_name} is given to tiers {known} and {h.tier} "
                    f"(HyperNode {h.name}); tier {known} is used"
                )
        names = sorted(by_name)
        for h in by_name.values():
            for m in h.members:
                if m.type is MemberType.HYPERNODE:
                    for child in names:
                        if child != h.name and m.selects(child):
                            index._parents.setdefault(child, []).append(h.name)
                elif m.exact is not None:
                    index._by_exact.setdefault(m.exact, []).append(h.name)
                else:
                    index._scanned.append((h.name, m))
        return index

    def holding(self, node: str, labels: Mapping[str, str]) -> set[str]:
        """Every hypernode whose node set holds `node`, whatever the tier."""
        found = set(self._by_exact.get(node, ()))
        found.update(h for h, m in self._scanned if m.selects(node, labels))
        todo = list(found)
        while todo:  # up the tree; `found` stops cycles
            for parent in self._parents.get(todo.pop(), ()):
                if parent not in found:
                    found.add(parent)
                    todo.append(parent)
        return found

    def labels_for(self, node: str, labels: Mapping[str, str]) -> dict[str, str]:
        """The synthetic labels of `node`: tier level -> the hypernode of that tier holding it."""
        out: dict[str, str] = {}
        for name in sorted(self.holding(node, labels)):
            out.setdefault(tier_level(self.hypernodes[name].tier), name)
        return out

    def tier_named(self, name: str) -> int | None:
        return self.tier_names.get(name)

    def describe_tiers(self) -> str:
        """For messages: `tier 1 (leaf), tier 2` ..."""
        named = {t: n for n, t in self.tier_names.items()}
        tiers: Sequence[int] = [t for t in (tier_of(level) for level in self.levels) if t]
        return ", ".join(f"tier {t} ({named[t]})" if t in named else f"tier {t}" for t in tiers)
