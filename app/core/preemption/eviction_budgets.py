"""Eviction budgets: PodDisruptionBudget-like caps on how many units a plan may evict.

A running gang under the protect victim policy may lose only the members above
its minMember; every unit it offers carries that gang's budget key. A budget
spans nodes, while the planner costs each node on its own: a plan that
overspends a budget is searched again with that budget confined to the node
that spent most of it, then (overspent still) with the budget closed.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def protect_budget(running: int, min_member: int) -> int:
    """How many of a running gang's members may go while it keeps minMember placed."""
    return max(0, running - min_member)


class Spending:
    """Units spent per budget so far, against the limits."""

    def __init__(self, limits: Mapping[str, int]) -> None:
        self._limits = limits
        self._spent: dict[str, int] = {}

    def can_spend(self, budget: str | None) -> bool:
        """May one more unit with this budget go?"""
        return budget is None or self._spent.get(budget, 0) < self._limits.get(budget, 0)

    def spend(self, budget: str | None, units: int = 1) -> bool:
        """Count `units` against `budget`; False once it is spent beyond its limit."""
        if budget is None or not units:
            return True
        self._spent[budget] = self._spent.get(budget, 0) + units
        return self._spent[budget] <= self._limits.get(budget, 0)


@dataclass
class Budgets:
    """The limits, and where each budget may still be spent after an overspending plan."""

    limits: Mapping[str, int]
    # budget -> the one node it may be spent on (None: closed).
    confined: dict[str, str | None] = field(default_factory=dict)

    def may_spend(self, budget: str | None, node: str) -> bool:
        if budget is None:
            return True
        if self.limits.get(budget, 0) <= 0:
            return False
        return self.confined.get(budget, node) == node

    def overspent(self, spent: Iterable[tuple[str, str]]) -> dict[str, str]:
        """Budgets spent beyond their limit -> the node that spent most of each.

        spent: (budget, node) for each unit a plan evicts.
        """
        by_budget: dict[str, dict[str, int]] = {}
        for budget, node in spent:
            by_node = by_budget.setdefault(budget, {})
            by_node[node] = by_node.get(node, 0) + 1
        return {
            budget: max(by_node, key=lambda n: (by_node[n], n))
            for budget, by_node in by_budget.items()
            if sum(by_node.values()) > self.limits.get(budget, 0)
        }

    def confine(self, over: Mapping[str, str]) -> None:
        """Confine each overspent budget to its node; close it if it was confined already."""
        for budget, node in over.items():
            self.confined[budget] = None if budget in self.confined else node
