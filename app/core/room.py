"""The room one admission decision packs into: free capacity less promises, holds and shares.

app/core/contention.py walks the line over it: holders' promises come off
first, then each gang ahead that fits takes its share (set_aside), and each
aged gang ahead that does not fit caps every node at what it can never use
(hold_for, app/core/backfill.py). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from app.core.backfill import Remainders, Shapes
from app.core.hold_caps import Caps
from app.core.packing import AllowedNodes, Bin, Packing, give, pack, take
from app.core.packing_search import pack_thoroughly
from app.core.resources import Resources
from app.core.shared_pools import PoolShare, SharedPool, pool_shares

if TYPE_CHECKING:
    from app.core.contention import Gang, Holder


class Room:
    """What a decision packs into: free less the holders' promises, and the empty cluster.

    A free bin is copied when a promise or a gang set aside first changes it:
    most decisions change a few nodes of thousands, and the caller's `free`
    stays as it was. Every packing over the same bins allows the same nodes,
    so they share one memo of the nodes each demand allows (and so do those
    over `allocatable`).
    """

    __slots__ = (
        "_allocatable",
        "_copies",
        "_ever",
        "_failed",
        "_held",
        "_indexed",
        "_on_allocatable",
        "_on_bins",
        "_own",
        "_pools",
        "_position",
        "_promised",
        "_remainders",
        "_taken",
        "bins",
    )

    def __init__(
        self,
        free: Sequence[Bin],
        holders: Sequence[Holder],
        allocatable: Sequence[Bin],
        positions: Mapping[str, int] | None = None,
        remainders: Remainders | None = None,
    ) -> None:
        self.bins: Sequence[Bin] = free
        self._remainders = remainders if allocatable else None
        # Nodes where holders' promises or gangs set aside took room (not holds).
        self._promised: set[str] = set()
        # The plans of the gangs set aside, not yet in `_promised` (added when a hold needs them).
        self._taken: list[Iterable[str]] = []
        # With remainders, per (shapes, need): did not fit (the room only
        # shrinks while the line is walked), may fit the empty cluster; and per
        # shapes held: (promised nodes then, the nodes held back).
        self._failed: set[tuple[Shapes, int]] = set()
        self._ever: dict[tuple[Shapes, int], bool] = {}
        self._held: dict[Shapes, tuple[int, list[str]]] = {}
        # self.bins once one of them had to change, and the bins copied so far by node.
        self._own: list[Bin] | None = None
        self._copies: dict[str, Bin] = {}
        # Shared pools this room took gangs' draws from: its own copies, by name.
        self._pools: dict[str, SharedPool] = {}
        # Where each node is in `free`: the caller's, checked at each use, or
        # one built here from the bins themselves (then `_indexed`).
        self._position = positions
        self._indexed = False
        self._allocatable = allocatable
        self._on_bins: AllowedNodes = {}
        self._on_allocatable: AllowedNodes = {}
        for holder in holders:
            if not holder.remaining:  # every member placed: nothing left to promise
                continue
            promised = {n: {k: -v for k, v in r.items()} for n, r in holder.remaining.items()}
            give(self.bins, promised, index=self._copied(promised))
            self._promised.update(promised)

    def _copied(self, nodes: Iterable[str]) -> Mapping[str, Bin]:
        """The bins of `nodes` (and those copied before), ours to change, by node name."""
        own = self._own
        if own is None:
            own = self._own = list(self.bins)
            self.bins = own
        copies = self._copies
        for node in nodes:
            if node not in copies:
                i = self._index(own, node)
                if i is not None:
                    b = own[i]
                    own[i] = copies[node] = b.with_free(dict(b.free))
        return copies

    def _index(self, own: list[Bin], node: str) -> int | None:
        """Where `node` is in `own` (None: not there)."""
        positions = self._position
        if positions is not None:
            i = positions.get(node)
            if i is not None and i < len(own) and own[i].name == node:
                return i
            if self._indexed:
                return None
        # No positions given, or they do not know the node: index the bins once.
        self._position = {b.name: i for i, b in enumerate(own)}
        self._indexed = True
        return self._position.get(node)

    def pack(self, gang: Gang, *, thorough: bool = False) -> Packing:
        """The gang packed into this room. `thorough`: where first fit says no though the
        room is there in total, search the other placements (app/core/packing_search.py):
        for the gang being decided, whose "no" makes it wait; gangs ahead in line by first
        fit alone, not told why they do not fit (thousands of them, for one decision)."""
        if thorough:
            return pack_thoroughly(gang.demands, self.bins, gang.need, allowed_nodes=self._on_bins)
        if gang.packer is not None:  # a gang made of groups, ahead in line
            return gang.packer(gang, self.bins)
        return pack(gang.demands, self.bins, gang.need, allowed_nodes=self._on_bins, explain=False)

    def _shapes(self, gang: Gang) -> tuple[Shapes, int] | None:
        """The gang's member shapes and need: gangs alike fit alike (None: no memo)."""
        if self._remainders is None or gang.packer is not None:  # a tree fits as a tree
            return None
        return self._remainders.shapes(gang.demands), gang.need

    def set_aside(self, gang: Gang) -> bool:
        """The room the gang fits in is set aside for it; False: it does not fit."""
        return self.place(gang) is not None

    def place(self, gang: Gang) -> tuple[Packing, list[PoolShare]] | None:
        """set_aside(), with the packing and what it drew of the shared pools (None: no fit;
        a denied gang fits nowhere until its denial expires)."""
        if gang.denied:
            return None
        if self._failed:  # (most lines: every gang fits, and no shape is worked out)
            alike = self._shapes(gang)
            if alike is not None and alike in self._failed:
                return None
        packing = self.pack(gang)
        if packing.fits:
            return packing, self.take(gang, packing.plan)
        alike = self._shapes(gang)
        if alike is not None:
            self._failed.add(alike)
        return None

    def promise(self, nodes: Iterable[str]) -> None:
        """Room on `nodes` was promised before this room's bins were counted (a kept walk of
        the line going on from its middle): hold_for holds them whole, as the gangs' own."""
        self._taken.append(nodes)

    def take(self, gang: Gang, plan: Mapping[str, str]) -> list[PoolShare]:
        """The room of `plan` (a packing of `gang` over this room) is the gang's now, and so
        is what its members draw of the shared device pools (returned: none where no pool
        serves its nodes), which no one node's room holds."""
        copies = self._copied(plan.values())
        pooled = [b for node in set(plan.values()) if (b := copies.get(node)) and b.pools]
        shares: list[PoolShare] = []
        if pooled:  # drawn as its packing drew them, over the room it was packed into
            requests = {d.key: d.requests for d in gang.demands}
            shares = [s for drawn in pool_shares(requests, plan, pooled).values() for s in drawn]
        take(self.bins, plan, gang.demands, index=copies)
        if shares:
            self._charge(shares)
        if self._remainders is not None:
            self._taken.append(plan.values())
        return shares

    def _charge(self, shares: Iterable[PoolShare]) -> None:
        """The shared pools are short of `shares` (in this room's own copies of them): each
        share is counted on its node as a placed pod's (used_on), as take() took the
        member's whole requests off the node's room."""
        for name, node, amounts in shares:
            pool = self._pools.get(name) or self._own_pool(name)
            if pool is None:
                continue
            used = pool.used_on.setdefault(node, {})
            for resource, amount in amounts.items():
                pool.free[resource] = max(0, pool.free.get(resource, 0) - amount)
                used[resource] = used.get(resource, 0) + amount

    def _own_pool(self, name: str) -> SharedPool | None:
        """A copy of pool `name`, ours to change, in every bin it serves (None: no bin has it).
        The caller's pools (the state's, or another room's) stay as they were."""
        self._copied(())
        own = self._own
        assert own is not None
        source = next((p for b in own for p in b.pools if p.name == name), None)
        if source is None:
            return None
        copy = SharedPool(
            name, source.offer, dict(source.free), {n: dict(u) for n, u in source.used_on.items()}
        )
        self._pools[name] = copy
        for i, b in enumerate(own):
            if source in b.pools:
                own[i] = replace(b, pools=tuple(copy if p is source else p for p in b.pools))
                if b.name in self._copies:
                    self._copies[b.name] = own[i]
        return copy

    def may_ever_fit(self, gang: Gang) -> bool:
        """Would the gang fit in the empty cluster? (Yes when the empty cluster is not given.)"""
        if not self._allocatable:
            return True
        alike = self._shapes(gang)
        known = self._ever.get(alike) if alike is not None else None
        if known is None:
            # Thorough: an aged gang first fit cannot place even on the empty cluster
            # would otherwise be taken for one that never fits, and hold nothing back.
            known = pack_thoroughly(
                gang.demands, self._allocatable, gang.need, allowed_nodes=self._on_allocatable
            ).fits
            if alike is not None:
                self._ever[alike] = known
        return known

    def hold_for(self, gang: Gang, off: dict[str, Resources] | None = None) -> list[str] | None:
        """Cap every node at what `gang` can never use there; the nodes where that held room back.

        None: the remainders are not known, so it must hold everything (the
        caller stops the line). Nodes where promises or gangs set aside took
        room are held whole for the gang's resources: what lands there is not
        in the node's pods yet (app/core/backfill.py). `off`: told what the caps
        took off each node (a kept walk gives it back when it goes on from before).
        """
        if (remainders := self._remainders) is None:
            return None
        shapes = remainders.shapes(gang.demands)
        for nodes in self._taken:
            self._promised.update(nodes)
        self._taken.clear()
        done = self._held.get(shapes)
        if done is not None and done[0] == len(self._promised):
            return done[1]
        self._copied(())  # the bins list ours: capped bins go in it
        assert self._own is not None
        caps = Caps.of(remainders, shapes, self._allocatable)
        held = caps.apply(self._own, self._copies, self._promised, off)
        self._held[shapes] = (len(self._promised), held)
        return held

    def warm_hold(self, gang: Gang, most: int) -> bool:
        """Work out at most `most` of the capped bins hold_for(gang) would make now, kept for
        it (app/core/hold_caps.py); True: all are (its remainders must be: Remainders.warm)."""
        if (remainders := self._remainders) is None:
            return True
        caps = Caps.of(remainders, remainders.shapes(gang.demands), self._allocatable)
        return caps.warm(self.bins, self._copies, self._promised, most)

    def give_back(self, holder: Holder) -> None:
        """What the holder was promised and holds in the gate is free again."""
        self.free_up(holder.remaining)
        self.free_up(holder.reserved)

    def free_up(self, held: Mapping[str, Mapping[str, int]]) -> None:
        """Capacity held per node is free again (in this room's own copies of those bins).

        The packings' memo of full bins holds only while the room shrinks: a new one.
        """
        give(self.bins, held, index=self._copied(held))
        self._on_bins = {}
