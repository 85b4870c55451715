"""The line's walk, kept between decisions and redone only from the first gang a change reaches.

A fresh gang's admission weighs every gang ahead of it: each that fits has
its room set aside first (backfill, app/core/contention.py), one first fit
per gang, so with 10,000 gangs in line a fresh admission took hundreds of
milliseconds while the answer for the gangs ahead had not changed. Here the
walk of the whole line is kept: per gang its plan and its reach (the last
node, in the free bins' order, its first fit read: nodes after it played no
part in where it went). Between two decisions:

- the line is ordered again; the gangs from the first that differs are
  walked again;
- the free bins that changed (the state hands out new bins for a node that
  changed, so a bin that is not the same object changed) reach every gang
  whose reach is at or past them: the walk is redone from the first such
  gang, over the room left by the gangs before it (their plans are on nodes
  before the change, so they are what they were);
- a claim that came or went (other holders than last time) changes the room
  on the nodes it was promised: as a changed free bin there.

- a node whose remainder for an aged gang that held room back changed (its
  pods did, though its free room may be alike: app/core/backfill.py) is a
  changed free bin there.

A gang that does not fit takes nothing and reaches every node (more room
anywhere may take it next time). An aged one that does not fit holds what
it can use on every node (Room.hold_for) and the walk goes on behind it:
what each hold took off is kept, to give back when the walk is redone from
before it. Only without the remainders (the nodes' pods not known: it holds
everything) does the walk stop there and the decision walk the line itself.
The walk itself, and what is kept of it: app/runtime/line_pass.py.
"""

from __future__ import annotations

import itertools
import sys
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from app.core.contention import Ahead, Gang, Walked, line_key, order_line
from app.core.line_order import next_to_age, order_steps
from app.core.packing import Bin
from app.core.resources import add
from app.core.room import Room
from app.core.shared_pools import PoolShare, charged
from app.runtime.line_pass import AlikeRuns, KeptWalk, LineAt, WalkPass


@dataclass(frozen=True, slots=True)
class _Ordered:
    """A line as last ordered, and from when to when that order holds."""

    line: Sequence[Gang]
    aging: float
    # Ordered at this time; valid later while `next_aged` (None: no gang can age) is not aged.
    now: float
    order: list[Gang]
    next_aged: Gang | None


class LineWalk:
    """The walk of the whole line, kept between decisions (see the module docstring)."""

    def __init__(self) -> None:
        self._walk: KeptWalk | None = None
        # How many gangs the last update walked again (tests, bench).
        self.walked_again = 0
        # The last line ordered: a warm-up's slices and the admissions between two changes
        # of the line hand the same line again and again, and ordering 10,000 gangs each
        # time cost more than the walk (see _order).
        self._ordered: _Ordered | None = None
        # Where the runs of alike aged gangs in the kept order end (line_pass.AlikeRuns).
        self._runs = AlikeRuns()
        # The last order walked, and each gang's place in it (_places).
        self._keys: tuple[Sequence[Gang], dict[str, int]] | None = None

    @property
    def length(self) -> int:
        """How many gangs the kept walk has walked (0: none kept)."""
        return len(self._walk.order) if self._walk is not None else 0

    def walked(self, over: LineAt) -> Walked | None:
        """The room after every gang of the line that fits set aside (None: an aged one does
        not fit and the remainders are not known)."""
        return self._walked(over, sys.maxsize)[0]

    def walked_for(self, over: LineAt, candidate: Gang) -> Walked | None:
        """walked(), the line walked only as far as `candidate` would stand in it: the gangs
        behind it play no part in its decision (a gang in line weighed again walked the
        gangs behind it too, all of them after each claim that came or went)."""
        order = self._order(over.line, over.now, over.aging_seconds)
        mine = line_key(candidate, over.now, over.aging_seconds)
        key = partial(line_key, now=over.now, aging_seconds=over.aging_seconds)
        return self._walked(over, sys.maxsize, bisect_left(order, mine, key=key))[0]

    def warm(self, over: LineAt, most: int) -> bool:
        """Walk at most `most` more gangs of the line and keep the walk (the next decision
        goes on from it); True: nothing is left to walk (the whole line, or up to an aged
        gang that does not fit). A warm-up calls it a slice at a time, the event loop free
        between: the first decision after a start, a relist or a node change walked the
        whole line at once (10,000 gangs: a third of a second and more)."""
        return self._walked(over, most)[1]

    def _walked(
        self, over: LineAt, most: int, upto: int = sys.maxsize
    ) -> tuple[Walked | None, bool]:
        """walked(), stopping after `most` gangs walked again, or at the gang at place `upto`;
        and whether it went to the end."""
        order = self._order(over.line, over.now, over.aging_seconds)
        walk = self._walk
        changed = _changed(walk, over) if walk is not None else None
        start = _before_aged(walk, order, self._redo_from(walk, order, changed), over)
        bins = self._room_before(walk, start, over, changed or [])
        kept = walk if walk is not None and start > 0 else None
        remainders = over.remainders
        step = WalkPass(
            Room(bins, (), over.allocatable, over.positions, remainders),
            over,
            KeptWalk(
                over.free,
                over.holders,
                [],
                kept.plans[:start] if kept is not None else [],
                kept.reach[:start] if kept is not None else [],
                [],
                order,
                kept.ages[:start] if kept is not None else [],
                over.aging_seconds,
                kept.shares[:start] if kept is not None else [],
                kept.aged[:start] if kept is not None else [],
                kept.off[:start] if kept is not None else [],
                kept.picks[:start] if kept is not None else [],
                kept.first if kept is not None and kept.first < start else sys.maxsize,
                remainders.stamp() if remainders is not None else -1,
                dict(kept.caps) if kept is not None else {},
            ),
            self._runs,
        )
        limit = min(upto, len(order))
        whole, finished = step.walk(
            order, start, min(most, max(0, limit - start)), sliced=most != sys.maxsize
        )
        self.walked_again = len(step.done.plans) - start
        self._walk = done = step.finish(order)
        if not whole:
            return None, finished
        return self._handed(done, over), len(done.order) == len(order)

    def _handed(self, done: KeptWalk, over: LineAt) -> Walked:
        """The walk as a decision reads it: the room after the whole line, and the room
        before any place in it (Walked.room_for: a gang in line weighed again)."""

        def ahead(place: int, key: str) -> Ahead | None:
            at = self._places(done.source).get(key)
            if place > len(done.order) or (at is not None and at < place):
                # Not walked that far; or in line ahead of where it stands: it would weigh itself.
                return None
            picked = done.picks[place - 1] if place else None
            if place == len(done.order):  # behind them all: the room after the whole line
                return Ahead(done.bins, _blocker(done, place), picked)
            before = self._room_before(done, place, over, [])
            return Ahead(before, _blocker(done, place), picked)

        order = done.source  # the whole line's order: the walk may have stopped short of it
        last = order[-1] if order else None
        return Walked(over.line, over.free, over.holders, last, done.bins, order, ahead)

    def _places(self, order: Sequence[Gang]) -> Mapping[str, int]:
        """Each gang's place in `order` (by key), kept while that very order is walked."""
        kept = self._keys
        if kept is None or kept[0] is not order:
            kept = self._keys = (order, {g.key: i for i, g in enumerate(order)})
        return kept[1]

    def wake_steps(self, over: LineAt, limit: int, most: int) -> Iterator[list[str] | None]:
        """line_look.wake_steps() from the kept walk: the first `limit` gangs of the line that
        fit now, in line order (the line's look wakes them), the walk brought up to date
        `most` gangs a slice, yielding None between slices (`over` stays as it was). The
        look came after every join, bind and pod gone, and walked the whole line itself."""
        yield from self.order_ahead(over, most)
        while not self.warm(over, most):
            yield None
        walk = self._walk
        assert walk is not None
        fits = (g.key for g, plan in zip(walk.order, walk.plans, strict=True) if plan)
        yield list(itertools.islice(fits, limit))

    def order_ahead(self, over: LineAt, most: int) -> Iterator[None]:
        """Order `over.line` as the next walk of it will (order_line), `most` gangs a slice,
        yielding between slices; kept as _order() keeps it, so a walk over this very line
        at this moment orders nothing (10,000 gangs sorted at once were 15 ms of the event
        loop in the warm-up's first walk slice). Nothing to do when it is kept already."""
        line, now, aging_seconds = over.line, over.now, over.aging_seconds
        if self._kept_order(line, now, aging_seconds) is not None:
            return
        order: list[Gang] = []
        for step in order_steps(line, now, aging_seconds, most):
            if step is None:
                yield None
            else:
                order = step
        next_aged = None
        for start in range(0, len(line), most):
            next_aged = next_to_age(line[start : start + most], now, aging_seconds, next_aged)
            yield None
        self._ordered = _Ordered(line, aging_seconds, now, order, next_aged)

    def _order(self, line: Sequence[Gang], now: float, aging_seconds: float) -> list[Gang]:
        """order_line(), the same list again while the very same line (not a copy) is handed
        in and no gang of it aged since: the order reads `now` only through Gang.aged."""
        kept = self._kept_order(line, now, aging_seconds)
        if kept is not None:
            return kept
        order = order_line(line, now, aging_seconds)
        next_aged = next_to_age(line, now, aging_seconds)
        self._ordered = _Ordered(line, aging_seconds, now, order, next_aged)
        return order

    def _kept_order(
        self, line: Sequence[Gang], now: float, aging_seconds: float
    ) -> list[Gang] | None:
        """The order kept of this very line (not a copy), good while no gang of it aged since;
        None: none kept."""
        kept = self._ordered
        if (
            kept is not None
            and kept.line is line
            and kept.aging == aging_seconds
            and kept.now <= now
            and (kept.next_aged is None or not kept.next_aged.aged(now, aging_seconds))
        ):
            return kept.order
        return None

    @staticmethod
    def _redo_from(walk: KeptWalk | None, order: Sequence[Gang], changed: list[int] | None) -> int:
        """The first gang of `order` whose place in the walk may have changed (`changed`: the
        positions whose room before the walk differs, see _changed; None: all)."""
        if walk is None or changed is None:
            return 0
        start = 0
        if order is walk.source:  # the very order walked last time (_order kept it)
            start = len(walk.order)
        else:
            for now_gang, then in zip(order, walk.order, strict=False):
                if now_gang is not then and now_gang != then:
                    break
                start += 1
        if changed:
            first = changed[0]
            reach = walk.reach
            for i in range(start):
                if reach[i] >= first:
                    return i
        return start

    @staticmethod
    def _room_before(
        walk: KeptWalk | None, start: int, over: LineAt, changed: list[int]
    ) -> list[Bin]:
        """The room left after the first `start` gangs of the walk, over `over.free` as it is
        now (`changed`: the positions whose room changed)."""
        free, holders, positions = over.free, over.holders, over.positions
        if walk is None or start == 0:
            return list(Room(free, holders, (), positions).bins)
        bins = list(walk.bins)
        copied: set[int] = set()

        def own(p: int) -> Bin:
            if p not in copied:
                b = bins[p]
                bins[p] = b.with_free(dict(b.free))
                copied.add(p)
            return bins[p]

        tail = zip(walk.order[start:], walk.plans[start:], walk.off[start:], strict=True)
        for gang, plan, off in tail:  # what each took, and each hold's caps, given back
            if not plan and not off:
                continue
            requests = {d.key: d.requests for d in gang.demands}
            for key, node in plan.items():
                add(own(positions[node]).free, requests[key])
            for node, amounts in (off or {}).items():
                add(own(positions[node]).free, amounts)
        for p in changed:  # no gang before `start` has a plan or a hold there: as Room counts it
            b = free[p]
            bins[p] = b.with_free(dict(b.free))
            copied.add(p)
            for holder in holders:
                promised = holder.remaining.get(b.name)
                if promised:
                    add(bins[p].free, {k: -v for k, v in promised.items()})
        if any(walk.shares):  # the gangs' pool draws: over the pools as they are now
            return _drawn_before(bins, free, walk.shares[:start])
        return bins


def _drawn_before(
    bins: list[Bin], free: Sequence[Bin], shares: Sequence[Sequence[PoolShare]]
) -> list[Bin]:
    """`bins` with the shared pools as they are now (`free`'s) less what the gangs kept
    from the walk drew of them (`shares`): the walk's own copies of the pools held the
    draws of the gangs walked again too, and the pools may have changed since."""
    now = {p.name: p for b in free for p in b.pools}
    current = [
        replace(b, pools=tuple(now.get(p.name, p) for p in b.pools)) if b.pools else b for b in bins
    ]
    return charged(current, [share for drawn in shares for share in drawn])


def _blocker(walk: KeptWalk, place: int) -> tuple[str, int] | None:
    """The first gang of the walk before `place` that took room (named when one waits)."""
    if walk.first >= place:
        return None
    first = walk.order[walk.first]
    return first.key, first.priority


def _before_aged(walk: KeptWalk | None, order: Sequence[Gang], start: int, over: LineAt) -> int:
    """`start`, or the first kept gang before it that did not fit and has aged since: such a
    gang holds room back now, where it took nothing when it was walked."""
    if walk is None or start == 0:
        return start
    now, aging = over.now, over.aging_seconds
    # A microsecond's margin: aged() compares now - since, not since + aging.
    if aging == walk.aging and walk.ages[start - 1] > now + 1e-6:
        return start
    for i in range(start):
        if not walk.plans[i] and not walk.aged[i] and order[i].aged(now, aging):
            return i
    return start


def _changed(walk: KeptWalk, over: LineAt) -> list[int] | None:
    """The positions whose room before any gang differs from the walk's: free bins that
    differ (the state hands out a new bin for a node that changed, or was written again), the
    nodes where a claim that came or went promised room (a claim ending after a bind redid
    the whole line before), and the nodes whose remainder for a gang that held room back
    changed. None: the nodes themselves differ, or too many changed to tell (walk all again)."""
    old, free, positions = walk.free, over.free, over.positions
    if len(free) != len(old):
        return None
    # A new bin alike in every field packs alike: a node's status written again (its
    # heartbeat, a label no rule reads) or a pod that ended and another as large placed.
    changed = {p for p in range(len(free)) if free[p] is not old[p] and free[p] != old[p]}
    if any(free[p].name != old[p].name for p in changed):
        return None
    then, now = list(walk.holders), list(over.holders)
    if then != now:
        for holder in [h for h in then if h not in now] + [h for h in now if h not in then]:
            for node in holder.remaining:
                p = positions.get(node)
                if p is not None:  # off the free bins: Room leaves it out too
                    changed.add(p)
    remainders = over.remainders
    if walk.caps and remainders is not None:
        names = remainders.changed_since(walk.stamp)
        if names is None:
            return None
        for shapes, caps in walk.caps.items() if names else ():
            current = remainders.of(shapes, over.allocatable)
            changed.update(
                p
                for name in names
                if current.get(name) != caps.get(name) and (p := positions.get(name)) is not None
            )
    return sorted(changed)
