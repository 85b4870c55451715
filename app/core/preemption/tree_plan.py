"""A preemption plan for a gang made of groups: each sub-group whole in one domain of its level.

A flat gang's plan (app/core/preemption/planner.py) puts its members on any
nodes (inside one domain of the gang's level, plan_in_domains). A gang of
slices must not: a slice of a rack planned over two racks evicts pods the
gang then cannot use, since the admission (app/core/topology/tree.py) only
admits each slice whole in one rack. So the plan is made the way the tree is
placed: every constrained sub-group inside one domain of its level, inside
its parent's, and victims only on the nodes of the domains chosen.

The search is the planner's own, one level up. At a level, the domains are
the "nodes" and the sub-groups the "members": for each domain, the cheapest
plan() of each mix of sub-groups it could hold (alike sub-groups, same
shapes and nesting, are one kind and costed once); then a knapsack over
domains on the count of sub-groups of each kind, for the fewest evictions
in total (then the planner's other criteria). A sub-group with sub-groups
of its own is costed by the same search inside the domain. Placed members
pin their sub-group's domain (a restarted member's slice goes back to its
rack). Members in no constrained sub-group (a role, ranks past the last
whole slice) are planned after, on the room the sub-groups left. Exact for
one layer of sub-groups of one level; nested layers are exact per domain.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.core.packing import Bin, Demand
from app.core.placement import Placement
from app.core.preemption.cheapest_victims import FREE, Cost, Evictable
from app.core.preemption.eviction_budgets import Budgets
from app.core.preemption.planner import MAX_MIXES, MAX_PLAN_NODES, PlannedNode, PlanResult, plan
from app.core.resources import Resources, add, shortfall, subtract
from app.core.topology.domains import Domain, TopologyConstraint, by_domain, common_domain
from app.core.topology.subgroups import GangTree, Path, SubGroup
from app.core.topology.tree import Resolve, by_key


def plan_tree(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    evictable: Mapping[str, Sequence[Evictable]],
    budgets: Mapping[str, int] | None,
    tree: GangTree,
    resolve: Resolve = by_key,
    labels_of: Callable[[str], Mapping[str, str]] | None = None,
) -> PlanResult | None:
    """The cheapest plan placing every one of `demands`, each sub-group whole in one domain
    (PlanResult.groups: the domain of each).

    demands: the members to place (keys as in tree.paths). bins and evictable
    as for plan(); labels_of: a placed member's node labels (its sub-group's pin).
    An eviction budget the sub-groups' plans overspend together is closed and
    the search made again (never more evicted than a budget allows).
    """
    if not demands:
        return PlanResult((), FREE)
    limits = dict(budgets or {})
    pool = {node: list(units) for node, units in evictable.items()}
    for _ in range(3):
        search = _TreeSearch(tree, demands, pool, limits, resolve, labels_of)
        found = search.solve(search.top_groups(), search.own(()), list(bins))
        if found is None:
            return None
        over = Budgets(limits).overspent(
            (v.budget, p.node) for p in found.nodes for v in p.victims if v.budget is not None
        )
        if not over:
            return PlanResult(found.nodes, found.cost, found.domains)
        pool = {node: [u for u in units if u.budget not in over] for node, units in pool.items()}
    return None


@dataclass(frozen=True, slots=True)
class _Solved:
    cost: Cost
    nodes: tuple[PlannedNode, ...]
    domains: Mapping[Path, Domain]


_Signature = tuple[object, ...]


class _TreeSearch:
    """One search over the tree; the members under each sub-group computed once."""

    def __init__(
        self,
        tree: GangTree,
        demands: Sequence[Demand],
        evictable: Mapping[str, Sequence[Evictable]],
        budgets: Mapping[str, int],
        resolve: Resolve,
        labels_of: Callable[[str], Mapping[str, str]] | None,
    ) -> None:
        self._tree = tree
        self._evictable = evictable
        self._budgets = budgets
        self._resolve = resolve
        self._labels_of = labels_of or (lambda _node: {})
        self._children = tree.children()
        # path -> the demands whose deepest sub-group is that path (() for the gang's own).
        self._own: dict[Path, list[Demand]] = {}
        for demand in demands:
            deepest = tree.group(tree.paths.get(demand.key, ()))
            self._own.setdefault(deepest.path if deepest is not None else (), []).append(demand)
        self._signatures: dict[Path, _Signature] = {}
        self._requests = {d.key: d.requests for d in demands}

    # ---- the tree's shape ------------------------------------------------------------------

    def top_groups(self) -> list[SubGroup]:
        return self._children.get((), [])

    def own(self, path: Path) -> list[Demand]:
        return self._own.get(path, [])

    def _has_demands(self, group: SubGroup) -> bool:
        return bool(self.own(group.path)) or any(
            self._has_demands(c) for c in self._children.get(group.path, ())
        )

    def _flatten(self, groups: Iterable[SubGroup]) -> tuple[list[SubGroup], list[Demand]]:
        """Constrained sub-groups with members to place; an unconstrained one's members and
        its sub-groups stand for it (a role has no level of its own)."""
        constrained: list[SubGroup] = []
        loose: list[Demand] = []
        for group in groups:
            if not self._has_demands(group):
                continue
            if group.constraint is not None:
                constrained.append(group)
                continue
            loose += self.own(group.path)
            inner, more = self._flatten(self._children.get(group.path, ()))
            constrained += inner
            loose += more
        return constrained, loose

    def _pin(self, group: SubGroup, level: str) -> str | None:
        """The domain of `level` its placed members share ("" none placed, None: several)."""
        nodes = [node for path, node in self._tree.placed if path[: len(group.path)] == group.path]
        if not nodes:
            return ""
        return common_domain(nodes, self._labels_of, level)

    def _signature(self, group: SubGroup) -> _Signature:
        """Sub-groups alike in constraint, members' shapes and nesting are interchangeable."""
        known = self._signatures.get(group.path)
        if known is None:
            has_placed = any(p[: len(group.path)] == group.path for p, _ in self._tree.placed)
            known = self._signatures[group.path] = (
                group.constraint,
                group.path if has_placed else (),  # pinned: a kind of its own
                tuple(sorted((_demand_signature(d) for d in self.own(group.path)), key=repr)),
                tuple(
                    sorted(
                        (
                            self._signature(c)
                            for c in self._children.get(group.path, ())
                            if self._has_demands(c)
                        ),
                        key=repr,
                    )
                ),
            )
        return known

    # ---- the search ------------------------------------------------------------------------

    def solve(
        self, groups: Sequence[SubGroup], own: Sequence[Demand], bins: list[Bin]
    ) -> _Solved | None:
        """Place `groups` (each whole in one domain of its level) and `own` (anywhere) on bins."""
        constrained, loose = self._flatten(groups)
        loose = [*own, *loose]
        if not constrained:
            return self._flat(loose, bins)
        first = constrained[0].constraint
        alike = [g for g in constrained if g.constraint == first]
        rest = [g for g in constrained if g.constraint != first]
        assert first is not None
        placed = self._at_level(alike, first, bins)
        if placed is None:
            return None
        if not rest and not loose:
            return placed
        left = _room_left(bins, self._evictable, placed.nodes, self._requests)
        after = self._solve_on(rest, loose, left)
        if after is None:
            return None
        return _Solved(
            placed.cost + after.cost,
            (*placed.nodes, *after.nodes),
            {**placed.domains, **after.domains},
        )

    def _solve_on(
        self,
        groups: Sequence[SubGroup],
        own: Sequence[Demand],
        left: tuple[list[Bin], dict[str, list[Evictable]]],
    ) -> _Solved | None:
        bins, evictable = left
        saved = self._evictable
        self._evictable = evictable
        try:
            return self.solve(groups, own, bins)
        finally:
            self._evictable = saved

    def _flat(self, demands: Sequence[Demand], bins: Sequence[Bin]) -> _Solved | None:
        if not demands:
            return _Solved(FREE, (), {})
        names = {b.name for b in bins}
        result = plan(
            demands,
            bins,
            {n: u for n, u in self._evictable.items() if n in names},
            self._budgets,
        )
        if result is None:
            return None
        return _Solved(result.cost, result.nodes, {})

    def _at_level(
        self, groups: Sequence[SubGroup], constraint: TopologyConstraint, bins: list[Bin]
    ) -> _Solved | None:
        """The sub-groups of one constraint: the lowest level that holds them all; preferred:
        anywhere inside the parent after."""
        levels, anywhere = self._resolve(constraint)
        for level in levels:
            found = self._knapsack(groups, level, bins)
            if found is not None:
                return found
        if anywhere:
            return self._inside(groups, bins)
        return None

    def _inside(self, groups: Sequence[SubGroup], bins: list[Bin]) -> _Solved | None:
        """`groups` all in the domain `bins` make up: their sub-groups and members there."""
        inner = [c for g in groups for c in self._children.get(g.path, ())]
        own = [d for g in groups for d in self.own(g.path)]
        return self.solve(inner, own, bins)

    def _knapsack(self, groups: Sequence[SubGroup], level: str, bins: list[Bin]) -> _Solved | None:
        """Each sub-group in one domain of `level`: the cheapest choice of domains in total."""
        kinds: dict[_Signature, list[SubGroup]] = {}
        for group in groups:
            kinds.setdefault(self._signature(group), []).append(group)
        kinds_list = list(kinds.values())
        domains = by_domain(bins, level)
        # A pinned sub-group is a kind of its own (its signature names it).
        pins = [self._pin(kind[0], level) for kind in kinds_list]
        if any(p is None for p in pins):
            return None  # a sub-group's placed members span domains: no one domain holds it
        target = tuple(len(kind) for kind in kinds_list)
        mixes = _mixes(target)

        options: dict[str, list[tuple[tuple[int, ...], Cost]]] = {}
        for value, inside in sorted(domains.items()):
            allowed = tuple(not pin or pin == value for pin in pins)
            found: list[tuple[tuple[int, ...], Cost]] = []
            infeasible: list[tuple[int, ...]] = []
            for mix in mixes:
                if any(n and not ok for n, ok in zip(mix, allowed, strict=True)):
                    continue
                if any(all(a >= b for a, b in zip(mix, bad, strict=True)) for bad in infeasible):
                    continue
                got = self._inside(_take(kinds_list, mix, [0] * len(mix)), _copies(inside))
                if got is None:
                    infeasible.append(mix)
                    continue
                found.append((mix, got.cost))
            if found:
                options[value] = found
        done = _cheapest_picks(options, target)
        if done is None:
            return None
        # The concrete sub-groups of each kind, in path order, to the domains picked.
        taken = [0] * len(kinds_list)
        cost = FREE
        nodes: list[PlannedNode] = []
        chosen: dict[Path, Domain] = {}
        for value, mix in sorted(done):
            concrete = _take(kinds_list, mix, taken)
            got = self._inside(concrete, _copies(domains[value]))
            assert got is not None  # alike in every way to the mix costed above
            cost = cost + got.cost
            nodes += got.nodes
            chosen.update(got.domains)
            for group in concrete:
                chosen[group.path] = Domain(level, value)
        return _Solved(cost, tuple(nodes), chosen)


def _cheapest_picks(
    options: Mapping[str, Sequence[tuple[tuple[int, ...], Cost]]], target: tuple[int, ...]
) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The knapsack over domains: the (domain, mix) picks reaching `target` at least cost.

    As the planner's over nodes: the cheapest domains for one mix are weighed, enough
    that any `sum(target)` of them holding a sub-group each make a plan.
    """
    cheapest = sorted(options, key=lambda v: (min(c for _, c in options[v]), v))
    zero = tuple(0 for _ in target)
    states: dict[tuple[int, ...], tuple[Cost, tuple[tuple[str, tuple[int, ...]], ...]]] = {
        zero: (FREE, ())
    }
    for value in cheapest[: max(MAX_PLAN_NODES, 4 * sum(target))]:
        grown = dict(states)
        for have, (cost, picks) in states.items():
            for mix, extra in options[value]:
                total = tuple(a + b for a, b in zip(have, mix, strict=True))
                if any(t > n for t, n in zip(total, target, strict=True)):
                    continue
                new_cost = cost + extra
                best = grown.get(total)
                if best is None or new_cost < best[0]:
                    grown[total] = (new_cost, (*picks, (value, mix)))
        states = grown
    done = states.get(target)
    return done[1] if done is not None else None


def _mixes(target: Sequence[int]) -> list[tuple[int, ...]]:
    """The mixes of sub-groups one domain may be given, the fewest sub-groups first.

    Many kinds (pinned sub-groups are a kind each) would make too many: then each
    domain is given sub-groups of one kind only (bounded work; may miss the fewest).
    """
    if math.prod(n + 1 for n in target) > MAX_MIXES * 16:
        found = []
        for i, n in enumerate(target):
            for count in range(1, n + 1):
                found.append(tuple(count if j == i else 0 for j in range(len(target))))
        return sorted(found, key=sum)
    return sorted(
        (m for m in itertools.product(*(range(n + 1) for n in target)) if any(m)), key=sum
    )[:MAX_MIXES]


def _take(kinds: Sequence[list[SubGroup]], mix: Sequence[int], taken: list[int]) -> list[SubGroup]:
    """The next `mix[i]` sub-groups of each kind (advancing `taken`)."""
    out: list[SubGroup] = []
    for i, count in enumerate(mix):
        out += kinds[i][taken[i] : taken[i] + count]
        taken[i] += count
    return out


def _copies(bins: Iterable[Bin]) -> list[Bin]:
    return [b.with_free(dict(b.free)) for b in bins]


def _demand_signature(demand: Demand) -> tuple[tuple[tuple[str, int], ...], Placement | None]:
    return (tuple(sorted(demand.requests.items())), demand.placement)


def _room_left(
    bins: Sequence[Bin],
    evictable: Mapping[str, Sequence[Evictable]],
    planned: Sequence[PlannedNode],
    requests: Mapping[str, Resources],
) -> tuple[list[Bin], dict[str, list[Evictable]]]:
    """The room once `planned` is carried out: its victims gone and its members placed.

    A node whose members would take more than it frees and has (never the case for
    a plan of its own) is left with nothing.
    """
    used: dict[str, tuple[list[str], list[Evictable]]] = {}
    for p in planned:
        entry = used.setdefault(p.node, ([], []))
        entry[0].extend(p.members)
        entry[1].extend(p.victims)
    left: list[Bin] = []
    pool = {node: list(units) for node, units in evictable.items()}
    for b in bins:
        if b.name not in used:
            left.append(b.with_free(dict(b.free)))
            continue
        members, victims = used[b.name]
        free: Resources = dict(b.free)
        for victim in victims:
            add(free, victim.requests)
        need: Resources = {}
        for member in members:
            add(need, requests.get(member, {}))
        if shortfall(need, free):
            free.clear()
        else:
            subtract(free, need)
        left.append(b.with_free(free))
        gone = {v.uids for v in victims}
        pool[b.name] = [u for u in pool.get(b.name, []) if u.uids not in gone]
    return left, pool
