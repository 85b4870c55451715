"""An admitted gang's sub-groups: the domain each was given, and the words that say so. Pure.

What a claim keeps of a gang made of groups (app/runtime/claims.py), so that a
member is held to its own sub-group's domain, and what the Event and
/debug/gangs say about where each sub-group went.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from app.core.topology.domains import Domain, TopologyConstraint
from app.core.topology.subgroups import GangTree, Path


class HeldGroup(NamedTuple):
    """An admitted gang's sub-group: its domain, what asks for it, its members planned there."""

    domain: Domain
    constraint: TopologyConstraint
    members: tuple[str, ...] = ()
    min_member: int = 0

    def to_json(self, path: Path) -> dict[str, object]:
        """For /debug/gangs."""
        return {
            "path": "/".join(path),
            "domain": self.domain.to_json(),
            "constraint": self.constraint.describe(),
            "minMember": self.min_member,
            "members": list(self.members),
        }


def held_groups(
    tree: GangTree, domains: Mapping[Path, Domain], plan: Iterable[str]
) -> dict[Path, HeldGroup]:
    """Each constrained sub-group's HeldGroup, from the domains given and the members planned."""
    planned = sorted(plan)
    held: dict[Path, HeldGroup] = {}
    for path, domain in domains.items():
        group = tree.group(path)
        if group is None or group.constraint is None:
            continue
        members = tuple(k for k in planned if tree.paths.get(k, ())[: len(path)] == path)
        held[path] = HeldGroup(domain, group.constraint, members, group.min_member)
    return held


def groups_message(key: str, groups: Mapping[Path, HeldGroup], limit: int = 8) -> str:
    """Where each sub-group of an admitted gang went (Event, log), at most `limit` named."""
    ordered = sorted(groups.items(), key=lambda item: (len(item[0]), item[0]))
    parts = [f"{path[-1]} in {held.domain.describe()}" for path, held in ordered[:limit]]
    more = f" and {len(ordered) - limit} more" if len(ordered) > limit else ""
    origins = sorted({held.constraint.describe() for held in groups.values()})
    return (
        f"gang {key} places its sub-groups each whole in one domain: {', '.join(parts)}{more} "
        f"({'; '.join(origins)})"
    )
