"""Devices one pool offers many nodes, counted once however many bins show them. Pure.

A ResourceSlice with spec.nodeSelector or spec.allNodes publishes a pool a
pod on any of several nodes may take devices from, so every node it serves
offers the whole pool in its allocatable (app/core/devices/counting.py). A
packing that read each bin on its own would let a gang's members on two
nodes take the pool twice over. So a bin also names the shared pools that
serve it (`Bin.pools`, the same SharedPool object in each), and a packing
draws a member's devices first from what is the node's own and then from
its pools, each pool's free devices once for all the gang's members
(PoolDraws; which pool gives what is a flow, app/core/pool_flow.py). Bins
with no pools (node-local devices only) cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from app.core.pool_flow import FlowState, PoolFlow, Source
from app.core.resources import Resources, add

if TYPE_CHECKING:
    from app.core.packing import Bin

_NOTHING: Mapping[str, int] = {}

# What draw() on one bin may change: (bin index, its own devices left, the flow, members).
Saved = tuple[int, Resources | None, FlowState, int]


@dataclass(eq=False, slots=True)
class SharedPool:
    """One pool published for many nodes. Compared and hashed by identity: every bin it
    serves holds this one object (app/core/devices/shared.py keeps it up to date)."""

    name: str  # driver/pool
    # The device resources the pool offers: what each node it serves shows in full.
    offer: Resources = field(default_factory=dict)
    # offer less what allocated claims hold of it, whichever node their pods are on.
    free: Resources = field(default_factory=dict)
    # Node -> what the claims counted on pods placed there hold of the pool (the part
    # of the node's requested that came from the pool, not from its own devices).
    used_on: dict[str, Resources] = field(default_factory=dict)


class PoolDraws:
    """What one packing took from the shared pools, and from each pooled bin's own devices.

    A bin's own devices left are its free less what its pools offer it (plus what
    its placed pods hold of them): the devices only it may use. A member takes
    from those first, then from its bin's pools; which pool gives what is a flow
    over all the members drawn (app/core/pool_flow.py), so a member is refused
    only when no assignment of every member's devices to the pools exists. The
    pools' free devices are drawn once for the whole packing.
    """

    __slots__ = ("_flow", "_local", "_members")

    def __init__(self) -> None:
        # Bin index -> its own devices left, per resource its pools offer.
        self._local: dict[int, Resources] = {}
        self._flow = PoolFlow()
        # Each member drawn with a key: (key, node, source, what it drew of the pools).
        self._members: list[tuple[str, str, Source, Resources]] = []

    def local(self, i: int, b: Bin) -> Resources:
        """Bin `i`'s own devices left (`b`: the bin as the packing was given it)."""
        local = self._local.get(i)
        if local is None:
            shown: Resources = {}
            for pool in b.pools:
                used = pool.used_on.get(b.name, _NOTHING)
                for resource, amount in pool.offer.items():
                    shown[resource] = shown.get(resource, 0) + amount - used.get(resource, 0)
            local = self._local[i] = {
                r: max(0, b.free.get(r, 0) - amount) for r, amount in shown.items()
            }
        return local

    def left(self, pool: SharedPool, resource: str) -> int:
        """What the pool has left of `resource` for this packing, as drawn so far (the flow
        may still move draws between pools to make room: fits() says what fits)."""
        return self._flow.left(pool, resource)

    def fits(self, i: int, b: Bin, requests: Mapping[str, int]) -> bool:
        """Whether the devices of `requests` beyond bin `i`'s own can come from its pools."""
        local = self.local(i, b)
        for resource, amount in requests.items():
            own = local.get(resource)
            if (
                own is not None
                and amount > own
                and not self._flow.room_for(b.pools, resource, amount - own)
            ):
                return False
        return True

    def draw(self, i: int, b: Bin, requests: Mapping[str, int], key: str = "") -> Resources:
        """Take `requests`: own devices first, then the pools (as much as they have left
        when fits() said no). What could not be drawn, per resource (empty: all was).
        `key`: the member's, for shares()."""
        local = self.local(i, b)
        drew: Resources = {}
        missing: Resources = {}
        for resource, amount in requests.items():
            own = local.get(resource)
            if own is None:
                continue
            mine = min(amount, own)
            local[resource] = own - mine
            rest = amount - mine
            if rest > 0:
                got = self._flow.route(b.pools, resource, rest)
                drew[resource] = got
                if got < rest:
                    missing[resource] = rest - got
        if key and drew:
            self._members.append((key, b.name, b.pools, drew))
        return missing

    def shares(self) -> dict[str, list[PoolShare]]:
        """What each member drawn with a key takes of each pool: the flow's draws of its
        node's source, shared out among that source's members in the order drawn."""
        shares: dict[str, dict[str, Resources]] = {}
        for resource in {r for *_, drew in self._members for r in drew}:
            routes = {s: dict(drawn) for s, drawn in self._flow.routes(resource).items()}
            for key, _node, source, drew in self._members:
                want = drew.get(resource, 0)
                for pool, amount in routes.get(source, {}).items():
                    got = min(want, amount)
                    if got > 0:
                        routes[source][pool] -= got
                        want -= got
                        by_pool = shares.setdefault(key, {}).setdefault(pool.name, {})
                        by_pool[resource] = by_pool.get(resource, 0) + got
        nodes = {key: node for key, node, *_ in self._members}
        return {
            key: [(name, nodes[key], amounts) for name, amounts in by_pool.items()]
            for key, by_pool in shares.items()
        }

    def counted_once(self, bins: Sequence[Bin], free: Sequence[Mapping[str, int]]) -> Resources:
        """The total of `free` (each bin's, as the packing left it) with every shared pool
        counted once: a pooled bin gives its own devices left, each pool what it has left."""
        total: Resources = {}
        pools: dict[SharedPool, None] = {}
        for i, (b, left) in enumerate(zip(bins, free, strict=True)):
            if not b.pools:
                add(total, left)
                continue
            local = self.local(i, b)
            add(total, {r: v for r, v in left.items() if r not in local})
            add(total, local)
            pools.update(dict.fromkeys(b.pools))
        for pool in pools:
            add(total, {r: self.left(pool, r) for r in pool.offer})
        return total

    def room(self, i: int, b: Bin, free: Mapping[str, int]) -> Resources:
        """Bin `i`'s `free` with each pooled resource at most its own devices left and
        what its pools have left (for a message: what a member there may still take)."""
        local = self.local(i, b)
        room = dict(free)
        for resource, own in local.items():
            shared = sum(self.left(p, resource) for p in b.pools)
            room[resource] = min(room.get(resource, 0), own + shared)
        return room

    def save(self, i: int, b: Bin) -> Saved:
        """What draw() on bin `i` may change, to put back with restore() (the search): its
        own devices left, and the flow (a draw may move other members' draws)."""
        local = self._local.get(i)
        return i, None if local is None else dict(local), self._flow.snapshot(), len(self._members)

    def restore(self, saved: Saved) -> None:
        i, local, flow, members = saved
        if local is None:
            self._local.pop(i, None)
        else:
            self._local[i] = local
        self._flow.restore(flow)
        del self._members[members:]

    def signature(self, i: int, b: Bin) -> tuple[object, ...]:
        """What makes two pooled bins alike for the search: the pools, and own devices left."""
        if not b.pools:
            return ()
        return (tuple(map(id, b.pools)), tuple(sorted(self.local(i, b).items())))


@dataclass(frozen=True, slots=True)
class PoolHold:
    """What one allocated claim holds of one shared pool, and the pods that use it.

    Evicting pods gives the pool these devices back only once every pod using
    the claim is gone (a claim shared by several pods is freed by the last of
    them, and counted once); `node` is where the pool's used_on counts it (the
    node of the pod its devices are counted on, "" if that pod is not placed).
    """

    pool: SharedPool
    held: Resources
    users: frozenset[str]  # pod keys
    node: str = ""


def freed_by(holds: Iterable[PoolHold], gone: Set[str]) -> list[PoolHold]:
    """The holds every user of which is in `gone` (pod keys): what their going frees."""
    return [h for h in holds if h.users and h.users <= gone]


def credited(bins: Sequence[Bin], freed: Iterable[PoolHold]) -> list[Bin]:
    """The bins with each shared pool given back the devices `freed` hold.

    The pools are shared objects (every bin of the nodes a pool serves holds
    the same one, kept by app/core/devices/shared.py): those `freed` touches
    are copied, and the bins that carry them are new bins carrying the copies
    (their `free` dicts shared with `bins`'s); the others are `bins`'s own.
    A node's own devices are read as its free less what its pools show it
    (PoolDraws.local), so the pod's part of the pool also leaves its node's
    used_on: the node's bin, given the pod's requests back, then shows its own
    devices unchanged.
    """
    copies: dict[SharedPool, SharedPool] = {}
    for hold in freed:
        pool = _copy(copies, hold.pool)
        for resource, amount in hold.held.items():
            pool.free[resource] = min(
                pool.offer.get(resource, 0), pool.free.get(resource, 0) + amount
            )
        used = pool.used_on.get(hold.node)
        if used is not None:
            for resource, amount in hold.held.items():
                if resource in used:
                    used[resource] = max(0, used[resource] - amount)
    return _with_copies(bins, copies)


def charged(bins: Sequence[Bin], draws: Iterable[PoolShare]) -> list[Bin]:
    """The bins with each shared pool short of what `draws` take of it, as credited() gives
    back (copies of the pools touched). Each draw is counted on its node as a placed pod's
    would be (used_on): the caller takes the member's whole requests off the node's room,
    so the node's own devices read as they are."""
    copies: dict[SharedPool, SharedPool] = {}
    by_name = {p.name: p for b in bins for p in b.pools}
    for name, node, amounts in draws:
        source = by_name.get(name)
        if source is None:
            continue
        pool = _copy(copies, source)
        used = pool.used_on.setdefault(node, {})
        for resource, amount in amounts.items():
            pool.free[resource] = max(0, pool.free.get(resource, 0) - amount)
            used[resource] = used.get(resource, 0) + amount
    return _with_copies(bins, copies)


def _copy(copies: dict[SharedPool, SharedPool], source: SharedPool) -> SharedPool:
    """`source`'s copy in `copies`, made on first use (its free and used_on its own)."""
    pool = copies.get(source)
    if pool is None:
        pool = copies[source] = SharedPool(
            source.name,
            source.offer,
            dict(source.free),
            {node: dict(used) for node, used in source.used_on.items()},
        )
    return pool


def _with_copies(bins: Sequence[Bin], copies: Mapping[SharedPool, SharedPool]) -> list[Bin]:
    """`bins`, those carrying a copied pool made anew with the copies."""
    if not copies:
        return list(bins)
    return [
        b
        if not any(p in copies for p in b.pools)
        else replace(b, pools=tuple(copies.get(p, p) for p in b.pools))
        for b in bins
    ]


# What a gang admitted but not placed yet was promised of one shared pool: (the pool's
# name, driver/pool; the node its member goes to; the devices), per member.
PoolShare = tuple[str, str, Resources]


def pool_shares(
    requests: Mapping[str, Mapping[str, int]], plan: Mapping[str, str], bins: Sequence[Bin]
) -> dict[str, list[PoolShare]]:
    """What each member of `plan` (member key -> node) takes of the shared pools, drawn as
    the packing drew it (its node's own devices first, then the pools, as a flow) over
    `bins`, the room the gang was admitted into. Members on nodes no pool serves: none."""
    index = {b.name: i for i, b in enumerate(bins)}
    draws = PoolDraws()
    for key, node in plan.items():
        i = index.get(node)
        if i is not None and bins[i].pools:
            draws.draw(i, bins[i], requests.get(key, _NOTHING), key)
    return draws.shares()
