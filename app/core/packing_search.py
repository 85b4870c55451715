"""When first fit says no but the room is there in total: a bounded exhaustive search. Pure.

First-fit decreasing (app/core/packing.py) can say "no" for a gang an exhaustive
search would place, and it is not monotone: two nodes of 6 CPU / 4 GiB and
4 CPU / 4 GiB hold a gang of one 1 CPU / 4 GiB member and one 5 CPU / 1 GiB
member, yet first fit puts the first on the 6-CPU node and finds no home for
the second. On an empty cluster the answer never changes, so such a gang would
wait for good: a gang that could be placed left waiting. Where the decision is
the asking gang's own (app/core/contention.py), this search tries the other
placements before the answer is "no".

It is bounded, since it runs on the event loop: it gives up after
SEARCH_BUDGET bins looked at (a few milliseconds), answering as first fit did,
and leaves gangs of more than MAX_SEARCH_MEMBERS members to place to first fit.
Bins alike (same room, labels, taints and shared device pools) are tried once
per member, and
members alike go to bins in order, so the common cases (many identical nodes,
members of one shape) end long before the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.core.packing import AllowedBins, AllowedNodes, Bin, Demand, Packing, pack
from app.core.resources import Resources, fits, shortfall, subtract, total_of
from app.core.shared_pools import PoolDraws, Saved

# Bins looked at before the search gives up (about 1-2 us each).
SEARCH_BUDGET = 4000
# Gangs with more members to place are left to first fit: one level of the search a member.
MAX_SEARCH_MEMBERS = 64


def pack_thoroughly(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    need: int | None = None,
    *,
    allowed_nodes: AllowedNodes | None = None,
) -> Packing:
    """pack(), and where it fails though the room is there in total, the search below.

    The answer is first fit's when first fit places the gang, when too few
    members match any node, when the room is short in total, or when the search runs out
    of budget: so its "no" and its message are first fit's. `allowed_nodes`: as
    for pack() (first fit's only; the search reads the bins afresh).
    """
    first = pack(demands, bins, need, allowed_nodes=allowed_nodes)
    wanted = first.need
    # Members that match no node are out; the rest may still be enough (need < all).
    if first.fits or len(demands) - len(first.no_node) < wanted:
        return first
    if shortfall(_smallest_total(demands, wanted), total_of(b.free for b in bins)):
        return first
    plan = search(demands, bins, wanted)
    return first if plan is None else Packing(plan, wanted)


def _smallest_total(demands: Sequence[Demand], wanted: int) -> Resources:
    """A lower bound of what any `wanted` of the members ask together, per resource."""
    out: dict[str, int] = {}
    names = {name for d in demands for name in d.requests}
    for name in names:
        asks = sorted(d.requests.get(name, 0) for d in demands)
        out[name] = sum(asks[:wanted])
    return out


class _Trial:
    """The bins as the members placed so far left them: room, and shared pools drawn on."""

    __slots__ = ("_bins", "_draws", "_free", "_labels")

    def __init__(self, bins: Sequence[Bin]) -> None:
        self._bins = bins
        self._free: dict[int, Resources] = {}
        self._labels: dict[int, tuple[tuple[str, str], ...]] = {}
        self._draws = PoolDraws()  # what the members placed took of shared device pools

    def room(self, i: int) -> Resources:
        return self._free[i] if i in self._free else self._bins[i].free

    def fits(self, i: int, requests: Resources) -> bool:
        b = self._bins[i]
        return fits(requests, self.room(i)) and (not b.pools or self._draws.fits(i, b, requests))

    def signature(self, i: int) -> tuple[object, ...]:
        """Bins alike: a member tried on one needs no try on the other."""
        b = self._bins[i]
        if i not in self._labels:
            self._labels[i] = tuple(sorted(b.labels.items()))
        pools = self._draws.signature(i, b)
        return (tuple(sorted(self.room(i).items())), self._labels[i], b.taints, pools)

    def put(self, i: int, requests: Resources) -> tuple[Resources, Saved | None]:
        """Place `requests` on bin `i`; what undo() needs to take them off again."""
        b = self._bins[i]
        before = self.room(i)
        self._free[i] = after = dict(before)
        subtract(after, requests)
        saved = self._draws.save(i, b) if b.pools else None
        if saved is not None:
            self._draws.draw(i, b, requests)
        return before, saved

    def undo(self, i: int, token: tuple[Resources, Saved | None]) -> None:
        self._free[i], saved = token
        if saved is not None:
            self._draws.restore(saved)


def search(
    demands: Sequence[Demand], bins: Sequence[Bin], wanted: int, budget: int = SEARCH_BUDGET
) -> dict[str, str] | None:
    """A plan placing `wanted` of `demands` on `bins`, or None (none exists, or out of budget)."""
    if wanted > MAX_SEARCH_MEMBERS:
        return None
    largest = _largest(bins)
    order = sorted(demands, key=lambda d: (-sum(_shares(d.requests, largest)), d.key))
    allowed = {d.placement: AllowedBins(d.placement, bins) for d in order}
    trial = _Trial(bins)
    plan: dict[str, int] = {}
    spent = 0

    def place(k: int, placed: int, floor: int) -> bool:
        nonlocal spent
        if placed >= wanted:
            return True
        if len(order) - k < wanted - placed:
            return False
        demand = order[k]
        # Members alike go to bins in order: swapping two of them changes nothing.
        alike = k > 0 and _alike(order[k - 1], demand)
        tried: set[tuple[object, ...]] = set()
        start = floor if alike else 0  # (a position among the bins the placement allows)
        for position, i in enumerate(allowed[demand.placement].after(start), start):
            spent += 1
            if spent > budget:
                return False
            if not trial.fits(i, demand.requests):
                continue
            sig = trial.signature(i)
            if sig in tried:
                continue
            tried.add(sig)
            token = trial.put(i, demand.requests)
            plan[demand.key] = i
            if place(k + 1, placed + 1, position):
                return True
            del plan[demand.key]
            trial.undo(i, token)
            if spent > budget:
                return False
        # Or leave this member out, when fewer than all are wanted.
        return place(k + 1, placed, floor if alike else 0) if spent <= budget else False

    if not place(0, 0, 0):
        return None
    return {key: bins[i].name for key, i in plan.items()}


def _alike(a: Demand, b: Demand) -> bool:
    return a.requests == b.requests and a.placement == b.placement


def _largest(bins: Sequence[Bin]) -> dict[str, int]:
    """The largest free amount of each resource on any one bin."""
    largest: dict[str, int] = {}
    for b in bins:
        for name, amount in b.free.items():
            if amount > largest.get(name, 0):
                largest[name] = amount
    return largest


def _shares(requests: Mapping[str, int], largest: Mapping[str, int]) -> list[float]:
    """Each resource's ask as a share of the largest bin's: big, awkward members first."""
    return [
        amount / largest[name] if largest.get(name) else float(amount > 0)
        for name, amount in requests.items()
        if name != "pods"
    ]
