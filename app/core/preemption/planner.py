"""Where a preempting gang's members go and whom they evict: fewest evictions for the whole gang.

kube-scheduler preempts for one pod at a time and knows nothing of gangs:
asked by each member in turn, it would evict on whichever node suits that
member, and a gang of three could empty three nodes and land on two. This
module plans once for all the members a gang still needs: which node each
goes to, and the victims on each node, so that the total is the smallest
number of evictions. Ties go to the plan whose victims have the lowest
priorities, then the one disturbing the fewest gangs, then the one using the
fewest nodes.

The search: for each node, the cheapest victims that make room for each
mix of members it could hold (app/core/preemption/cheapest_victims.py); then a knapsack
over nodes, on the count of members of each shape placed. Eviction budgets
span nodes (app/core/preemption/eviction_budgets.py): a plan that overspends one is
searched again with that budget confined, then closed. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.core.packing import Bin, Demand, index_of
from app.core.placement import Placement
from app.core.preemption.cheapest_victims import (
    FREE,
    ClassKey,
    Cost,
    Evictable,
    cheapest_counts,
    classes_of,
)
from app.core.preemption.eviction_budgets import Budgets
from app.core.resources import Resources, add, shortfall
from app.core.topology.domains import Domain

# Nodes the knapsack weighs (the cheapest for one member): any `need` nodes
# that each hold one member make a plan, so this never loses feasibility.
MAX_PLAN_NODES = 64
# Member mixes per node beyond which differently sized members are planned as
# the largest of them (more room asked than needed, never less).
MAX_MIXES = 256


@dataclass(frozen=True, slots=True)
class PlannedNode:
    node: str
    # Demand keys placed on this node.
    members: tuple[str, ...]
    victims: tuple[Evictable, ...]


@dataclass(frozen=True, slots=True)
class PlanResult:
    nodes: tuple[PlannedNode, ...]
    cost: Cost
    # A gang made of groups (app/core/preemption/tree_plan.py): each constrained
    # sub-group's domain, by its path.
    groups: Mapping[tuple[str, ...], Domain] = field(default_factory=dict)

    @property
    def victims(self) -> list[Evictable]:
        return [v for planned in self.nodes for v in planned.victims]


@dataclass(frozen=True, slots=True)
class Shape:
    requests: Resources
    placement: Placement | None
    keys: tuple[str, ...]


_Option = tuple[tuple[int, ...], Cost, tuple[int, ...]]


@dataclass
class _Search:
    """One pass of the search; nodes alike in room and victims are costed once."""

    shapes: list[Shape]
    bins: dict[str, Bin]
    evictable: Mapping[str, Sequence[Evictable]]
    budgets: Budgets
    # node -> its units grouped into classes, in class-key order.
    _classes: dict[str, tuple[list[ClassKey], list[list[Evictable]]]] = field(default_factory=dict)
    # (room, classes, allowed shapes) -> every mix that fits, with its cost and class counts.
    _memo: dict[tuple[object, ...], list[_Option]] = field(default_factory=dict)

    def options(self, name: str) -> list[_Option]:
        """The member mixes node `name` can take, cheapest victims each (class counts)."""
        node = self.bins[name]
        allowed = tuple(
            s.placement is None or s.placement.allows(name, node.labels, node.taints)
            for s in self.shapes
        )
        if not any(allowed):
            return []
        keys, groups = self.classes(name)
        signature = (
            tuple(sorted(node.free.items())),
            tuple(keys),
            tuple(len(g) for g in groups),
            allowed,
        )
        found = self._memo.get(signature)
        if found is None:
            found = self._memo[signature] = self._options(node.free, keys, groups, allowed)
        return found

    def _options(
        self,
        free: Resources,
        keys: Sequence[ClassKey],
        groups: Sequence[Sequence[Evictable]],
        allowed: Sequence[bool],
    ) -> list[_Option]:
        found: list[_Option] = []
        infeasible: list[tuple[int, ...]] = []
        counts = [len(g) for g in groups]
        for mix in sorted(_mixes(self.shapes, allowed), key=sum):
            if any(all(a >= b for a, b in zip(mix, bad, strict=True)) for bad in infeasible):
                continue  # more members than a mix that already does not fit
            need: Resources = {}
            for shape, count in zip(self.shapes, mix, strict=True):
                for _ in range(count):
                    add(need, shape.requests)
            deficit = shortfall(need, free)
            if not deficit:
                found.append((mix, FREE, tuple(0 for _ in keys)))
                continue
            got = cheapest_counts(deficit, keys, counts, self.budgets.limits)
            if got is None:
                infeasible.append(mix)
                continue
            cost, chosen = got
            found.append(
                (
                    mix,
                    Cost(
                        cost.evictions,
                        cost.top_priority,
                        cost.priority_sum,
                        cost.gangs,
                        1,
                        sum(mix),
                    ),
                    chosen,
                )
            )
        return found

    def classes(self, name: str) -> tuple[list[ClassKey], list[list[Evictable]]]:
        cached = self._classes.get(name)
        if cached is None:
            units = self.evictable.get(name, ())
            cached = self._classes[name] = classes_of(
                u for u in units if self.budgets.may_spend(u.budget, name)
            )
        return cached

    def victims(self, name: str, counts: Sequence[int]) -> tuple[Evictable, ...]:
        _, groups = self.classes(name)
        return tuple(u for group, n in zip(groups, counts, strict=True) for u in group[:n])


def plan(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    evictable: Mapping[str, Sequence[Evictable]],
    budgets: Mapping[str, int] | None = None,
) -> PlanResult | None:
    """The cheapest way to place every one of `demands` at once, or None when there is none.

    bins: each schedulable node's free room (pods leaving counted free, room
    promised to others taken out). evictable: per node, what may go (pods of
    lower priority than the preemptor, never its own gang's).
    """
    if not demands:
        return PlanResult((), FREE)
    shapes = _shapes(demands)
    if math.prod(len(s.keys) + 1 for s in shapes) > MAX_MIXES:
        shapes = [_as_largest(demands)]
    caps = Budgets(dict(budgets or {}))
    by_name = index_of(bins)
    for _ in range(3):
        result = _knapsack(_Search(shapes, by_name, evictable, caps))
        if result is None:
            return None
        over = caps.overspent(
            (v.budget, planned.node)
            for planned in result.nodes
            for v in planned.victims
            if v.budget is not None
        )
        if not over:
            return result
        caps.confine(over)
    return None


def _shapes(demands: Sequence[Demand]) -> list[Shape]:
    grouped: dict[tuple[tuple[tuple[str, int], ...], Placement | None], list[str]] = {}
    requests: dict[tuple[tuple[tuple[str, int], ...], Placement | None], Resources] = {}
    for demand in demands:
        key = (tuple(sorted(demand.requests.items())), demand.placement)
        grouped.setdefault(key, []).append(demand.key)
        requests[key] = demand.requests
    return [Shape(requests[k], k[1], tuple(keys)) for k, keys in grouped.items()]


def _as_largest(demands: Sequence[Demand]) -> Shape:
    """Every member as big as the largest in each resource, allowed where all of them are."""
    largest: Resources = {}
    for demand in demands:
        for name, amount in demand.requests.items():
            largest[name] = max(largest.get(name, 0), amount)
    placements = {d.placement for d in demands}
    placement = placements.pop() if len(placements) == 1 else _strictest(demands)
    return Shape(largest, placement, tuple(d.key for d in demands))


def _strictest(demands: Sequence[Demand]) -> Placement | None:
    restricted = [d.placement for d in demands if d.placement is not None]
    return restricted[0] if restricted else None


def _mixes(shapes: Sequence[Shape], allowed: Sequence[bool]) -> list[tuple[int, ...]]:
    ranges = [
        range(len(s.keys) + 1) if ok else range(1) for s, ok in zip(shapes, allowed, strict=True)
    ]
    return [m for m in itertools.product(*ranges) if any(m)]


def _knapsack(search: _Search) -> PlanResult | None:
    shapes = search.shapes
    target = tuple(len(s.keys) for s in shapes)
    options: dict[str, list[_Option]] = {}
    single: list[tuple[Cost, str]] = []
    for name in search.bins:
        found = search.options(name)
        if found:
            options[name] = found
            single.append((min(cost for _, cost, _ in found), name))
    single.sort()
    keep = max(MAX_PLAN_NODES, 4 * sum(target))
    nodes = [name for _, name in single[:keep]]

    zero = tuple(0 for _ in shapes)
    states: dict[
        tuple[int, ...], tuple[Cost, tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]]
    ] = {zero: (FREE, ())}
    for name in nodes:
        grown = dict(states)
        for have, (cost, picks) in states.items():
            for mix, extra, chosen in options[name]:
                total = tuple(a + b for a, b in zip(have, mix, strict=True))
                if any(t > limit for t, limit in zip(total, target, strict=True)):
                    continue
                new_cost = cost + extra
                best = grown.get(total)
                if best is None or new_cost < best[0]:
                    grown[total] = (new_cost, (*picks, (name, mix, chosen)))
        states = grown
    done = states.get(target)
    if done is None:
        return None
    cost, picks = done
    return PlanResult(
        _assign(shapes, [(name, mix, search.victims(name, chosen)) for name, mix, chosen in picks]),
        cost,
    )


def _assign(
    shapes: Sequence[Shape],
    picks: Iterable[tuple[str, tuple[int, ...], tuple[Evictable, ...]]],
) -> tuple[PlannedNode, ...]:
    """Name the members each node gets: nodes with victims first, the earlier demands first."""
    ordered = sorted(picks, key=lambda p: (not p[2], p[0]))
    taken = [0 for _ in shapes]
    planned: list[PlannedNode] = []
    for name, mix, victims in ordered:
        members: list[str] = []
        for i, count in enumerate(mix):
            members += shapes[i].keys[taken[i] : taken[i] + count]
            taken[i] += count
        planned.append(PlannedNode(name, tuple(members), victims))
    return tuple(planned)


Planner = Callable[
    [
        Sequence[Demand],
        Sequence[Bin],
        Mapping[str, Sequence[Evictable]],
        Mapping[str, int] | None,
    ],
    "PlanResult | None",
]
"""plan(), or a planner with the same inputs (a gang made of groups: tree_plan.plan_tree)."""


def plan_in_domains(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    evictable: Mapping[str, Sequence[Evictable]],
    budgets: Mapping[str, int] | None,
    domains: Sequence[tuple[str, Iterable[str]]],
    within: Planner = plan,
) -> tuple[str, PlanResult] | None:
    """The cheapest plan confined to the nodes of one domain, and that domain's name.

    domains: (name, its nodes), in the order ties are broken. A topology-aware
    gang preempts inside one rack (block, zone): each domain is planned on its
    own (by `within`: a gang made of groups plans its sub-groups' domains
    inside it), and the one whose victims cost least wins.
    """
    best: tuple[str, PlanResult] | None = None
    for name, nodes in domains:
        inside = set(nodes)
        confined = [b for b in bins if b.name in inside]
        if not confined:
            continue
        result = within(
            demands,
            confined,
            {node: units for node, units in evictable.items() if node in inside},
            budgets,
        )
        if result is not None and (best is None or result.cost < best[1].cost):
            best = (name, result)
    return best
