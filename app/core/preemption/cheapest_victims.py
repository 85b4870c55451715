"""One node: the cheapest victims whose requests cover what a preemptor lacks there.

The preemption planner asks this for every node and every mix of members the
node could hold. Cost is compared field by field: fewest evictions, then the
lowest top priority, the lowest priority sum, the fewest gangs disturbed.
Units alike in requests, priority, gang and budget are interchangeable, so the
search is over how many of each class go, not over which pods.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from app.core.preemption.eviction_budgets import Spending
from app.core.resources import Resources, add, fits

# Victim subsets tried exhaustively per node and member mix before the greedy pick.
EXHAUSTIVE_COMBINATIONS = 2_000


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


class ClassKey(NamedTuple):
    """What makes units interchangeable."""

    requests: tuple[tuple[str, int], ...]
    priority: int
    gang: str | None
    budget: str | None
    evictions: int


def class_key(unit: Evictable) -> ClassKey:
    return ClassKey(
        tuple(sorted(unit.requests.items())),
        unit.priority,
        unit.gang,
        unit.budget,
        unit.evictions,
    )


def classes_of(units: Iterable[Evictable]) -> tuple[list[ClassKey], list[list[Evictable]]]:
    """`units` grouped into classes, in class-key order (the counts index these)."""
    by_key: dict[ClassKey, list[Evictable]] = {}
    for unit in units:
        by_key.setdefault(class_key(unit), []).append(unit)
    keys = sorted(by_key, key=repr)
    return keys, [by_key[k] for k in keys]


def cheapest_victims(
    deficit: Mapping[str, int],
    units: Sequence[Evictable],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[Evictable, ...]] | None:
    """The cheapest set of `units` whose requests cover `deficit`, None when all of them do not."""
    keys, groups = classes_of(units)
    got = cheapest_counts(deficit, keys, [len(g) for g in groups], budgets)
    if got is None:
        return None
    cost, counts = got
    return cost, tuple(u for group, n in zip(groups, counts, strict=True) for u in group[:n])


def cheapest_counts(
    deficit: Mapping[str, int],
    keys: Sequence[ClassKey],
    counts: Sequence[int],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[int, ...]] | None:
    """How many of each class of units to evict, at the least cost, to cover `deficit`.

    Exhaustive by total size while the number of count vectors stays within
    EXHAUSTIVE_COMBINATIONS (a node's pods fall into few classes: the usual
    case), greedy past it.
    """
    requests = [dict(k.requests) for k in keys]
    useful = [any(r.get(name, 0) > 0 for name in deficit) for r in requests]
    limits = [n if ok else 0 for n, ok in zip(counts, useful, strict=True)]
    freed: Resources = {}
    for r, n in zip(requests, limits, strict=True):
        for name, amount in r.items():
            freed[name] = freed.get(name, 0) + amount * n
    if not fits(deficit, freed):
        return None
    tops, smallest = _bounds(deficit, keys, requests, limits)
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
                return _cheaper(best, _greedy(deficit, keys, requests, limits, budgets))
            if _vector_ok(deficit, keys, requests, vector, budgets):
                best = _cheaper(best, (_vector_cost(keys, vector), vector))
    return best


def _bounds(
    deficit: Mapping[str, int],
    keys: Sequence[ClassKey],
    requests: Sequence[Mapping[str, int]],
    limits: Sequence[int],
) -> tuple[dict[str, list[int]], list[int]]:
    """What k units free at most, per resource; and the fewest evictions k units cost."""
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
            sorted(k.evictions for k, n in zip(keys, limits, strict=True) for _ in range(n))
        )
    )
    return tops, smallest


def _cheaper(
    best: tuple[Cost, tuple[int, ...]] | None, other: tuple[Cost, tuple[int, ...]] | None
) -> tuple[Cost, tuple[int, ...]] | None:
    if other is not None and (best is None or other[0] < best[0]):
        return other
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
    keys: Sequence[ClassKey],
    requests: Sequence[Mapping[str, int]],
    vector: Sequence[int],
    budgets: Mapping[str, int],
) -> bool:
    spending = Spending(budgets)
    for key, n in zip(keys, vector, strict=True):
        if not spending.spend(key.budget, n):
            return False
    for name, amount in deficit.items():
        if sum(r.get(name, 0) * n for r, n in zip(requests, vector, strict=True)) < amount:
            return False
    return True


def _vector_cost(keys: Sequence[ClassKey], vector: Sequence[int]) -> Cost:
    chosen = [(k, n) for k, n in zip(keys, vector, strict=True) if n]
    return Cost(
        sum(k.evictions * n for k, n in chosen),
        max((k.priority for k, _ in chosen), default=FREE.top_priority),
        sum(k.priority * k.evictions * n for k, n in chosen),
        len({k.gang for k, _ in chosen if k.gang is not None}),
    )


def _greedy(
    deficit: Mapping[str, int],
    keys: Sequence[ClassKey],
    requests: Sequence[Mapping[str, int]],
    limits: Sequence[int],
    budgets: Mapping[str, int],
) -> tuple[Cost, tuple[int, ...]] | None:
    """Cheapest units first while some of the deficit is left, then put back what is not needed."""
    order = sorted(
        range(len(keys)),
        key=lambda i: (
            keys[i].evictions,
            keys[i].priority,
            -_share(requests[i], deficit),
            repr(keys[i]),
        ),
    )
    vector = [0] * len(keys)
    spending = Spending(budgets)
    freed: Resources = {}
    for i in order:
        budget = keys[i].budget
        while vector[i] < limits[i] and not fits(deficit, freed):
            if not spending.can_spend(budget):
                break
            if not any(
                freed.get(n, 0) < amount and requests[i].get(n, 0) > 0
                for n, amount in deficit.items()
            ):
                break
            vector[i] += 1
            add(freed, requests[i])
            spending.spend(budget)
    if not fits(deficit, freed):
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
