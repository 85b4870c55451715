"""Backfill behind an aged gang: the capacity it can never use, per node. Pure.

An aged gang A that does not fit yet is not overtaken (app/core/contention.py,
"Aging"). Holding *everything* back for it idles the cluster: next to a
6-CPU pod on an 8-CPU node, 2 CPUs are free that no 6-CPU member of A will
ever use. The gangs behind A may take, on each node, only what A can never
use there, whatever of the node's pods leave first: the node's *remainder*
for A (`remainder()`).

The rule, and why A is never delayed by it. For a capacity c (per resource)
let usable(c) be, per resource, the most any set of A's members that fits
in c can ask for, and slack(c) = c - usable(c). Let O be the pods on a node
now (their requests) and alloc its allocatable. A gang behind A may add b
to the node only if, for every subset O' of O,

    b <= slack(alloc - sum(O'))                                          (*)

Invariant: for every subset O' of the pods present that were there
without backfill, every set S of A's members that fits alloc - sum(O') also
fits once the backfilled pods B are subtracted too. Adding b under (*)
(taking O' together with B, which are pods present too) keeps it: S fits
alloc - O' - B, so S <= usable(alloc - O' - B), so S + b <= alloc - O' - B.
Pods ending only shrink the subsets to consider. So on every node, each set
of A's members fits exactly when it would have fitted had nothing been
backfilled, and first fit, which asks only "does this member fit where the
members placed so far left room", packs A onto the same nodes at the same
moment as under the rule that admits nobody behind A: A's earliest start is
never later (tests/unit/test_backfill.py simulates it).

usable() is an over-estimate (each member shape counted as often as it fits
alone, capped by the capacity itself), which makes slack smaller: holding
more than needed is safe, never less. Nodes that none of A's members may go
to (nodeSelector, affinity, taints) or can fit even empty get no limit.
When a node's pods give more than `SUBSETS_LIMIT` distinct sums, its
remainder is nothing: A holds the whole node (as before backfill).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.packing import Bin, Demand
from app.core.placement import ANY_NODE, Placement
from app.core.resources import Resources

# (requests as sorted items, placement, how many members ask exactly that).
Shape = tuple[tuple[tuple[str, int], ...], Placement | None, int]
Shapes = tuple[Shape, ...]

SUBSETS_LIMIT = 512
"""Distinct sums of a node's pods looked at before holding the whole node."""

CAPPED_SHAPES = 16
"""Member shapes whose holds' capped bins are kept (Remainders.capped)."""


def shapes_of(demands: Sequence[Demand]) -> Shapes:
    """The member shapes of a gang, counted: gangs alike share one remainder per node."""
    counted: dict[tuple[tuple[tuple[str, int], ...], Placement | None], int] = {}
    for d in demands:
        key = (tuple(sorted(d.requests.items())), d.placement)
        counted[key] = counted.get(key, 0) + 1
    return tuple(sorted(((r, p, n) for (r, p), n in counted.items()), key=repr))


def resource_names(shapes: Shapes) -> list[str]:
    """The resources a gang of `shapes` asks for (the ones a remainder limits)."""
    return sorted({name for requests, _, _ in shapes for name, amount in requests if amount})


def remainder(node: Bin, present: Iterable[Mapping[str, int]], shapes: Shapes) -> Resources | None:
    """What gangs behind may add to `node` (its allocatable) without ever delaying the gang.

    Only the resources the gang asks for are limited; None: no limit at all
    (none of its members may go to the node or fits there even empty).
    `present`: the requests of the pods on the node that stay until they end.
    """
    allowed = tuple(
        s for s in shapes if (s[1] or ANY_NODE).allows(node.name, node.labels, node.taints)
    )
    names = resource_names(allowed)
    alloc = tuple(node.free.get(name, 0) for name in names)
    vectors = [
        (tuple(dict(requests).get(name, 0) for name in names), count)
        for requests, _, count in allowed
    ]
    if not any(_fits_times(alloc, shape) for shape, _ in vectors):
        return None
    sums = _subset_sums([tuple(p.get(name, 0) for name in names) for p in present], len(names))
    if sums is None:
        return dict.fromkeys(names, 0)
    least = list(alloc)
    for taken in sums:
        left = [a - t for a, t in zip(alloc, taken, strict=True)]
        usable = _usable(left, vectors)
        for i, (c, u) in enumerate(zip(left, usable, strict=True)):
            least[i] = min(least[i], c - u)
    return {name: max(0, amount) for name, amount in zip(names, least, strict=True)}


def _fits_times(capacity: Sequence[int], shape: Sequence[int]) -> int:
    """How many members of `shape` fit in `capacity` (alone)."""
    times: int | None = None
    for c, s in zip(capacity, shape, strict=True):
        if s > 0:
            n = max(0, c) // s
            times = n if times is None else min(times, n)
    return times if times is not None else 0


def _usable(capacity: Sequence[int], vectors: Sequence[tuple[tuple[int, ...], int]]) -> list[int]:
    """Per resource, at least the most any set of members fitting in `capacity` asks for."""
    usable = [0] * len(capacity)
    for shape, count in vectors:
        times = min(count, _fits_times(capacity, shape))
        if times:
            for i, s in enumerate(shape):
                usable[i] += times * s
    return [min(max(0, c), u) for c, u in zip(capacity, usable, strict=True)]


def _subset_sums(items: Sequence[tuple[int, ...]], width: int) -> set[tuple[int, ...]] | None:
    """Every distinct sum of a subset of `items`; None when there are too many to look at."""
    sums: set[tuple[int, ...]] = {(0,) * width}
    for item in items:
        if not any(item):
            continue
        sums |= {tuple(a + b for a, b in zip(s, item, strict=True)) for s in sums}
        if len(sums) > SUBSETS_LIMIT:
            return None
    return sums


_Sizes = tuple[tuple[tuple[str, int], ...], ...]

# What a hold made of one node's bin (Room.hold_for): the bin it capped, the cap, the
# capped bin (shared: read, never changed) and what the cap took off (None: nothing).
Capped = tuple[Bin, Resources, Bin, Resources | None]
_UNKNOWN = object()


@dataclass(slots=True)
class _Known:
    """Remainders.of()'s work for one gang shape: per node its allocatable bin, its pods'
    requests (sorted) and its remainder; each node's place in the allocatable bins; and the
    mapping handed out, as of change stamp `stamp`."""

    stamp: int
    by_node: dict[str, tuple[Bin, _Sizes, Resources | None]]
    index: dict[str, int]
    out: dict[str, Resources | None]


class Remainders:
    """remainder() per node for each gang shape, kept between calls, redone for changed nodes.

    The caller gives the pods that stay on a node (`present`, requests) and the
    node change log (`changed_since`, as ClusterState.nodes_changed_since):
    a node's pods or record changing touches it. A line of a thousand aged gangs
    of one shape costs one remainder per node, computed once.
    """

    def __init__(
        self,
        present: Callable[[str], Iterable[Mapping[str, int]]],
        changed_since: Callable[[int], tuple[int, list[str] | None]],
    ) -> None:
        self._present = present
        self._changed_since = changed_since
        # shapes -> what of() worked out for them, and as of which change stamp.
        self._known: dict[Shapes, _Known] = {}
        # (shapes, allocatable, pods' requests) -> the remainder (_worked_out).
        self._alike: dict[tuple[Shapes, tuple[tuple[str, int], ...], _Sizes], Any] = {}
        # shapes -> of()'s first call worked out a slice at a time (warm()), so far.
        self._building: dict[Shapes, _Known] = {}
        # id of a gang's demands -> (those demands, their shapes): the line keeps
        # its gangs between calls, and a thousand aged gangs are looked at per call.
        self._shapes: dict[int, tuple[Sequence[Demand], Shapes]] = {}
        self._interned: dict[Shapes, Shapes] = {}
        # shapes -> per node, what the last hold for gangs of those shapes made of its bin.
        self._capped: dict[Shapes, dict[str, Capped]] = {}

    def shapes(self, demands: Sequence[Demand]) -> Shapes:
        """shapes_of(demands), remembered while the line hands out the same demands; equal
        shapes are the very same object."""
        known = self._shapes.get(id(demands))
        if known is not None and known[0] is demands:
            return known[1]
        if len(self._shapes) > 20_000:
            self._shapes.clear()
            self._interned.clear()
        shapes = shapes_of(demands)
        # One object for equal shapes: gangs alike are told by `is` (line_pass.WalkPass).
        shapes = self._interned.setdefault(shapes, shapes)
        self._shapes[id(demands)] = (demands, shapes)
        return shapes

    def of(self, shapes: Shapes, allocatable: Sequence[Bin]) -> Mapping[str, Resources | None]:
        """Per node of `allocatable`, the remainder for a gang of `shapes` (see remainder()):
        the very mapping of the last call while no node changed (read it, never change it).

        `allocatable`: the state's, whose bins change only with a change the log has.
        A change to the nodes the log names costs those nodes alone, and a node whose
        pods are as large as before (a pod ended and one alike came) keeps its remainder
        (fifty such a call at 5,000 nodes, worked out again, were most of a fresh gang's
        admission behind a blocked line)."""
        known = self._known.get(shapes)
        stamp, changed = self._changed_since(known.stamp if known is not None else -1)
        if known is not None and changed is not None and len(known.out) == len(allocatable):
            if not changed:
                return known.out
            out = dict(known.out)  # the mapping handed out before stays as it was
            for name in set(changed):
                i = known.index.get(name)
                if i is None or allocatable[i].name != name:
                    break  # the nodes themselves moved: all of them, below
                out[name] = self._at(allocatable[i], shapes, known.by_node)
            else:
                self._known[shapes] = _Known(stamp, known.by_node, known.index, out)
                return out
        if len(self._known) > 64:
            self._known.clear()
        building = self._building.pop(shapes, None)  # its nodes are reused where alike
        by_node = known.by_node if known is not None else building.by_node if building else {}
        out = {b.name: self._at(b, shapes, by_node) for b in allocatable}
        index = {b.name: i for i, b in enumerate(allocatable)}
        self._known[shapes] = _Known(stamp, by_node, index, out)
        return out

    def ready(self, shapes: Shapes, allocatable: Sequence[Bin]) -> bool:
        """Would of() work out only the nodes changed since its last call, not every node?"""
        known = self._known.get(shapes)
        return (
            known is not None
            and len(known.out) == len(allocatable)
            and self._changed_since(known.stamp)[1] is not None
        )

    def warm(self, shapes: Shapes, allocatable: Sequence[Bin], most: int) -> bool:
        """Work out at most `most` more nodes of what of() would work out for every node, kept
        to go on with; True: of() has only the nodes changed since left (ready). The line's
        warm-up calls it a slice at a time: at 5,000 nodes of ten pods, every node's
        remainder at once held the event loop hundreds of milliseconds."""
        if self.ready(shapes, allocatable):
            return True
        building = self._building.get(shapes)
        if building is None:  # as of now: the nodes that change meanwhile are in the log
            # The nodes' entries of the last of() go on (a node alike keeps its remainder),
            # and the one replaced at the end frees little: 5,000 freed at once took 19 ms.
            known = self._known.get(shapes)
            by_node = known.by_node if known is not None else {}
            building = self._building[shapes] = _Known(self.stamp(), by_node, {}, {})
        done = len(building.out)
        for i in range(done, min(done + most, len(allocatable))):
            b = allocatable[i]
            building.out[b.name] = self._at(b, shapes, building.by_node)
            building.index[b.name] = i
        if len(building.out) < len(allocatable):
            return False
        del self._building[shapes]
        if len(building.out) == len(allocatable) and all(
            allocatable[i].name == name for name, i in building.index.items()
        ):
            self._known[shapes] = building
            return True
        return False  # the nodes moved meanwhile: again from the first

    def _at(
        self, node: Bin, shapes: Shapes, by_node: dict[str, tuple[Bin, _Sizes, Resources | None]]
    ) -> Resources | None:
        """remainder() for `node` (its allocatable), the one worked out before while the node
        and its pods' requests are alike."""
        present = list(self._present(node.name))
        sizes = tuple(sorted(tuple(sorted(p.items())) for p in present))
        entry = by_node.get(node.name)
        if entry is None or entry[1] != sizes or entry[0] != node:
            worked_out = self._worked_out(node, present, sizes, shapes)
            entry = by_node[node.name] = (node, sizes, worked_out)
        return entry[2]

    def _worked_out(
        self, node: Bin, present: list[Mapping[str, int]], sizes: _Sizes, shapes: Shapes
    ) -> Resources | None:
        """remainder(), or the one of a node alike: when no member shape has a node rule,
        only the node's allocatable and its pods' requests count (a cluster of thousands of
        nodes of a few kinds: a few remainders, not one per node; one was 0.1 ms)."""
        if any(placement is not None for _, placement, _ in shapes):
            return remainder(node, present, shapes)
        key = (shapes, tuple(sorted(node.free.items())), sizes)
        known = self._alike.get(key, _UNKNOWN)
        if known is _UNKNOWN:
            if len(self._alike) > 4096:
                self._alike.clear()
            known = self._alike[key] = remainder(node, present, shapes)
        return known if known is None else dict(known)

    def capped(self, shapes: Shapes) -> dict[str, Capped]:
        """Per node, what the last hold for a gang of `shapes` made of the bin it capped, kept
        across walks of the line: a walk redone from an aged gang (after a claim came or
        went, a pod ended) caps the same bins again, and copying 5,000 of them held the
        event loop 20 ms (Room.hold_for reuses a node's entry while its bin and cap are the
        same)."""
        memo = self._capped.get(shapes)
        if memo is None:
            # A copy of every node's bin per shapes: fewer kept than remainders (more aged
            # shapes than that in line make copies again, as before the memo).
            if len(self._capped) >= CAPPED_SHAPES:
                self._capped.clear()
            memo = self._capped[shapes] = {}
        return memo

    def stamp(self) -> int:
        """The node change log's stamp now (for changed_since() later)."""
        return self._changed_since(-1)[0]

    def changed_since(self, stamp: int) -> list[str] | None:
        """The nodes whose pods or record changed after `stamp` (None: too many, all)."""
        return self._changed_since(stamp)[1]
