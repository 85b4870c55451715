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
mix of members it could hold (exhaustive over small victim sets, greedy past
a work bound); then a knapsack over nodes, on the count of members of each
shape placed. Eviction budgets (a running gang under the protect policy may
lose only the members above its minMember; a PodDisruptionBudget-style cap)
span nodes: a plan that overspends one is searched again with that budget
confined to one node, then with it closed. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from app.core.packing import Bin, Demand, Placement
from app.core.resources import Resources, add, shortfall

# Victim subsets tried exhaustively per node and member mix before the greedy pick.
EXHAUSTIVE_COMBINATIONS = 2_000
# Nodes the knapsack weighs (the cheapest for one member): any `need` nodes
# that each hold one member make a plan, so this never loses feasibility.
MAX_PLAN_NODES = 64
# Member mixes per node beyond which differently sized members are planned as
# the largest of them (more room asked than needed, never less).
MAX_MIXES = 256


class Evictable(NamedTuple):
    """What may be evicted on one node, as one unit.

    A plain pod is a unit of one. Under the whole-gang victim policy a running
    gang's members on this node are one unit, and `evictions` counts every
    placed member of that gang (the others, on other nodes, go with it).
    """

    uids: tuple[str, ...]
    keys: tuple[str, ...]
    node: str
    requests: Resources
    priority: int
    gang: str | None = None
    # Key into the budgets: at most budgets[budget] units with it may go.
    budget: str | None = None
    evictions: int = 1


@dataclass(frozen=True, slots=True, order=True)
class Cost:
    """Compared field by field: fewest evictions first."""

    evictions: int = 0
    top_priority: int = -(2**31)
    priority_sum: int = 0
    gangs: int = 0
    # Nodes with victims, then members placed on them: free room first.
    nodes: int = 0
    members: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.evictions + other.evictions,
            max(self.top_priority, other.top_priority),
            self.priority_sum + other.priority_sum,
            self.gangs + other.gangs,
            self.nodes + other.nodes,
            self.members + other.members,
        )


FREE = Cost()


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

    @property
    def victims(self) -> list[Evictable]:
        return [v for planned in self.nodes for v in planned.victims]


@dataclass(frozen=True, slots=True)
class Shape:
    requests: Resources
    placement: Placement | None
    keys: tuple[str, ...]


_ClassKey = tuple[tuple[tuple[str, int], ...], int, str | None, str | None, int]
_Option = tuple[tuple[int, ...], Cost, tuple[int, ...]]


def _class_key(unit: Evictable) -> _ClassKey:
    return (
        tuple(sorted(unit.requests.items())),
        unit.priority,
        unit.gang,
        unit.budget,
        unit.evictions,
    )


@dataclass
class _Search:
    """One pass of the search; nodes alike in room and victims are costed once."""

    shapes: list[Shape]
    bins: dict[str, Bin]
    evictable: Mapping[str, Sequence[Evictable]]
    budgets: Mapping[str, int]
    # budget -> the one node it may be spent on (after a first plan overspent it).
    confined: dict[str, str | None] = field(default_factory=dict)
    # node -> its units grouped into classes, in class-key order.
    _classes: dict[str, tuple[list[_ClassKey], list[list[Evictable]]]] = field(default_factory=dict)
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
        keys: Sequence[_ClassKey],
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
            got = _cheapest_counts(deficit, keys, counts, self.budgets)
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

    def classes(self, name: str) -> tuple[list[_ClassKey], list[list[Evictable]]]:
        cached = self._classes.get(name)
        if cached is None:
            by_key: dict[_ClassKey, list[Evictable]] = {}
            for unit in self.evictable.get(name, ()):
                if self._may_spend(unit, name):
                    by_key.setdefault(_class_key(unit), []).append(unit)
            keys = sorted(by_key, key=repr)
            cached = self._classes[name] = (keys, [by_key[k] for k in keys])
        return cached

    def victims(self, name: str, counts: Sequence[int]) -> tuple[Evictable, ...]:
        _, groups = self.classes(name)
        return tuple(u for group, n in zip(groups, counts, strict=True) for u in group[:n])

    def _may_spend(self, unit: Evictable, node: str) -> bool:
        if unit.budget is None:
            return True
        if self.budgets.get(unit.budget, 0) <= 0:
            return False
        only = self.confined.get(unit.budget, node)
        return only == node


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
    search = _Search(shapes, {b.name: b for b in bins}, evictable, dict(budgets or {}))
    for _ in range(3):
        result = _knapsack(search)
        if result is None:
            return None
        over = _overspent(result, search.budgets)
        if not over:
            return result
        for budget, node in over.items():
            # Confine a budget to the node that spent the most of it; closed if already confined.
            search.confined[budget] = None if budget in search.confined else node
        search = _Search(
            search.shapes, search.bins, search.evictable, search.budgets, search.confined
        )
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


def _overspent(result: PlanResult, budgets: Mapping[str, int]) -> dict[str, str]:
    """Budgets the plan spends beyond their limit -> the node that spent most of each."""
    spent: dict[str, dict[str, int]] = {}
    for planned in result.nodes:
        for victim in planned.victims:
            if victim.budget is not None:
                by_node = spent.setdefault(victim.budget, {})
                by_node[planned.node] = by_node.get(planned.node, 0) + 1
    return {
        budget: max(by_node, key=lambda n: (by_node[n], n))
        for budget, by_node in spent.items()
        if sum(by_node.values()) > budgets.get(budget, 0)
    }


# ---- one node: the fewest victims that cover a deficit -------------------------------


def cheapest_victims(
    deficit: Mapping[str, int],
    units: Sequence[Evictable],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[Evictable, ...]] | None:
    """The cheapest set of `units` whose requests cover `deficit`, None when all of them do not."""
    by_key: dict[_ClassKey, list[Evictable]] = {}
    for unit in units:
        by_key.setdefault(_class_key(unit), []).append(unit)
    keys = sorted(by_key, key=repr)
    got = _cheapest_counts(deficit, keys, [len(by_key[k]) for k in keys], budgets)
    if got is None:
        return None
    cost, counts = got
    return cost, tuple(u for k, n in zip(keys, counts, strict=True) for u in by_key[k][:n])


def _cheapest_counts(
    deficit: Mapping[str, int],
    keys: Sequence[_ClassKey],
    counts: Sequence[int],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[int, ...]] | None:
    """How many of each class of units to evict, at the least cost, to cover `deficit`.

    Units alike in requests, priority, gang and budget are interchangeable, so
    the search is over counts per class: exhaustive by total size while the
    number of count vectors stays within EXHAUSTIVE_COMBINATIONS (a node's
    pods fall into few classes: the usual case), greedy past it.
    """
    requests = [dict(k[0]) for k in keys]
    useful = [any(r.get(name, 0) > 0 for name in deficit) for r in requests]
    limits = [n if ok else 0 for n, ok in zip(counts, useful, strict=True)]
    freed: Resources = {}
    for r, n in zip(requests, limits, strict=True):
        for name, amount in r.items():
            freed[name] = freed.get(name, 0) + amount * n
    if shortfall(deficit, freed):
        return None
    # Per resource, the largest amounts first: k units free at most the first k.
    tops = {
        name: list(
            itertools.accumulate(
                sorted(
                    (
                        r.get(name, 0)
                        for r, n in zip(requests, limits, strict=True)
                        for _ in range(n)
                    ),
                    reverse=True,
                )
            )
        )
        for name in deficit
    }
    smallest = list(
        itertools.accumulate(
            sorted(k[4] for k, n in zip(keys, limits, strict=True) for _ in range(n))
        )
    )
    best: tuple[Cost, tuple[int, ...]] | None = None
    tried = 0
    for size in range(1, sum(limits) + 1):
        if best is not None and smallest[size - 1] > best[0].evictions:
            break
        if any(tops[name][size - 1] < amount for name, amount in deficit.items()):
            continue
        for vector in _vectors(limits, size):
            tried += 1
            if tried > EXHAUSTIVE_COMBINATIONS:
                greedy = _greedy(deficit, keys, requests, limits, budgets)
                if greedy is not None and (best is None or greedy[0] < best[0]):
                    best = greedy
                return best
            if not _vector_ok(deficit, keys, requests, vector, budgets):
                continue
            cost = _vector_cost(keys, vector)
            if best is None or cost < best[0]:
                best = (cost, vector)
    return best


def _vectors(limits: Sequence[int], size: int) -> Iterable[tuple[int, ...]]:
    """Every count vector within `limits` that sums to `size`."""
    if not limits:
        if size == 0:
            yield ()
        return
    rest = sum(limits[1:])
    for first in range(min(limits[0], size), max(0, size - rest) - 1, -1):
        for tail in _vectors(limits[1:], size - first):
            yield (first, *tail)


def _vector_ok(
    deficit: Mapping[str, int],
    keys: Sequence[_ClassKey],
    requests: Sequence[Mapping[str, int]],
    vector: Sequence[int],
    budgets: Mapping[str, int],
) -> bool:
    spent: dict[str, int] = {}
    for key, n in zip(keys, vector, strict=True):
        if n and key[3] is not None:
            spent[key[3]] = spent.get(key[3], 0) + n
            if spent[key[3]] > budgets.get(key[3], 0):
                return False
    for name, amount in deficit.items():
        if sum(r.get(name, 0) * n for r, n in zip(requests, vector, strict=True)) < amount:
            return False
    return True


def _vector_cost(keys: Sequence[_ClassKey], vector: Sequence[int]) -> Cost:
    chosen = [(k, n) for k, n in zip(keys, vector, strict=True) if n]
    return Cost(
        sum(k[4] * n for k, n in chosen),
        max((k[1] for k, _ in chosen), default=FREE.top_priority),
        sum(k[1] * k[4] * n for k, n in chosen),
        len({k[2] for k, _ in chosen if k[2] is not None}),
    )


def _greedy(
    deficit: Mapping[str, int],
    keys: Sequence[_ClassKey],
    requests: Sequence[Mapping[str, int]],
    limits: Sequence[int],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[int, ...]] | None:
    """Cheapest units first while some of the deficit is left, then put back what is not needed."""
    order = sorted(
        range(len(keys)),
        key=lambda i: (keys[i][4], keys[i][1], -_share(requests[i], deficit), repr(keys[i])),
    )
    vector = [0] * len(keys)
    spent: dict[str, int] = {}
    freed: Resources = {}
    for i in order:
        budget = keys[i][3]
        while vector[i] < limits[i] and shortfall(deficit, freed):
            if budget is not None and spent.get(budget, 0) >= budgets.get(budget, 0):
                break
            if not any(
                freed.get(n, 0) < amount and requests[i].get(n, 0) > 0
                for n, amount in deficit.items()
            ):
                break
            vector[i] += 1
            add(freed, requests[i])
            if budget is not None:
                spent[budget] = spent.get(budget, 0) + 1
    if shortfall(deficit, freed):
        return None
    for i in reversed(order):
        while vector[i] and _vector_ok(
            deficit, keys, requests, [n - (j == i) for j, n in enumerate(vector)], budgets
        ):
            vector[i] -= 1
    return _vector_cost(keys, vector), tuple(vector)


def _share(requests: Mapping[str, int], deficit: Mapping[str, int]) -> float:
    return max(
        (requests.get(n, 0) / amount for n, amount in deficit.items() if amount > 0), default=0.0
    )


def plan_in_domains(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    evictable: Mapping[str, Sequence[Evictable]],
    budgets: Mapping[str, int] | None,
    domains: Sequence[tuple[str, Iterable[str]]],
) -> tuple[str, PlanResult] | None:
    """The cheapest plan() confined to the nodes of one domain, and that domain's name.

    domains: (name, its nodes), in the order ties are broken. A topology-aware
    gang preempts inside one rack (block, zone): each domain is planned on its
    own, and the one whose victims cost least wins.
    """
    best: tuple[str, PlanResult] | None = None
    for name, nodes in domains:
        inside = set(nodes)
        confined = [b for b in bins if b.name in inside]
        if not confined:
            continue
        result = plan(
            demands,
            confined,
            {node: units for node, units in evictable.items() if node in inside},
            budgets,
        )
        if result is not None and (best is None or result.cost < best[1].cost):
            best = (name, result)
    return best
