"""The fewest evictions a preempting gang needs, by exhaustive search: the planner's yardstick.

Shared by the planner's unit tests, the seeded cluster suite
(tests/cluster/test_preemption_seeds.py) and the soak (tests/soak/world.py):
each compares what the extender did with what this finds on the same
snapshot. `fewest_evictions_in_one_domain` answers for a gang with a required
topology level (every member in one rack, say): the cheapest single domain.
Deliberately naive (every victim set by size, every member-to-node
assignment), so it is only for small clusters, and shares no code with
app/core/preemption/planner.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

Res = Mapping[str, int]


@dataclass(frozen=True)
class Running:
    name: str
    node: str
    requests: Res
    priority: int
    # The running gang it belongs to (protect policy: it keeps minMember).
    gang: str | None = None


def _fits(free: dict[str, dict[str, int]], demands: Sequence[Res]) -> bool:
    if not demands:
        return True
    first, rest = demands[0], demands[1:]
    tried: set[tuple[tuple[str, int], ...]] = set()
    for left in free.values():
        shape = tuple(sorted(left.items()))
        if shape in tried:
            continue  # two nodes with the same room: one try is enough
        tried.add(shape)
        if all(left.get(k, 0) >= v for k, v in first.items()):
            for k, v in first.items():
                left[k] = left.get(k, 0) - v
            ok = _fits(free, rest)
            for k, v in first.items():
                left[k] += v
            if ok:
                return True
    return False


def fewest_evictions(
    allocatable: Mapping[str, Res],
    running: Sequence[Running],
    demands: Sequence[Res],
    priority: int,
    gang_min: Mapping[str, int],
    nodes: Collection[str] | None = None,
) -> int | None:
    """The smallest number of running pods to evict so that every demand fits, None if none does.

    Only pods of lower priority than `priority` may go; a member of a running
    gang only while its gang keeps gang_min[gang] members (counted over every
    node). `nodes`: the demands must fit on these nodes, and only pods there
    may go (one topology domain); None for every node.
    """
    if nodes is not None:
        allocatable = {n: res for n, res in allocatable.items() if n in nodes}
    evictable = [p for p in running if p.priority < priority and p.node in allocatable]
    ordered = sorted(demands, key=lambda d: -d.get("cpu", 0))
    for size in range(len(evictable) + 1):
        for victims in itertools.combinations(evictable, size):
            lost: dict[str, int] = {}
            for v in victims:
                if v.gang is not None:
                    lost[v.gang] = lost.get(v.gang, 0) + 1
            if any(
                sum(1 for p in running if p.gang == g) - n < gang_min[g] for g, n in lost.items()
            ):
                continue
            gone = {v.name for v in victims}
            free = {name: dict(res) for name, res in allocatable.items()}
            for p in running:
                if p.name not in gone and p.node in free:
                    for k, amount in p.requests.items():
                        free[p.node][k] = free[p.node].get(k, 0) - amount
            if _fits(free, ordered):
                return size
    return None


def fewest_evictions_in_one_domain(
    allocatable: Mapping[str, Res],
    running: Sequence[Running],
    demands: Sequence[Res],
    priority: int,
    gang_min: Mapping[str, int],
    domain_of: Mapping[str, str],
    pinned: str | None = None,
) -> int | None:
    """The fewest evictions so that every demand fits inside one domain, None if none can hold it.

    domain_of: node -> its domain (a node without one belongs to none, as the
    extender reads a node without the level's label); each domain is searched
    with only its nodes and its pods (fewest_evictions), and the cheapest wins.
    pinned: the domain the gang's placed members are in (it keeps to it).
    """
    domains: dict[str, list[str]] = {}
    for node in sorted(allocatable):
        if node in domain_of:
            domains.setdefault(domain_of[node], []).append(node)
    if pinned is not None:
        domains = {pinned: domains.get(pinned, [])}
    best: int | None = None
    for _domain, nodes in sorted(domains.items()):
        got = fewest_evictions(allocatable, running, demands, priority, gang_min, nodes)
        if got is not None and (best is None or got < best):
            best = got
    return best
