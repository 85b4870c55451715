"""Gangs under contention: who gets the capacity, in which order. Pure decisions.

Members of two gangs that are admitted one pod at a time can each reserve
part of the cluster, and then both wait in the permit gate until they time
out (the deadlock users of every gang scheduler report). Here a gang is
admitted as a whole: when its first member passes filter, the capacity for
all the members it still needs is *claimed* (a packing plan, app/core/packing.py)
and other gangs see that capacity as taken until the gang is bound or
released. Gangs that do not fit wait in a line:

- **Order in line**: higher pod priority first; then gangs that have *aged*
  (waited longer than the aging period since they were first turned away)
  before those that have not; with queues, the gang holding the smaller
  dominant share of the cluster (DRF, app/core/queues.py); then older PodGroups (creation time; for
  label-only groups the earliest member's) first; then by name.
- **Backfill**: a gang further back may be admitted while one ahead of it
  does not fit yet, if it fits in what is left once every gang ahead that
  does fit has its share set aside.
- **Aging**: an aged gang is not overtaken any more: while it does not fit,
  a gang of equal or lower priority behind it is admitted only into what the
  aged gang can never use: on each node its remainder (app/core/backfill.py:
  what no set of its members could use, whichever of the node's pods leave
  first; all of a node none of its members may go to), so the aged gang
  starts exactly when it would if nobody behind it were admitted (unless it
  could not fit even in the empty cluster: then it holds nothing). Without
  the nodes' pods to tell the remainder (`Contest.remainders` None), nothing
  behind it is admitted. The cluster drains until it fits, so a large gang
  is never starved by a stream of small ones, and what it cannot use is not
  left idle.
- **A failed attempt keeps the place**: a gang whose admission failed (the gate's
  wait ran out, kube-scheduler found no node for a member, a bind failed) is
  denied for --denied-pg-expiration-seconds and back in line with its age. While
  denied it is not admitted and takes nothing, but an aged one still holds
  what it can use (`Gang.denied`): the gang behind it does not take its place
  for a moment kube-scheduler's cache lagged. A gang that failed again and
  again is left out while denied (app/runtime/line_gangs.py).
- **Precedence**: a gang of strictly higher priority that does not fit may
  take the capacity of lower-priority gangs that hold a claim but are still
  collecting members in the gate: their reservations are released.

Nothing here does I/O or reads a clock: callers pass `now`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from app.core.backfill import Remainders
from app.core.packing import Bin, Demand, Packing
from app.core.packing_search import pack_thoroughly
from app.core.room import Room


class Ruling(StrEnum):
    """What decide() says about a gang that passed the Coscheduling rules."""

    ADMIT = "admit"
    WAIT = "wait"
    SHORT = "short"


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang that wants capacity now (its members that are not placed yet)."""

    key: str
    priority: int
    # Seconds since the epoch: PodGroup creation (label-only: earliest member).
    created: float
    demands: tuple[Demand, ...]
    # How many of `demands` must be placed for the gang to reach minMember.
    need: int
    # When it was first turned away for capacity (None: never, it is new).
    waiting_since: float | None = None
    # DRF: the dominant share of the cluster its placed members hold (0 without
    # queues, app/core/queues.py): within a priority, the gang holding less goes first.
    share: float = 0.0
    # A gang made of groups waiting in line: how its admission would pack it (each
    # sub-group whole in one domain, app/core/topology/tree.py pack_tree), so a
    # decision behind it sets aside what it would really take (None: a flat gang).
    packer: Callable[[Gang, Sequence[Bin]], Packing] | None = field(default=None, compare=False)
    # Denied for a while after a failed attempt ("A failed attempt keeps the place"): it
    # fits nowhere until the denial expires, and aged it holds what it can use.
    denied: bool = False

    def aged(self, now: float, aging_seconds: float) -> bool:
        return self.waiting_since is not None and now - self.waiting_since >= aging_seconds


@dataclass(frozen=True, slots=True)
class Holder:
    """A gang holding a claim: admitted, its members on their way through the gate."""

    key: str
    priority: int
    created: float
    # Capacity promised to members not placed yet, per node.
    remaining: Mapping[str, Mapping[str, int]]
    # Capacity its members hold in the gate (reserved, not bound), per node.
    reserved: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Ruling
    # ADMIT: member key -> node, the capacity now claimed for the gang.
    plan: Mapping[str, str] = field(default_factory=dict)
    # ADMIT: lower-priority holders whose reservations must be released first.
    release: tuple[str, ...] = ()
    # WAIT: the gang ahead (key, priority).
    behind: tuple[str, int] | None = None
    message: str = ""


def line_key(gang: Gang, now: float, aging_seconds: float) -> tuple[int, int, float, float, str]:
    """Sort key of the line (smallest first); the module docstring states the rule."""
    aged = 0 if gang.aged(now, aging_seconds) else 1
    return (-gang.priority, aged, gang.share, gang.created, gang.key)


def order_line(gangs: Sequence[Gang], now: float, aging_seconds: float) -> list[Gang]:
    return sorted(gangs, key=lambda g: line_key(g, now, aging_seconds))


@dataclass(slots=True)
class Contest:
    """What one admission decision weighs, gathered once so that every step weighs one moment.

    `free`: per node, allocatable minus every placed pod (bound, or reserved
    in the gate by any gang); never changed by a decision. `holders`: gangs
    with a claim. `line`: gangs waiting (any order; the queue check may
    narrow it before the decision). `allocatable`: the empty cluster, to
    tell an aged gang that may fit one day from one that never can (empty:
    assume it may). `positions`: where each node is in `free`, when the
    caller keeps that between calls (ClusterState.room_positions); else a
    decision that changes a bin indexes every node first. `remainders`: what
    an aged gang ahead can never use per node (needs `allocatable`); None:
    an aged gang ahead that does not fit holds everything back.
    """

    free: Sequence[Bin]
    holders: Sequence[Holder] = ()
    line: Sequence[Gang] = ()
    allocatable: Sequence[Bin] = ()
    positions: Mapping[str, int] | None = None
    remainders: Remainders | None = None
    # The line walked before, kept by the caller between decisions (see Walked).
    walked: Walked | None = None


@dataclass(frozen=True, slots=True)
class Walked:
    """`line` walked in line order over `free` less the holders' promises, every gang of it
    that fits set aside and each aged one that does not capping the room at what it cannot
    use (Room.hold_for): the room left after them all (`bins`), kept by the caller between
    calls and redone only from the first gang a change reaches (app/runtime/line_walk.py).

    Good for a decision whose contest has this very `line`, `free` and holders (room_for):
    a candidate behind every gang of the line packs into `bins` at once instead of
    walking the line again (what a fresh gang's admission cost, one first fit per gang
    ahead), and one in line into the room before its place (`ahead`). `last`: the line's
    last gang in line order (None: the line is empty).
    """

    line: Sequence[Gang]
    free: Sequence[Bin]
    holders: Sequence[Holder]
    last: Gang | None
    bins: Sequence[Bin]

    # The gangs walked, in line order, and the room the walk left before the one at a
    # given place (see Ahead; None: only a candidate behind them all is served).
    order: Sequence[Gang] = ()
    ahead: Callable[[int, str], Ahead | None] | None = None

    def room_for(
        self, candidate: Gang, contest: Contest, now: float, aging_seconds: float
    ) -> Ahead | None:
        """The room the gangs ahead of this candidate leave it, and who they are, if this walk
        is of this very contest (None: the decision walks the line itself). Behind the
        whole line: the room after it; in line (a gang that waited, or was held, and is
        weighed again): the room before its place, the walk's part before it."""
        if (
            self.line is not contest.line
            or self.free is not contest.free
            or self.holders is not contest.holders
            or any(h.key == candidate.key for h in self.holders)
        ):
            return None
        if self.ahead is None:
            return None
        mine = line_key(candidate, now, aging_seconds)
        if self.last is None or line_key(self.last, now, aging_seconds) < mine:
            place = len(self.order)
        else:
            place = bisect_left(self.order, mine, key=lambda g: line_key(g, now, aging_seconds))
        return self.ahead(place, candidate.key)


@dataclass(frozen=True, slots=True)
class Ahead:
    """What the gangs ahead of a candidate in line leave it: the room after them (holders'
    promises off, each that fits set aside, each aged one that does not holding what it
    can use), the first that took room, and the aged one that holds room back."""

    bins: Sequence[Bin]
    blocker: tuple[str, int] | None
    aged: tuple[Gang, list[str]] | None


def decide(candidate: Gang, contest: Contest, now: float, aging_seconds: float) -> Decision:
    """Admit `candidate`, or say which gang it waits behind, or what the cluster lacks.

    The candidate's own claim and place in line, if `contest` has them, are
    not weighed against it.

    SHORT (with the shortfall) when the members would not fit even if no
    other gang held or was promised anything: waiting in line cannot help,
    only capacity freed by pods outside the gate can. WAIT (naming the gang
    ahead) when other gangs' claims, reservations or places in line are what
    keeps it out.
    """
    steps = _Steps(candidate, [h for h in contest.holders if h.key != candidate.key])
    walked = contest.walked
    ahead = walked.room_for(candidate, contest, now, aging_seconds) if walked else None
    if ahead is not None:
        # The line was walked already: every gang of it ahead of the candidate, set aside.
        room = Room(ahead.bins, (), contest.allocatable, contest.positions, contest.remainders)
        steps.blocker, steps.aged = ahead.blocker, ahead.aged
    else:
        room = Room(
            contest.free, steps.holders, contest.allocatable, contest.positions, contest.remainders
        )
        waiting = steps.behind_line(contest.line, room, now, aging_seconds)
        if waiting is not None:
            return waiting
    packing = room.pack(candidate, thorough=True)
    if packing.fits:
        return Decision(Ruling.ADMIT, packing.plan)
    if steps.aged is not None:
        # Giving a lower gang's room back could hand over what the aged gang holds.
        return steps.refusal(contest.free, packing)
    admitted, packing = steps.by_precedence(room, packing)
    if admitted is not None:
        return admitted
    return steps.refusal(contest.free, packing)


class _Steps:
    """The steps of decide() past the first packing, and what they learn on the way."""

    __slots__ = ("aged", "blocker", "candidate", "holders")

    def __init__(self, candidate: Gang, holders: list[Holder]) -> None:
        self.candidate = candidate
        self.holders = holders
        # The first gang ahead that took room, named when the candidate waits.
        self.blocker: tuple[str, int] | None = None
        # The first aged gang ahead that holds room back, and the nodes where it did.
        self.aged: tuple[Gang, list[str]] | None = None

    def behind_line(
        self, line: Sequence[Gang], room: Room, now: float, aging_seconds: float
    ) -> Decision | None:
        """Backfill: the gangs ahead that fit get their room first; an aged one ahead holds
        what it can use (everything, when the remainders are not known: the candidate waits)."""
        candidate = self.candidate
        mine = line_key(candidate, now, aging_seconds)
        for other in order_line([g for g in line if g.key != candidate.key], now, aging_seconds):
            if line_key(other, now, aging_seconds) >= mine:
                break
            if room.set_aside(other):
                self.blocker = self.blocker or (other.key, other.priority)
            elif (
                other.aged(now, aging_seconds)
                and other.priority >= candidate.priority
                and room.may_ever_fit(other)
            ):
                held = room.hold_for(other)
                if held is None:
                    return _wait(candidate, (other.key, other.priority), "has waited longest")
                if self.aged is None or (held and not self.aged[1]):
                    self.aged = (other, held)
        return None

    def behind_aged(self) -> Decision | None:
        """WAIT behind the aged gang that held room back (None: none held any)."""
        if self.aged is None or not self.aged[1]:
            return None
        gang, held = self.aged
        nodes = ", ".join(held[:2]) + (f" ({len(held) - 2} more)" if len(held) > 2 else "")
        return _wait(
            self.candidate,
            (gang.key, gang.priority),
            f"has waited longest and holds what its {gang.need} member(s) can use on nodes {nodes}",
            " in what it cannot use",
        )

    def by_precedence(self, room: Room, packing: Packing) -> tuple[Decision | None, Packing]:
        """Release lower-priority gangs still collecting, lowest first, until the candidate fits.

        (None, the last packing tried) when it does not fit even so.
        """
        released: list[str] = []
        for holder in sorted(
            (h for h in self.holders if h.priority < self.candidate.priority),
            key=lambda h: (h.priority, -h.created, h.key),
        ):
            room.give_back(holder)
            released.append(holder.key)
            packing = room.pack(self.candidate, thorough=True)
            if packing.fits:
                return Decision(Ruling.ADMIT, packing.plan, tuple(released)), packing
        return None, packing

    def refusal(self, free: Sequence[Bin], packing: Packing) -> Decision:
        """SHORT when the cluster itself lacks the room, else WAIT behind whoever took it.

        Without any other gang holding anything: if it does not fit even so,
        the cluster itself is short (not a matter of waiting in line). Packed
        only here: most gangs are admitted before, and this is a second whole
        packing.
        """
        candidate = self.candidate
        unheld = Room(free, (), ())
        for holder in self.holders:
            unheld.free_up(holder.reserved)
        alone = pack_thoroughly(candidate.demands, unheld.bins, candidate.need)
        if not alone.fits:
            return Decision(Ruling.SHORT, message=alone.describe(candidate.key, candidate.demands))
        behind_aged = self.behind_aged()
        if behind_aged is not None:
            return behind_aged
        blocker = self.blocker
        if blocker is None and self.holders:
            top = min(self.holders, key=lambda h: (-h.priority, h.created, h.key))
            blocker = (top.key, top.priority)
        if blocker is None:  # fits alone, so a holder or a gang ahead took the room
            return Decision(
                Ruling.SHORT, message=packing.describe(candidate.key, candidate.demands)
            )
        return _wait(candidate, blocker, "holds the capacity it needs")


def room_left(
    free: Sequence[Bin], holders: Sequence[Holder], positions: Mapping[str, int] | None = None
) -> list[Bin]:
    """`free` less what `holders` were promised and have not placed yet.

    The bins no promise touched are `free`'s own: read them, never change them.
    `positions`: as Contest's.
    """
    return list(Room(free, holders, (), positions).bins)


def _wait(candidate: Gang, behind: tuple[str, int], why: str, where: str = "") -> Decision:
    key, priority = behind
    return Decision(
        Ruling.WAIT,
        behind=behind,
        message=(
            f"gang {candidate.key} (priority {candidate.priority}) is waiting behind {key} "
            f"(priority {priority}), which {why}; it is admitted as a whole once its "
            f"{candidate.need} member(s) fit{where} (nothing is reserved meanwhile)"
        ),
    )
