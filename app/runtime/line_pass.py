"""One walk of the line, kept: what each gang in line took, held or drew, gang by gang.

app/runtime/line_walk.py keeps a walk of the whole line between decisions and
redoes it from the first gang a change reaches; this is the walk itself (a
pass over the gangs from one of them on, adding to what was kept before it)
and what is kept of it. It walks as a decision walks the line
(app/core/contention.py _Steps.behind_line): a gang that fits takes its room,
one that does not takes nothing, and an aged one that does not holds what it
can use on every node (Room.hold_for).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.core.backfill import Remainders, Shapes
from app.core.contention import Contest, Gang, Holder
from app.core.packing import Bin
from app.core.resources import Resources
from app.core.room import Room
from app.core.shared_pools import PoolShare

NEVER = float("inf")
# A slice of the warm-up walks `most` gangs, or works out the remainders of `most` times this
# many nodes (Remainders.warm: a node of ten pods of different sizes, 0.1 ms).
NODES_A_GANG = 1
# And capped bins of a hold (a copy of a bin each, a few µs: 500 a slice of 100 gangs).
CAPS_A_GANG = 5

# A reach past every node: the gang read them all (some member did not fit, or the
# order of its members depends on the whole cluster's free capacity).
EVERYWHERE = sys.maxsize


@dataclass(slots=True)
class KeptWalk:
    """The line as last walked: the gangs set aside in order, and the room after them."""

    free: Sequence[Bin]
    holders: Sequence[Holder]
    order: list[Gang]
    plans: list[Mapping[str, str]]
    reach: list[int]
    bins: list[Bin]
    # The ordered line `order` is the start of.
    source: list[Gang]
    # ages[i]: the soonest any gang of order[: i + 1] that took nothing ages (inf: none
    # will), under `aging`: a kept gang that ages is looked for only once one may have.
    ages: list[float]
    aging: float
    # Per gang of `order`, what it drew of the shared device pools (Room.take).
    shares: list[list[PoolShare]]
    # Per gang: walked aged and not fitting (a later look at its age changes nothing), and
    # what its hold took off each node (None: none; Room.hold_for).
    aged: list[bool]
    off: list[dict[str, Resources] | None]
    # picks[i]: the aged gang that holds room back named for order[: i + 1] (Walked.aged).
    picks: list[tuple[Gang, list[str]] | None]
    # Where order's first gang that fits is (len(order): none does).
    first: int
    # The remainders' change stamp when walked, and per member shapes held for the remainders
    # the holds read: a node whose remainder changed since is a change (see _changed).
    stamp: int
    caps: dict[Shapes, Mapping[str, Resources | None]]


@dataclass(frozen=True, slots=True)
class LineAt:
    """What a walk of the line is over: the gangs in line, the cluster's free room and the
    claims on it (with each node's position in `free`), at one moment and aging rule."""

    line: Sequence[Gang]
    free: Sequence[Bin]
    holders: Sequence[Holder]
    positions: Mapping[str, int]
    now: float
    aging_seconds: float
    # The empty cluster and what an aged gang can never use per node (Contest's): without
    # them an aged gang that does not fit holds everything and the walk stops there.
    allocatable: Sequence[Bin] = ()
    remainders: Remainders | None = None

    @classmethod
    def of(cls, contest: Contest, now: float, aging_seconds: float) -> LineAt:
        """The line of a decision's contest (its free bins' positions known)."""
        positions = contest.positions
        assert positions is not None
        return cls(
            contest.line,
            contest.free,
            contest.holders,
            positions,
            now,
            aging_seconds,
            contest.allocatable,
            contest.remainders,
        )


# What the gangs that take nothing are kept with, shared: read, never changed.
_NO_PLAN: Mapping[str, str] = {}
_NO_SHARES: list[PoolShare] = []


class AlikeRuns:
    """Where each run of alike gangs in one order of the line ends (WalkPass._alike), worked
    out when first asked and kept while that very order is walked again: a run of
    thousands is then walked at once."""

    def __init__(self) -> None:
        self._order: Sequence[Gang] | None = None
        # end[i]: the index past the run gang i is in (0: not worked out yet).
        self._end: list[int] = []
        # Runs a slice stopped looking at: where it stopped -> where the run began. The
        # next slice goes on from the gang before the stop, and once it sees the end the
        # whole run's ends are kept (not only the part it looked at).
        self._open: dict[int, int] = {}

    def end(
        self, order: Sequence[Gang], i: int, alike: Callable[[Gang, Gang], bool], most: int
    ) -> int:
        """The first index after i whose gang is not alike order[i] (nor any gang between), or
        `most` when the run goes on past it (looked at no further: a warm-up's slice)."""
        if order is not self._order:
            self._end = self._kept_for(order)
            self._order = order
            self._open.clear()
        ends = self._end
        if ends[i]:
            return min(ends[i], most)
        j, stop = i + 1, min(most, len(order))
        while j < stop and alike(order[i], order[j]):
            j += 1
        began = self._open.pop(i + 1, i)  # alike is an equivalence: one run from `began`
        if j < stop or j == len(order):  # the run's end seen: kept
            ends[began:j] = [j] * (j - began)
        else:
            self._open[j] = began
        return j

    def _kept_for(self, order: Sequence[Gang]) -> list[int]:
        """The ends worked out for the last order that still hold in `order`: the runs wholly
        inside the part the two share from the front (the same gangs, the very objects:
        alike as they were, and an aged gang stays aged). A claim that came or went hands
        the line again as a new list, and 10,000 alike gangs were looked at again (8 ms)."""
        old, ends = self._order, self._end
        same = 0
        if old is not None:
            for now, then in zip(order, old, strict=False):
                if now is not then:
                    break
                same += 1
        whole = same == len(order) == len(old or ())
        kept = [e if e < same or (whole and e == same) else 0 for e in ends[:same]]
        return kept + [0] * (len(order) - same)


class WalkPass:
    """One walk of the line from a gang on, over the room before it (`room`), adding to the
    kept walk's part before it (`done`) as _Steps.behind_line walks the line for a decision:
    a gang that fits takes its room; an aged one that does not holds what it can use."""

    def __init__(self, room: Room, over: LineAt, done: KeptWalk, runs: AlikeRuns) -> None:
        self.room = room
        self.runs = runs
        self.over = over
        self.done = done
        self._pick = done.picks[-1] if done.picks else None
        # Room.hold_for holds the nodes promised before this pass whole: told at the first hold.
        self._promised = False
        self._sliced = False

    def walk(
        self, order: Sequence[Gang], start: int, most: int, *, sliced: bool = False
    ) -> tuple[bool, bool]:
        """Walk order[start:], at most `most` gangs: (walked all `most` or to the end, nothing
        left to walk: true at the end, or at an aged gang that holds everything back).
        `sliced`: a warm-up's slice, which works out a hold's remainders and capped bins a
        slice at a time (a decision's walk works out what it needs at once)."""
        self._sliced = sliced
        room, over, done = self.room, self.over, self.done
        i, end = start, min(len(order), start + most)
        i += self._run_on(order, start, end)
        while i < end:
            gang = order[i]
            placed = room.place(gang)
            if placed is not None:
                packing, drawn = placed
                done.first = min(done.first, i)
                reached = reach(gang, packing.plan, packing.unplaced, over.positions)
                self._add(gang, packing.plan, reached, drawn)
            elif not gang.aged(over.now, over.aging_seconds):
                # It takes nothing; any node with more room may take it next time.
                self._add(gang, {}, EVERYWHERE, [])
            elif not self._ready(gang, most):  # its remainders are worked out a slice a call
                return False, False
            elif not self._hold(gang):  # the remainders are not known: the decision walks
                return False, True
            elif gang.packer is None:  # the aged gangs alike right behind it do as it did
                alike = self.runs.end(order, i, self._alike, end) - i - 1
                self._repeat(alike)
                i += alike
            i += 1
        return True, end == len(order)

    def _run_on(self, order: Sequence[Gang], start: int, end: int) -> int:
        """How many gangs from `start` on go on the run of alike aged gangs the gang before
        them was held in (walked as it was, at once): a warm-up's slice ends inside a run
        of thousands, and the next one began it again (a failing first fit and a look at
        every node's hold, each slice)."""
        done = self.done
        if not 0 < start < end or not done.aged[start - 1] or done.plans[start - 1]:
            return 0
        if order[start - 1].packer is not None or not self._alike(order[start - 1], order[start]):
            return 0
        alike = self.runs.end(order, start - 1, self._alike, end) - start
        self._repeat(alike)
        return alike

    def _alike(self, gang: Gang, other: Gang) -> bool:
        """Does `other`, right behind the aged `gang` that did not fit, do as it did? When
        aged with the same member shapes and need, denied alike: it does not fit either (the
        room only shrank), may or may never fit the empty cluster as `gang`, and its hold caps
        nothing more (Room's memos, which it is walked without: thousands of alike gangs
        in line, walked again after each claim, bind or pod gone, were the walk's cost)."""
        remainders, over = self.over.remainders, self.over
        return (
            remainders is not None
            and other.packer is None
            and other.need == gang.need
            and other.denied == gang.denied  # a denied gang's "no" says nothing of the room
            and other.aged(over.now, over.aging_seconds)
            and remainders.shapes(other.demands) is remainders.shapes(gang.demands)
        )

    def _ready(self, gang: Gang, most: int) -> bool:
        """A walk in slices (`most` gangs, not every one: the warm-up's): are the remainders
        the gang's hold reads worked out, and the capped bins it makes? If not, a slice of
        them is, now."""
        remainders = self.over.remainders
        if not self._sliced or remainders is None or not self.over.allocatable:
            return True
        shapes = remainders.shapes(gang.demands)
        if not remainders.warm(shapes, self.over.allocatable, most * NODES_A_GANG):
            return False
        return self.room.warm_hold(gang, most * CAPS_A_GANG)

    def _hold(self, gang: Gang) -> bool:
        """An aged gang that does not fit holds what it can use; False: it holds everything."""
        room, done, remainders = self.room, self.done, self.over.remainders
        off: dict[str, Resources] = {}
        if room.may_ever_fit(gang):  # (else it holds nothing: it can never fit)
            if not self._promised:
                holders = self.over.holders
                room.promise([n for h in holders if h.remaining for n in h.remaining])
                room.promise([n for plan in done.plans for n in plan.values()])
                self._promised = True
            held = room.hold_for(gang, off)
            if held is None or remainders is None:
                return False
            if self._pick is None or (held and not self._pick[1]):
                self._pick = (gang, held)
            shapes = remainders.shapes(gang.demands)
            done.caps[shapes] = remainders.of(shapes, self.over.allocatable)
        self._add(gang, {}, EVERYWHERE, [], (True, off or None))
        return True

    def _add(
        self,
        gang: Gang,
        plan: Mapping[str, str],
        reach: int,
        drawn: list[PoolShare],
        held: tuple[bool, dict[str, Resources] | None] = (False, None),
    ) -> None:
        """The gang walked: its plan, reach, pool draws, whether it was walked aged (and what
        its hold took off)."""
        done = self.done
        done.plans.append(plan)
        done.reach.append(reach)
        done.shares.append(drawn)
        done.aged.append(held[0])
        done.off.append(held[1])
        done.picks.append(self._pick)
        soonest = done.ages[-1] if done.ages else NEVER
        if not plan and not held[0] and gang.waiting_since is not None:
            soonest = min(soonest, gang.waiting_since + done.aging)
        done.ages.append(soonest)

    def _repeat(self, times: int) -> None:
        """`times` more gangs walked as the last (aged, did not fit, its hold capping nothing
        more): the lists grown at once, not gang by gang."""
        if times <= 0:
            return
        done = self.done
        done.plans.extend([_NO_PLAN] * times)
        done.reach.extend([EVERYWHERE] * times)
        done.shares.extend([_NO_SHARES] * times)
        done.aged.extend([True] * times)
        done.off.extend([None] * times)
        done.picks.extend([self._pick] * times)
        done.ages.extend([done.ages[-1]] * times)

    def finish(self, order: Sequence[Gang]) -> KeptWalk:
        """The walk as it stands: the gangs walked, and the room after them."""
        done = self.done
        done.order = list(order[: len(done.plans)])
        done.bins = list(self.room.bins)
        return done


def reach(
    gang: Gang, plan: Mapping[str, str], left: Sequence[str], positions: Mapping[str, int]
) -> int:
    """The last node (position) the gang's first fit read: where its last member landed."""
    if gang.packer is not None:  # a tree weighs every domain (fullest first), not a prefix
        return EVERYWHERE
    first = gang.demands[0].requests if gang.demands else None
    if left or any(d.requests != first for d in gang.demands):
        return EVERYWHERE
    return max((positions[node] for node in plan.values()), default=-1)
