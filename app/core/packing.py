"""Whole-gang feasibility: can every member a gang still needs be placed at once?

A gang whose members are reserved one by one discovers only at the end
that the last ones do not fit, after holding part of the cluster for the
whole gate wait (and keeping other gangs out). This module answers the
question before the first reservation, with a first-fit-decreasing packing
of the members' requests onto each node's free capacity, honouring what
decides where a pod may go in kube-scheduler's own filters
(app/core/placement.py) and pods per node (the "pods" resource every
request carries). FFD is a heuristic: it can say "no" for a set that an
exhaustive search would place, but what it places is a real placement, so
a "yes" is never wrong. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from app.core.placement import ANY_NODE, Placement, Taint
from app.core.resources import (
    Resources,
    add,
    fits,
    format_resources,
    shortfall,
    subtract,
    total_of,
)
from app.core.shared_pools import PoolDraws, SharedPool


@dataclass(frozen=True, slots=True)
class Demand:
    """One member still to be placed."""

    key: str
    requests: Resources
    placement: Placement | None = None


@dataclass(slots=True)
class Bin:
    """A node with what is left on it for this gang."""

    name: str
    free: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    # Device pools published for many nodes that this node may use: `free` shows each
    # in full, a packing draws on each once for all its bins (app/core/shared_pools.py).
    pools: tuple[SharedPool, ...] = ()

    def with_free(self, free: Resources) -> Bin:
        """This node's bin with `free` (a copy to change: its labels, taints, pools kept)."""
        return Bin(self.name, free, self.labels, self.taints, self.pools)


@dataclass(frozen=True, slots=True)
class Packing:
    # member key -> node, for the members placed.
    plan: dict[str, str]
    need: int
    # Members left over, and why the first of them fit nowhere.
    unplaced: tuple[str, ...] = ()
    shortfall: Resources = field(default_factory=dict)
    no_node: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return len(self.plan) >= self.need

    def describe(self, group_key: str, demands: Sequence[Demand]) -> str:
        """Why the gang does not fit, for its members' FailedScheduling events."""
        need_total = total_of(d.requests for d in demands)
        text = (
            f"gang {group_key} needs {self.need} more member(s) placed at once "
            f"({format_resources(_visible(need_total))} in all) but only {len(self.plan)} fit "
            "in the free capacity (nodes' allocatable minus bound pods and members other "
            "gangs hold)"
        )
        if self.no_node:
            text += (
                f"; {', '.join(self.no_node[:5])} match no schedulable node "
                "(nodeSelector, node affinity or taints)"
            )
        elif self.shortfall:
            text += f"; short by {format_resources(_visible(self.shortfall))}"
        return text


class AllowedBins:
    """The indexes of the bins one placement allows, in order, found only as far as read.

    First fit stops at the first node with room, usually one of the first: finding
    all 5,000 up front was most of a fresh gang's filter. (Untainted nodes pass unasked.)
    """

    __slots__ = ("_bins", "_found", "_rules", "_scanned", "_untainted_pass", "full")

    def __init__(self, placement: Placement | None, bins: Sequence[Bin]) -> None:
        self._rules = rules = placement or ANY_NODE
        self._untainted_pass = not (rules.node_selector or rules.terms)
        self._bins = bins
        self._found: list[int] = []
        self._scanned = 0
        # Per member shape (its requests' items): how many of the bins found, from the
        # first, have no room for it (AllowedNodes says why that lasts).
        self.full: dict[tuple[tuple[str, int], ...], int] = {}

    def __iter__(self) -> Iterator[int]:
        return self.after(0)

    def after(self, start: int) -> Iterator[int]:
        """The indexes from the `start`-th allowed bin on."""
        found = self._found
        # Those found already, at C speed, and any found meanwhile (a search nested in
        # this iteration reads on): a list iterator sees what is appended while it runs,
        # a slice would not, and the bins found meanwhile would be skipped.
        yield from itertools.islice(found, start, None)
        k = max(start, len(found))
        while k < len(found) or self._find_next():
            if k < len(found):  # (else read on to the `start`-th)
                yield found[k]
                k += 1

    def __bool__(self) -> bool:
        return bool(self._found) or self._find_next()

    def _find_next(self) -> bool:
        """Read bins until one more is allowed; False once none is left."""
        bins, rules, untainted_pass = self._bins, self._rules, self._untainted_pass
        for i in range(self._scanned, len(bins)):
            b = bins[i]
            if (untainted_pass and not b.taints) or rules.allows(b.name, b.labels, b.taints):
                self._found.append(i)
                self._scanned = i + 1
                return True
        self._scanned = len(bins)
        return False


AllowedNodes = dict[Placement | None, AllowedBins]
"""Per placement rule, the bins it allows: shared by packings over one bin list.

Also where first fit may start for a member shape: the bins before it had no room
for it. Share one only while the bins' free capacity only shrinks (a caller that
gives capacity back starts a new one): a bin full for a shape stays full then.
"""


def pack(
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    need: int | None = None,
    *,
    allowed_nodes: AllowedNodes | None = None,
    explain: bool = True,
) -> Packing:
    """First-fit decreasing: largest members first, each on the first node with room.

    Stops once `need` members are placed (default: all). `bins` are not
    modified. Members are ordered by their dominant share of the total free
    capacity, so "largest" means largest where the cluster is tightest.

    The contention line packs gang after gang for one admission, so this
    does no per-node work it can avoid: a node's free capacity is copied only
    when a member lands on it, and members that all ask alike are ordered by
    name without summing the cluster's capacity. `allowed_nodes`: one dict
    for every packing over the same `bins` (same nodes, labels and taints),
    so the line's gangs, which share the placement "any node", share what
    was found of it (anew for each of 1,000 gangs at 5,000 nodes: seconds).
    `explain=False`: no `shortfall` when it does not fit (it reads every node; the
    gangs ahead in line are asked only whether they fit).
    """
    wanted = len(demands) if need is None else min(need, len(demands))
    if wanted <= 0:
        return Packing({}, 0)
    order = _largest_first(demands, bins)
    # Bin index -> what is left on it once members landed there (the rest: bin.free).
    landed: dict[int, Resources] = {}
    allowed_by_rules: AllowedNodes = {} if allowed_nodes is None else allowed_nodes
    plan: dict[str, str] = {}
    left: list[Demand] = []
    no_node: list[str] = []
    draws = PoolDraws()
    for demand in order:
        if len(plan) >= wanted:
            break
        allowed = allowed_by_rules.get(demand.placement)
        if allowed is None:
            allowed = allowed_by_rules[demand.placement] = AllowedBins(demand.placement, bins)
        if not allowed:
            no_node.append(demand.key)
            left.append(demand)
            continue
        target = _first_with_room(allowed, demand.requests, bins, landed, draws)
        if target is None:
            left.append(demand)
            continue
        free = landed.get(target)
        if free is None:
            free = landed[target] = dict(bins[target].free)
        subtract(free, demand.requests)
        if bins[target].pools:
            draws.draw(target, bins[target], demand.requests)
        plan[demand.key] = bins[target].name
    short = left[: wanted - len(plan)] if len(plan) < wanted else []
    gap = _gap(short, bins, landed, draws) if short and explain else {}
    return Packing(plan, wanted, tuple(d.key for d in left), gap, tuple(no_node))


def _first_with_room(
    allowed: AllowedBins,
    requests: Resources,
    bins: Sequence[Bin],
    landed: Mapping[int, Resources],
    draws: PoolDraws,
) -> int | None:
    """The first allowed bin with room for `requests`, as the members placed so far left it.

    Starts past the bins known full for this shape, and notes how far they now go:
    a line of thousands of gangs alike fills the nodes from the first, and each
    packing read every full node again (most of a fresh admission's time).
    Bins full only as this packing's members left them (`landed`, and what they drew
    from shared pools: `draws`) are not noted: the packing may be dropped.
    """
    shape = tuple(requests.items())
    full = allowed.full
    # The bins before `known_full` have no room for the shape; `k`: the bin read now.
    known_full = k = full.get(shape, 0)
    for i in allowed.after(known_full):
        free = landed.get(i)
        b = bins[i]
        if fits(requests, b.free if free is None else free) and (
            not b.pools or draws.fits(i, b, requests)
        ):
            full[shape] = known_full
            return i
        if k == known_full and ((free is None and not b.pools) or not fits(requests, b.free)):
            known_full += 1
        k += 1
    full[shape] = known_full
    return None


def _gap(
    left: Sequence[Demand], bins: Sequence[Bin], landed: Mapping[int, Resources], draws: PoolDraws
) -> Resources:
    """What the members `left` to place lack: in the aggregate, else the first one's need.

    With shared device pools, each pool counts once in the aggregate, and the first
    member's need is read on the nodes it may go to, each at its own devices and what
    its pools have left (their offer shows on every node they serve).
    """
    after = [b.with_free(landed[i]) if i in landed else b for i, b in enumerate(bins)]
    if not any(b.pools for b in bins):
        gap = shortfall(total_of(d.requests for d in left), total_of(b.free for b in after))
        # Enough in total but fragmented: name the first member's need.
        return gap or _largest_gap(left[0].requests, after)
    total = draws.counted_once(bins, [b.free for b in after])
    gap = shortfall(total_of(d.requests for d in left), total)
    if gap:
        return gap
    rules = left[0].placement or ANY_NODE
    allowed = [
        b.with_free(draws.room(i, b, b.free)) if b.pools else b
        for i, b in enumerate(after)
        if rules.allows(b.name, b.labels, b.taints)
    ]
    return _largest_gap(left[0].requests, allowed or after)


def _largest_first(demands: Sequence[Demand], bins: Sequence[Bin]) -> list[Demand]:
    """The members by dominant share of the cluster's free capacity, largest first, then name."""
    first = demands[0].requests
    if all(d.requests == first for d in demands):
        return sorted(demands, key=lambda d: d.key)  # equal shares: the name decides
    total = total_of(b.free for b in bins)
    return sorted(demands, key=lambda d: (-_dominant_share(d.requests, total), d.key))


def _dominant_share(requests: Mapping[str, int], total: Mapping[str, int]) -> float:
    shares = [
        amount / total[name] if total.get(name) else float(amount > 0)
        for name, amount in requests.items()
        if name != "pods"
    ]
    return max(shares, default=0.0)


def _largest_gap(requests: Mapping[str, int], bins: Sequence[Bin]) -> Resources:
    best: Resources | None = None
    for b in bins:
        gap = shortfall(requests, b.free)
        if best is None or sum(gap.values()) < sum(best.values()):
            best = gap
    return best or dict(requests)


def _visible(resources: Mapping[str, int]) -> Resources:
    """Pods slots count in the packing but read oddly in a message unless short."""
    return {k: v for k, v in resources.items() if v}


def index_of(bins: Sequence[Bin]) -> dict[str, Bin]:
    """`bins` by node name, for callers that give or take many times over the same bins."""
    return {b.name: b for b in bins}


def take(
    bins: Sequence[Bin],
    plan: Mapping[str, str],
    demands: Sequence[Demand],
    *,
    index: Mapping[str, Bin] | None = None,
) -> None:
    """Subtract a plan's members from `bins` in place (capacity promised to that gang).

    index: index_of(bins), when the caller has it.
    """
    by_name = index if index is not None else index_of(bins)
    by_key = {d.key: d for d in demands}
    for key, node in plan.items():
        target = by_name.get(node)
        demand = by_key.get(key)
        if target is not None and demand is not None:
            subtract(target.free, demand.requests)


def give(
    bins: Sequence[Bin],
    held: Mapping[str, Mapping[str, int]],
    *,
    index: Mapping[str, Bin] | None = None,
) -> None:
    """Add capacity back to `bins` in place (a released gang's holdings, per node).

    index: index_of(bins), when the caller has it.
    """
    by_name = index if index is not None else index_of(bins)
    for node, amount in held.items():
        target = by_name.get(node)
        if target is not None:
            add(target.free, amount)
