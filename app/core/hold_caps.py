"""An aged gang's hold on the room: every node capped at what the gang can never use there.

Room.hold_for (app/core/room.py) caps each node of the room at its remainder
for the gang (app/core/backfill.py). A hold is redone whenever the walk of
the line is redone from the aged gang (a claim came or went, a pod ended),
and at 5,000 nodes copying every bin to cap it held the event loop 20 ms:
a capped copy of a shared bin is kept per node (Remainders.capped) and
handed again while the same bin gets the same cap; the line's warm-up works
the copies out a slice at a time ahead of the hold (Caps.warm). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.core.backfill import Capped, Remainders, Shapes, resource_names
from app.core.packing import Bin
from app.core.resources import Resources, add


class Caps:
    """Room.hold_for's caps on every node (`nothing` is the cap of no room at all), the
    nodes promised held whole.

    A bin the room owns (its own copy) is capped in place. Any other bin is shared (the
    state's, or a kept walk's): it is replaced by a capped copy, the one `memo` kept when
    the same bin got the same cap before, and that copy is not the room's own (a later
    change copies it again), so what the memo hands out is never changed."""

    __slots__ = ("_caps", "_memo", "_nothing")

    def __init__(
        self, caps: Mapping[str, Resources | None], nothing: Resources, memo: dict[str, Capped]
    ) -> None:
        self._caps, self._nothing, self._memo = caps, nothing, memo

    @classmethod
    def of(cls, remainders: Remainders, shapes: Shapes, allocatable: Sequence[Bin]) -> Caps:
        """The caps a hold for a gang of `shapes` puts on the nodes of `allocatable`."""
        caps = remainders.of(shapes, allocatable)
        return cls(caps, dict.fromkeys(resource_names(shapes), 0), remainders.capped(shapes))

    def apply(
        self,
        bins: list[Bin],
        own: Mapping[str, Bin],
        promised: set[str],
        off: dict[str, Resources] | None,
    ) -> list[str]:
        """Cap `bins` in place (`own`: the room's own copies, by node; `promised`: the nodes
        held whole); the nodes where a cap held room back that no promise had. `off`: told
        what the caps took off each node."""
        held: list[str] = []
        for i, b in enumerate(bins):
            name = b.name
            cap = self._cap(name, promised)
            if cap is None:
                continue
            if own.get(name) is b:
                took = _cap_in_place(b.free, cap)
            else:
                known = self._kept(b, cap) or self._remember(b, cap)
                if known[0] is b:
                    bins[i], took = known[2], known[3]
                else:  # b is the capped copy already
                    took = None
            if took is None:
                continue
            if off is not None:  # (read, never changed: the memo's own may be handed)
                if name in off:
                    off[name] = {**off[name]}
                    add(off[name], took)
                else:
                    off[name] = took
            if name not in promised:  # there the gangs promised the room hold it (named as such)
                held.append(name)
        return held

    def warm(
        self, bins: Sequence[Bin], own: Mapping[str, Bin], promised: set[str], most: int
    ) -> bool:
        """Work out at most `most` capped copies apply() would make of `bins` and have the
        memo keep them; True: it has every one, or all but a few made now (the hold then
        costs a look per node and few copies: the slice that made `most` of them and the
        hold together held the event loop 30 ms at 5,000 nodes)."""
        made = 0
        for b in bins:
            name = b.name
            cap = self._cap(name, promised)
            if cap is None or own.get(name) is b or self._kept(b, cap) is not None:
                continue
            if made == most:
                return False
            self._remember(b, cap)
            made += 1
        return made <= most // 10

    def _cap(self, name: str, promised: set[str]) -> Resources | None:
        """The cap of node `name` (None: none: no member may go there, or fits there even
        empty)."""
        cap = self._caps.get(name, self._nothing)
        if cap is not None and name in promised:
            return self._nothing
        return cap

    def _kept(self, b: Bin, cap: Resources) -> Capped | None:
        """What the memo kept for the shared bin `b` at `cap`: made of `b`, or `b` is its
        capped copy already (then it takes nothing more: a walk in slices holds again over
        the room its last slice left). None: nothing kept for them."""
        known = self._memo.get(b.name)
        if (
            known is not None
            and (known[0] is b or known[2] is b)
            and (known[1] is cap or known[1] == cap)
        ):
            return known
        return None

    def _remember(self, b: Bin, cap: Resources) -> Capped:
        """`b` capped at `cap` (a copy, or `b` itself where the cap takes nothing), kept."""
        took = _took(b.free, cap)
        if took is None:
            known: Capped = (b, cap, b, None)
        else:
            free = dict(b.free)
            _cap_in_place(free, cap)
            known = (b, cap, b.with_free(free), took)
        self._memo[b.name] = known
        return known


def _took(free: Resources, cap: Resources) -> Resources | None:
    """What capping `free` at `cap` takes off, per resource (None: nothing)."""
    took = {r: f - c for r, c in cap.items() if (f := free.get(r, 0)) > c}
    return took or None


def _cap_in_place(free: dict[str, int], cap: Resources) -> Resources | None:
    """`free` capped at `cap`; what that took off (None: nothing)."""
    took = _took(free, cap)
    for r in took or ():
        c = cap[r]
        if c:
            free[r] = c
        else:
            free.pop(r, None)
    return took
