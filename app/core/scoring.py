"""Placement scores for the prioritize verb: gang locality and Volcano-style binpack.

Pure functions over ClusterState. kube-scheduler adds our 0..10 score,
times the extender's weight, to its in-tree scores, so the scores only nudge:
keep members of a gang close together (fewer cross-node hops for MPI and
collective operations) and fill nodes before opening new ones (less
fragmentation, so the next gang finds whole nodes free).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from app.core.binpack import ROUNDS_TO_ZERO, BinpackMemo, binpack_all, binpack_request, clamp
from app.core.records import NodeRecord
from app.core.resources import Resources
from app.core.state import ClusterState


@dataclass(frozen=True)
class ScoringPolicy:
    locality_weight: int = 2
    binpack_weight: int = 1
    # Resource name -> weight in the binpack score (Volcano's binpack.cpu, ...).
    binpack_resources: Mapping[str, int] = field(default_factory=lambda: {"cpu": 1, "memory": 1})
    # Node label whose value names a topology domain (e.g. topology.kubernetes.io/zone).
    topology_key: str | None = None
    # Whether pods outside any gang get the binpack score (else a flat 0).
    binpack_non_gang: bool = True
    # Whether the filter names an admitted gang member's node (app/core/node_choice.py)
    # rather than pass every node for kube-scheduler to score (--member-node-choice).
    pick_member_node: bool = True


class NodeScorer:
    """The prioritize scores: 1..10 for the nodes kube-scheduler sent that score at all.

    The binpack part comes from a memo per request shape (app/core/binpack.py).
    """

    def __init__(self, policy: ScoringPolicy, state: ClusterState) -> None:
        self.policy = policy
        self._state = state
        self._binpacks = BinpackMemo(state)

    def score(
        self,
        requests: Resources,
        group_key: str | None,
        node_names: Sequence[str],
        nodes_in_request: Mapping[str, NodeRecord] | None = None,
    ) -> dict[str, int]:
        """A 1..10 score for the nodes of `node_names` that get one; the others score 0.

        kube-scheduler adds nothing for a node the answer leaves out, and most
        nodes of a large, mostly empty cluster score 0.

        nodes_in_request: the Node objects of a call without nodeCacheCapable;
        they win over our cache and are not remembered.
        """
        near_weight, pack_weight = self._weights(group_key)
        if pack_weight and not near_weight and nodes_in_request is None:
            # A pod in no gang, the common case: the remembered 0..10 scores as they are.
            asked = binpack_request(self.policy.binpack_resources, requests)
            remembered = self._binpacks.current(asked).scores
            if not remembered:  # no node scores: nothing to look up
                return {}
            if len(remembered) <= _FEW:  # each looked for in the names, in C
                return {name: score for name, score in remembered.items() if name in node_names}
            return {name: score for name in node_names if (score := remembered.get(name))}
        parts = self._parts(requests, group_key, node_names, nodes_in_request)
        return _weighted(node_names, *parts) if parts is not None else {}

    def best(
        self,
        requests: Resources,
        group_key: str,
        node_names: Sequence[str],
        nodes_in_request: Mapping[str, NodeRecord] | None = None,
    ) -> str | None:
        """The node of `node_names` that score() ranks first, compared before rounding.

        The filter names this node for a gang member (app/web/filter_verb.py),
        so kube-scheduler skips its scoring and our prioritize call. Ties go
        to the first in `node_names`; None when the policy prefers nothing
        (both weights 0) or no node is named.
        """
        near_weight, pack_weight = self._weights(group_key)
        if not near_weight + pack_weight or not node_names:
            return None
        near = self._near(group_key, node_names, nodes_in_request) if near_weight else {}
        top, at, pack_of = (
            self._pack_top(requests, node_names, nodes_in_request)
            if pack_weight
            else (0.0, 0, _no_pack)
        )
        # Then the few nodes that locality lifts, each by its position.
        best = pack_weight * top
        for name, i in _positions(node_names, near).items():
            value = near_weight * near[name] + pack_weight * pack_of(name, i)
            if value > best or (value == best and i < at):
                best, at = value, i
        return node_names[at]

    def _pack_top(
        self,
        requests: Resources,
        node_names: Sequence[str],
        nodes_in_request: Mapping[str, NodeRecord] | None,
    ) -> tuple[float, int, Callable[[str, int], float]]:
        """(the highest binpack of `node_names`, where it first is, binpack of (name, position)).

        Once per admitted member over thousands of nodes. Usually one of the
        cluster's fullest nodes (the memo's high()) is offered: the first of
        the fullest of those is the answer, and the names are only hashed, in
        C. Otherwise (or for a request's own Node objects) the binpack of
        every name is read, in C (max, index).
        """
        asked = binpack_request(self.policy.binpack_resources, requests)
        if nodes_in_request is None:
            memo = self._binpacks.current(asked)
            fractions = memo.fractions
            offered = memo.high().intersection(node_names)
            if offered:  # every name not in it scores less
                top = max(fractions[name] for name in offered)
                at = _first_of(node_names, {n for n in offered if fractions[n] == top})
                assert at is not None
                return top, at, lambda name, _i: fractions.get(name, 0.0)
            packs = self._binpacks.of(asked, node_names)[1]
        else:
            packed = binpack_all(asked, self._state, node_names, nodes_in_request)
            packs = list(map(packed.__getitem__, node_names))
        top = max(packs)
        return top, packs.index(top), lambda _name, i: packs[i]

    def _parts(
        self,
        requests: Resources,
        group_key: str | None,
        node_names: Sequence[str],
        nodes_in_request: Mapping[str, NodeRecord] | None,
    ) -> tuple[_Near, _Packs] | None:
        """(weight, 0..1 per node) of locality (by name) and of binpack (in node order);
        None when both weigh 0."""
        policy, state = self.policy, self._state
        near_weight, pack_weight = self._weights(group_key)
        if not near_weight + pack_weight:
            return None
        near: Mapping[str, float] = {}
        if near_weight:
            assert group_key is not None
            near = self._near(group_key, node_names, nodes_in_request)
        if not pack_weight:
            return (near_weight, near), (0, [0.0] * len(node_names))
        asked = binpack_request(policy.binpack_resources, requests)
        if nodes_in_request is None:
            packs = self._binpacks.of(asked, node_names)[1]
        else:
            packed = binpack_all(asked, state, node_names, nodes_in_request)
            packs = list(map(packed.__getitem__, node_names))
        return (near_weight, near), (pack_weight, packs)

    def _near(
        self,
        group_key: str,
        node_names: Sequence[str],
        nodes_in_request: Mapping[str, NodeRecord] | None,
    ) -> dict[str, float]:
        """locality() of the group, a node in the request winning over our cache."""
        state = self._state

        def node(name: str) -> NodeRecord | None:
            if nodes_in_request is not None and name in nodes_in_request:
                return nodes_in_request[name]
            return state.nodes.get(name)

        return locality(self.policy, state, group_key, node_names, node)

    def _weights(self, group_key: str | None) -> tuple[int, int]:
        """(locality, binpack) weights for a pod of `group_key` (None: in no gang)."""
        policy = self.policy
        near = policy.locality_weight if group_key is not None else 0
        pack = policy.binpack_weight if group_key is not None or policy.binpack_non_gang else 0
        return near, pack


_FEW = 8
"""Up to this many nodes are each looked for in the thousands of names with list.index
(in C); more, and one pass over the names is cheaper."""

_Near = tuple[int, Mapping[str, float]]
"""Locality: its weight, and 0..1 per node (a node left out is 0)."""

_Packs = tuple[int, Sequence[float]]
"""Binpack: its weight, and 0..1 for each node of the call, in the call's order."""


def _weighted(node_names: Sequence[str], near: _Near, packed: _Packs) -> dict[str, int]:
    """The nodes' scores from the two parts; those scoring 0 left out.

    Spelled out for the two parts: this loop runs over every node for every
    gang member. Most nodes of a large cluster round to 0: below `cut` no
    clamp() is needed to know.
    """
    (near_weight, near_part), (pack_weight, packs) = near, packed
    total = near_weight + pack_weight
    scores: dict[str, int] = {}
    cut = total * ROUNDS_TO_ZERO
    if near_part:
        near_of = near_part.get
        for name, fraction in zip(node_names, packs, strict=True):
            combined = near_weight * near_of(name, 0.0) + pack_weight * fraction
            if combined > cut and (score := clamp(combined / total)):
                scores[name] = score
    elif pack_weight:
        share = pack_weight / total
        cut = cut / pack_weight
        for name, fraction in zip(node_names, packs, strict=True):
            if fraction > cut and (score := clamp(share * fraction)):
                scores[name] = score
    return scores


def _no_pack(_name: str, _i: int) -> float:
    return 0.0


def _first_of(node_names: Sequence[str], wanted: Collection[str]) -> int | None:
    """Where the first of `node_names` that is in `wanted` is; None if none is."""
    if len(wanted) <= _FEW:
        return min(_positions(node_names, wanted).values(), default=None)
    for i, name in enumerate(node_names):  # many wanted: one of the first names is
        if name in wanted:
            return i
    return None


def _positions(node_names: Sequence[str], wanted: Collection[str]) -> dict[str, int]:
    """Where each of `wanted` first is in `node_names` (those absent left out)."""
    if len(wanted) > _FEW:  # a topology domain's nodes: one pass, in C
        index = dict(zip(reversed(node_names), range(len(node_names) - 1, -1, -1), strict=True))
        return {name: index[name] for name in wanted if name in index}
    found: dict[str, int] = {}
    for name in wanted:  # the few nodes holding members: list.index runs in C
        with suppress(ValueError):
            found[name] = node_names.index(name)
    return found


def locality(
    policy: ScoringPolicy,
    state: ClusterState,
    group_key: str,
    node_names: Sequence[str],
    lookup: Callable[[str], NodeRecord | None],
) -> dict[str, float]:
    """Pull the gang together, 0..1 per node; a node left out scores 0.

    Without --topology-key: the share of the group's placed (bound or
    reserved) members on the node. With it: mostly the share in the node's
    domain, plus a bonus for the node itself. While no member is placed yet,
    every member is steered to the same domain: the one that fits all the
    group's unplaced members most tightly. That matters because
    kube-scheduler scores the next member before it tells us (in bind) where
    it put the previous one.
    """
    members = state.members(group_key)
    on_node: dict[str, int] = {}
    for member in members:
        placed = member.placed_node
        if placed:
            on_node[placed] = on_node.get(placed, 0) + 1
    placed_total = sum(on_node.values())
    key = policy.topology_key
    if not key:
        return {name: count / placed_total for name, count in on_node.items()}

    def domain_of(node: str) -> str | None:
        record = lookup(node)
        return record.labels.get(key) if record else None

    if placed_total:
        in_domain: dict[str, float] = {}
        for name, count in on_node.items():
            domain = domain_of(name)
            if domain is not None:
                in_domain[domain] = in_domain.get(domain, 0) + count / placed_total
    else:
        target = tightest_domain(state, key, [m.requests for m in members])
        in_domain = {target: 1.0} if target is not None else {}
    result: dict[str, float] = {}
    for name in node_names:
        domain = domain_of(name)
        same_domain = in_domain.get(domain, 0.0) if domain is not None else 0.0
        same_node = on_node.get(name, 0) / placed_total if placed_total else 0.0
        # A shared domain matters most; sharing the node itself is a bonus.
        if near := 0.75 * same_domain + 0.25 * same_node:
            result[name] = near
    return result


def tightest_domain(state: ClusterState, key: str, requests: Sequence[Resources]) -> str | None:
    """The topology domain whose free resources hold all `requests` with the least to spare.

    Deterministic (ties go to the smaller name), so every member of a gang
    scored in a row picks the same domain. None if no single domain fits.
    """
    need: Resources = {}
    for r in requests:
        for name, amount in r.items():
            need[name] = need.get(name, 0) + amount
    free: dict[str, Resources] = {}
    for node in state.nodes.values():
        domain = node.labels.get(key)
        if domain is None or node.unschedulable:
            continue
        used = state.requested_on(node.name)
        pool = free.setdefault(domain, {})
        for name, amount in node.allocatable.items():
            pool[name] = pool.get(name, 0) + max(0, amount - used.get(name, 0))
    fitting = [
        (pool.get("cpu", 0), domain)
        for domain, pool in free.items()
        if all(pool.get(name, 0) >= amount for name, amount in need.items())
    ]
    return min(fitting)[1] if fitting else None
