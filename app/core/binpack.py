"""Volcano's binpack score of a node, remembered per request shape.

kube-scheduler asks for every pod and, with nodeCacheCapable, sends the same
thousands of node names each time, while one binding changes the usage of
one node. So BinpackMemo keeps binpack() per node and per request shape (pods
of one Deployment or gang ask alike), and computes again only the nodes
ClusterState reports changed since. Its results are exactly binpack()'s;
bench/e2e.py showed kube-scheduler's throughput with the extender limited by
the prioritize verb's time when every node was recomputed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from operator import itemgetter

from cachetools import LRUCache

from app.core.records import NodeRecord
from app.core.resources import Resources
from app.core.state import ClusterState

HIGH = 64
"""ShapeMemo.high() keeps about this many of the fullest nodes (a few per window offered)."""
REMARK_AFTER = 256
"""Changes to a memo before high() may choose its mark again."""

MAX_SCORE = 10
"""kube-scheduler's extender scores are 0..10."""

# A 0..1 fraction up to this is score 0 (below 0.5 / MAX_SCORE, with room for float error).
ROUNDS_TO_ZERO = 0.49 / MAX_SCORE


def clamp(fraction: float) -> int:
    """0..1 to kube-scheduler's extender score range 0..MAX_SCORE."""
    return max(0, min(MAX_SCORE, round(fraction * MAX_SCORE)))


def binpack(
    asked: Sequence[tuple[str, int, int]],
    state: ClusterState,
    node: NodeRecord | None,
) -> float:
    """Volcano's BinPackingScore in 0..1: weighted (used + request) / allocatable.

    `asked` lists (resource, weight, request) for the weighted resources the
    pod requests. A node where one of them would overflow scores 0: it cannot
    take the pod anyway and must not look attractive.
    """
    if node is None:
        return 0.0
    return _packed(asked, state.requested_on(node.name), node.allocatable)


def _packed(
    asked: Sequence[tuple[str, int, int]], used: Mapping[str, int], allocatable: Mapping[str, int]
) -> float:
    """binpack() of a node that has `used` of its `allocatable` requested already."""
    score = 0.0
    weight_sum = 0
    for name, weight, request in asked:
        capacity = allocatable.get(name, 0)
        if capacity == 0:
            continue
        after = used.get(name, 0) + request
        if after > capacity:
            return 0.0
        score += weight * after / capacity
        weight_sum += weight
    return score / weight_sum if weight_sum else 0.0


def binpack_all(
    asked: Sequence[tuple[str, int, int]],
    state: ClusterState,
    node_names: Sequence[str],
    nodes_in_request: Mapping[str, NodeRecord] | None = None,
) -> dict[str, float]:
    """binpack() for every node kube-scheduler sent; a node in the request wins over our cache."""
    nodes = state.nodes
    return {
        name: binpack(
            asked,
            state,
            nodes_in_request[name]
            if nodes_in_request is not None and name in nodes_in_request
            else nodes.get(name),
        )
        for name in node_names
    }


def binpack_request(
    resource_weights: Mapping[str, int], requests: Resources
) -> list[tuple[str, int, int]]:
    """The `asked` argument of binpack() for a pod's requests."""
    return [(n, w, requests[n]) for n, w in resource_weights.items() if w and requests.get(n)]


class BinpackMemo:
    """binpack() of every node for the request shapes seen lately, kept up to date."""

    _SHAPES = 32
    """Request shapes remembered (least recently used dropped first)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        # request shape -> its memo.
        self._memo: LRUCache[tuple[tuple[str, int, int], ...], ShapeMemo] = LRUCache(self._SHAPES)
        # The ClusterState stamp the memos are up to date with.
        self._seen = 0

    def current(self, asked: list[tuple[str, int, int]]) -> ShapeMemo:
        """This request shape's memo, up to date for every node of the cluster.

        A new shape computes every node once; after that only the nodes that
        changed since the memo was last read (marked stale) are computed
        again, and a node added to the cluster arrives as a change. So the
        memo always holds every node our watch knows: a caller that needs
        only the nodes that score, or the best one, never reads the
        thousands of names kube-scheduler sent.
        """
        state = self._state
        self._forget_changed_nodes()
        shape = tuple(asked)
        memo = self._memo.get(shape)
        if memo is None:
            memo = self._memo[shape] = ShapeMemo.of_every_node(asked, state)
        elif memo.stale:
            for name in memo.stale:
                record = state.nodes.get(name)
                if record is None:  # deleted: forgotten, as if never seen
                    memo.forget(name)
                else:
                    memo.remember(name, binpack(asked, state, record))
            memo.stale.clear()
        return memo

    def of(
        self, asked: list[tuple[str, int, int]], node_names: Sequence[str]
    ) -> tuple[ShapeMemo, Sequence[float]]:
        """current(asked), and binpack() of each node in `node_names` in that order.

        One itemgetter over the names, in C, reads them all (half the time of
        a map over dict.get). A name our watch does not know makes it fail;
        such names score 0 and are remembered so (their ADDED event marks
        them changed, and then stale).
        """
        memo = self.current(asked)
        fractions = memo.fractions
        with suppress(KeyError):
            return memo, _each(fractions, node_names)
        for name in node_names:
            if name not in fractions:
                memo.remember(name, 0.0)
        return memo, _each(fractions, node_names)

    def _forget_changed_nodes(self) -> None:
        self._seen, changed = self._state.nodes_changed_since(self._seen)
        if changed is None:
            self._memo.clear()
            return
        if changed:
            for memo in self._memo.values():
                memo.stale.update(changed)


def _each(values: Mapping[str, float], names: Sequence[str]) -> Sequence[float]:
    """values[name] for each of `names`, in order; KeyError for a name not in `values`."""
    if len(names) > 1:
        found: tuple[float, ...] = itemgetter(*names)(values)
        return found
    return [values[name] for name in names]  # itemgetter of one name is no tuple


@dataclass(slots=True)
class ShapeMemo:
    """One request shape's binpack per node: 0..1, and the 0..10 score of a pod in no gang."""

    fractions: dict[str, float] = field(default_factory=dict)
    # Only the nodes that score above 0: in a mostly empty cluster, none.
    scores: dict[str, int] = field(default_factory=dict)
    # Nodes that changed since the memo was last read: computed again before it is.
    stale: set[str] = field(default_factory=set)
    # Every node whose fraction is at least `_mark` (see high()), kept exact as nodes
    # change: a node joins or leaves as it crosses the mark. None: no mark chosen yet.
    _mark: float | None = None
    _high: set[str] = field(default_factory=set)
    _changes_since_mark: int = 0

    @classmethod
    def of_every_node(cls, asked: Sequence[tuple[str, int, int]], state: ClusterState) -> ShapeMemo:
        """A new request shape's memo: binpack() of every node, in two comprehensions.

        The first member of a new shape waits in its filter while all 5,000 nodes are
        scored (the longest step of a first admission): a remember() and a binpack() call
        per node were a quarter of that pass's 7-8 ms. Exactly what remember() of each
        gives (no mark chosen yet): a fraction up to ROUNDS_TO_ZERO clamps to no score.
        """
        requested_on = state.requested_on
        fractions = {
            name: _packed(asked, requested_on(name), node.allocatable)
            for name, node in state.nodes.items()
        }
        scores = {
            name: score
            for name, fraction in fractions.items()
            if fraction > ROUNDS_TO_ZERO and (score := clamp(fraction))
        }
        return cls(fractions, scores)

    def remember(self, name: str, fraction: float) -> None:
        self.fractions[name] = fraction
        if score := clamp(fraction):
            self.scores[name] = score
        else:
            self.scores.pop(name, None)
        if self._mark is not None:
            self._changes_since_mark += 1
            if fraction >= self._mark:
                self._high.add(name)
            else:
                self._high.discard(name)

    def forget(self, name: str) -> None:
        """A deleted node: as if never seen."""
        self.fractions.pop(name, None)
        self.scores.pop(name, None)
        self._high.discard(name)

    def high(self) -> set[str]:
        """The fullest few dozen nodes: every node at or above a mark, none below it.

        kube-scheduler offers an extender a window of the nodes (a tenth of
        5,000), and the best of them is among these whenever one of these is
        offered. Reading the fractions of every offered name instead was half
        of a gang member's filter at 5,000 nodes: the memo's thousands of
        entries are rarely in the CPU's caches. The mark is chosen again when
        it keeps too few or too many nodes, at most once every REMARK_AFTER
        changes (it reads every node).
        """
        if self._mark is None or (
            self._changes_since_mark >= REMARK_AFTER
            and not HIGH // 2 <= len(self._high) <= 4 * HIGH
        ):
            self._choose_mark()
        return self._high

    def _choose_mark(self) -> None:
        """The fraction of the HIGH-th fullest node, or above it when many nodes tie there
        (the empty nodes of a mostly empty cluster); no mark (inf) when none scores above 0."""
        fractions = self.fractions
        fullest = [f for f in heapq.nlargest(HIGH, fractions.values()) if f > 0]
        mark = fullest[-1] if fullest else math.inf
        high = {n for n, f in fractions.items() if f >= mark}
        if len(high) > 4 * HIGH:
            above = [f for f in fullest if f > mark]
            mark = above[-1] if above else math.inf
            high = {n for n, f in fractions.items() if f >= mark}
        self._mark, self._high, self._changes_since_mark = mark, high, 0
