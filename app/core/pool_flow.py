"""The devices members draw from shared pools, routed as a flow rather than in a fixed order. Pure.

A member's devices beyond its node's own come out of the shared pools that
serve its node (app/core/shared_pools.py). Taking them from the pools in a
fixed order is not enough where a node is served by two pools: a member on
a node served by pools A and B that took A's last devices leaves a later
member on a node served by A alone short, though B had them. Which pool a
member's devices come from is not decided until the gang is, so the draws
are a bipartite assignment: per device resource, the demand of each source
(the pools serving a node: nodes served alike are one source) is spread
over its pools, each pool holding at most its free devices. A new demand is
routed by augmenting paths (a member's devices moved from one pool to
another of its node's to make room), so a demand is refused only when no
assignment of all the demands exists (max-flow, min-cut). Resources are
routed apart, as each pool counts each of its resources apart.

A member's own node's devices are taken before any pool's: they serve no
other node, and every pool the member may draw on serves its node, so
taking them first never leaves another member short.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from app.core.resources import Resources

if TYPE_CHECKING:
    from app.core.shared_pools import SharedPool

# The pools serving one node, in the bin's order: members of nodes served alike share one.
Source = tuple["SharedPool", ...]
# resource -> source -> pool -> devices of the resource that source draws from the pool.
Routes = dict[str, dict[Source, dict["SharedPool", int]]]
# A copy of a PoolFlow's state: its routes, and what they take of each pool.
FlowState = tuple[Routes, dict["SharedPool", Resources]]

_NOTHING: Resources = {}


class PoolFlow:
    """Every member's pooled demand so far, routed to pools with none over its free."""

    __slots__ = ("_routes", "taken")

    def __init__(self) -> None:
        self._routes: Routes = {}
        # Pool -> what the demands routed take of it, per resource.
        self.taken: dict[SharedPool, Resources] = {}

    def left(self, pool: SharedPool, resource: str) -> int:
        """What `pool` has left of `resource`."""
        return pool.free.get(resource, 0) - self.taken.get(pool, _NOTHING).get(resource, 0)

    def routes(self, resource: str) -> dict[Source, dict[SharedPool, int]]:
        """Per source, what it draws of `resource` from each pool (read only)."""
        return self._routes.get(resource, {})

    def room_for(self, source: Source, resource: str, amount: int) -> bool:
        """Whether `amount` more of `resource` for `source` can be routed (nothing changes)."""
        if amount <= sum(max(0, self.left(p, resource)) for p in source):
            return True  # the common case: the pools have it as they are drawn now
        routes = {s: dict(drawn) for s, drawn in self._routes.get(resource, {}).items()}
        # The source's own pools too: one no demand has drawn on yet is in no route.
        left = self._left_map(resource, routes, source)
        return _route(routes, left, source, amount) >= amount

    def route(self, source: Source, resource: str, amount: int) -> int:
        """Route up to `amount` more of `resource` for `source`; how much was routed."""
        routes = self._routes.setdefault(resource, {})
        left = self._left_map(resource, routes, source)
        routed = _route(routes, left, source, amount)
        for pool, spare in left.items():
            taken = self.taken.setdefault(pool, {})
            taken[resource] = pool.free.get(resource, 0) - spare
        return routed

    def _left_map(
        self, resource: str, routes: dict[Source, dict[SharedPool, int]], extra: Source = ()
    ) -> dict[SharedPool, int]:
        """What each pool that `routes` or `extra` reach has left of `resource`."""
        pools = {p for s in routes for p in s}
        pools.update(extra)
        return {p: max(0, self.left(p, resource)) for p in pools}

    def snapshot(self) -> FlowState:
        """A copy of the state, for restore() (the search tries and takes back)."""
        routes = {
            r: {s: dict(drawn) for s, drawn in by_source.items()}
            for r, by_source in self._routes.items()
        }
        return routes, {p: dict(t) for p, t in self.taken.items()}

    def restore(self, saved: FlowState) -> None:
        self._routes, self.taken = saved


def _route(
    routes: dict[Source, dict[SharedPool, int]],
    left: dict[SharedPool, int],
    source: Source,
    amount: int,
) -> int:
    """Route up to `amount` for `source` into `routes` and `left` (in place): first straight
    into its pools' spare devices, then along augmenting paths. How much was routed."""
    drawn = routes.setdefault(source, {})
    routed = 0
    for pool in source:
        got = min(amount - routed, left.get(pool, 0))
        if got > 0:
            drawn[pool] = drawn.get(pool, 0) + got
            left[pool] -= got
            routed += got
    while routed < amount:
        path = _augmenting_path(routes, left, source)
        if path is None:
            break
        routed += _push(routes, left, source, path, amount - routed)
    return routed


# One step of a path: another source gives up `pool`'s devices and takes `to`'s instead.
_Hop = tuple["Source", "SharedPool", "SharedPool"]


def _augmenting_path(
    routes: dict[Source, dict[SharedPool, int]], left: dict[SharedPool, int], source: Source
) -> tuple[SharedPool, list[_Hop]] | None:
    """A pool of `source` to draw on, and the hops (breadth first) that free one of its
    devices by moving other sources' draws on to a pool with spare devices; None: no path."""
    came_from: dict[SharedPool, _Hop | None] = dict.fromkeys(source)
    queue = deque(source)
    while queue:
        pool = queue.popleft()
        if left.get(pool, 0) > 0:
            hops: list[_Hop] = []
            at = pool
            while (hop := came_from[at]) is not None:
                hops.append(hop)
                at = hop[1]
            hops.reverse()
            return at, hops
        for other, drawn in routes.items():
            if drawn.get(pool, 0) <= 0:
                continue
            for to in other:
                if to not in came_from:
                    came_from[to] = (other, pool, to)
                    queue.append(to)
    return None


def _push(
    routes: dict[Source, dict[SharedPool, int]],
    left: dict[SharedPool, int],
    source: Source,
    path: tuple[SharedPool, list[_Hop]],
    most: int,
) -> int:
    """Move as much as the path allows (at most `most`) along it; how much."""
    first, hops = path
    end = hops[-1][2] if hops else first
    amount = min(most, left[end], *(routes[other][pool] for other, pool, _to in hops))
    for other, pool, to in hops:
        drawn = routes[other]
        drawn[pool] -= amount
        drawn[to] = drawn.get(to, 0) + amount
    mine = routes[source]
    mine[first] = mine.get(first, 0) + amount
    left[end] -= amount
    return amount
