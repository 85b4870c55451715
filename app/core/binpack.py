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

from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from operator import itemgetter

from cachetools import LRUCache

from app.core.records import NodeRecord
from app.core.resources import Resources
from app.core.state import ClusterState

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
    used = state.requested_on(node.name)
    allocatable = node.allocatable
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

    def of(
        self, asked: list[tuple[str, int, int]], node_names: Sequence[str]
    ) -> tuple[ShapeMemo, Sequence[float]]:
        """This request shape's memo, up to date for every node in `node_names`, and
        binpack() of each of them in that order.

        Nodes that changed since the memo was last read were marked stale and
        are computed again first, so a memo once complete stays complete, and
        then one itemgetter over the names, in C, reads them all (half the
        time of a map over dict.get: a gang member's filter does this over
        every node kube-scheduler sends). A name the memo has not seen makes it
        fail; the names missing are then computed, once per shape.
        """
        state = self._state
        self._forget_changed_nodes()
        shape = tuple(asked)
        memo = self._memo.get(shape)
        if memo is None:
            memo = self._memo[shape] = ShapeMemo()
        if memo.stale:
            for name in memo.stale:
                record = state.nodes.get(name)
                if record is None:  # deleted: forgotten, as if never seen
                    memo.fractions.pop(name, None)
                    memo.scores.pop(name, None)
                else:
                    memo.remember(name, binpack(asked, state, record))
            memo.stale.clear()
        fractions = memo.fractions
        with suppress(KeyError):
            return memo, _each(fractions, node_names)
        for name in node_names:
            if name not in fractions:
                # A node we do not know scores 0 and is remembered so: its
                # ADDED event marks it changed, and then stale.
                memo.remember(name, binpack(asked, state, state.nodes.get(name)))
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

    def remember(self, name: str, fraction: float) -> float:
        self.fractions[name] = fraction
        if score := clamp(fraction):
            self.scores[name] = score
        else:
            self.scores.pop(name, None)
        return fraction
