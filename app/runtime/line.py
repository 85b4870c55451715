"""The line: gangs turned away for capacity, waiting to be admitted as a whole.

A gang joins the line when the arbiter turns it away, and keeps the time it
first did (aging, app/core/contention.py) even when a claim it got later is
released. The line's gangs are the `Gang` inputs of the pure decision; each
is built from the members the cluster state holds, plus the pod being
filtered when the watch has not delivered it yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.admission import Admission, wholeness
from app.core.backfill import Remainders
from app.core.clock import wall
from app.core.contention import (
    Contest,
    Gang,
    Holder,
    Walked,
    held_for,
    order_line,
    wake_order,
)
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.packing import Bin, Demand
from app.core.placement import placement_of
from app.core.records import GroupNotFound, PodRecord, delivered
from app.core.resources import QuantityError, pod_requests
from app.core.state import ClusterState
from app.core.topology.domains import TopologyConstraint
from app.core.topology.subgroups import Slicing
from app.runtime.claims import Claim, ClaimLedger
from app.runtime.gang_topology import GangTopology
from app.runtime.line_walk import LineAt, LineWalk
from app.runtime.queues.book import Assessment, QueueBook
from app.runtime.queues.tally import podgroup_created, queue_of
from app.runtime.revision import Revision

# Node names listed per aged gang under the line's `heldFor` in /debug/gangs.
_HELD_SHOWN = 50


@dataclass(slots=True)
class Waiting:
    """A gang in line, and since when it has waited."""

    ref: GroupRef
    since: float


class _Entries(dict[str, Waiting]):
    """The line's entries, noting the keys set or removed since the line last read them (so
    the gangs in line are redone by the change, not walked at each admission)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.changed: set[str] = set(self)

    def __setitem__(self, key: str, value: Waiting) -> None:
        self.changed.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.changed.add(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.changed.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Waiting]:
        key, value = super().popitem()
        self.changed.add(key)
        return key, value

    def setdefault(self, key: str, default: Waiting) -> Waiting:
        self.changed.add(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Waiting) -> None:
        other = dict(*args, **kwargs)
        self.changed.update(other)
        super().update(other)

    def clear(self) -> None:
        self.changed.update(self)
        super().clear()


@dataclass(frozen=True, slots=True)
class Candidate:
    """The pod the filter verb is deciding about (it may not be in our watch yet)."""

    key: str
    uid: str
    priority: int
    raw_spec: Mapping[str, Any]
    # Kueue's topology annotations on the pod (it may not be in our watch yet).
    topology: TopologyConstraint | None = None
    # Kueue's podset slices on the pod, its rank and its Volcano task (its sub-group).
    slicing: Slicing | None = None
    rank: int | None = None
    task: str = ""
    labels: Mapping[str, str] | None = None


@dataclass(slots=True)
class _Known:
    """What a gang in line is made of, kept while neither its pods nor its group object change.

    A fresh admission weighs every gang in line, and rebuilding a thousand of
    them from their members was half of such a filter call; between two calls
    only the few gangs the watch reported a change of are rebuilt.
    """

    ref: GroupRef
    # As last handed out: its waiting_since and share are refreshed at each read.
    gang: Gang
    # Its members holding a node (their DRF share, against the cluster's size now).
    placed: tuple[PodRecord, ...]
    # Enough members exist to reach minMember.
    whole: bool
    constraint: TopologyConstraint | None
    queue: str


class Line:
    """Who waits, and the Gang each of them is now.

    A gang is either in line or holding a claim (app/runtime/claims.py), never
    both: the line is what aging, wake-ups and backfill work from.
    """

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        topology: GangTopology,
        queues: QueueBook | None,
        revision: Revision,
        ledger: ClaimLedger,
    ) -> None:
        self._state = state
        # The gangs holding a claim are out of line.
        self._ledger = ledger
        self._admission = admission
        self._topology = topology
        self._queues = queues
        self._revision = revision
        self._waiting = _Entries()
        # group key -> its queue, for the gangs of the latest line.
        self._queue_of: dict[str, str] = {}
        # The gangs in line that may be admitted as far as the state and the line's entries
        # say (held, denied, required topology and the caller's exclusion are read at each
        # call), redone only for the keys in _dirty; the list of them as last handed out.
        self._ready: dict[str, Gang] = {}
        self._dirty: set[str] = set()
        self._ready_list: list[Gang] | None = None
        # Of _ready: those with a required topology level, and those with placed members
        # (their share moves with the cluster's size); the queue book they were built with.
        self._constrained: set[str] = set()
        self._placed: set[str] = set()
        self._ready_book: QueueBook | None = None
        # The last list with gangs left out: (the whole list, the keys left out, the rest).
        self._filtered: tuple[list[Gang], set[str], list[Gang]] | None = None
        # The last line assess() paired with its gangs' queues: (line, default queue, pairs).
        self._pairs: tuple[Sequence[Gang], str, list[tuple[Gang, str]]] | None = None
        # The gangs in line as last built, and the state's group stamp they are current with.
        self._known: dict[str, _Known] = {}
        self._stamp = -1
        # What an aged gang ahead can never use per node, kept between calls.
        self._remainders = Remainders(self._staying_on, state.nodes_changed_since)
        # The walk of the line a fresh gang is admitted behind, kept between calls
        # (warmed ahead in slices by app/runtime/line_warmup.py).
        self.walk = LineWalk()

    @property
    def waiting(self) -> dict[str, Waiting]:
        """Who waits: group key -> its entry."""
        return self._waiting

    @waiting.setter
    def waiting(self, entries: dict[str, Waiting]) -> None:
        self._waiting = _Entries(entries)
        self._ready.clear()
        self._dirty.update(self._waiting)
        self._ready_list = None

    def _staying_on(self, node: str) -> list[Mapping[str, int]]:
        """The requests of the pods on `node` not on their way out (backfill's remainders)."""
        leaving = self._state.leaving
        return [p.requests for p in self._state.pods_on(node) if p.key not in leaving]

    @property
    def queues(self) -> QueueBook | None:
        """The queue book, once a Queue object exists; None: queues play no part."""
        return self._queues if self._queues is not None and self._queues.active else None

    def join(self, key: str, ref: GroupRef, now: float) -> None:
        """The gang was turned away: it waits from now, unless it waits already."""
        if key not in self.waiting:
            self.waiting[key] = Waiting(ref, now)
            self._revision.bump()

    def rejoin(self, key: str, claim: Claim) -> None:
        """Its claim ended without binding: back in line, keeping its place for aging."""
        self.waiting[key] = Waiting(claim.ref, claim.waiting_since)

    def leave(self, key: str) -> float | None:
        """The gang was admitted: since when it had waited (None: it never did)."""
        entry = self.waiting.pop(key, None)
        return entry.since if entry is not None else None

    def gang(
        self,
        spec: GroupSpec,
        pod: Candidate | None,
        members: Sequence[PodRecord] | None = None,
    ) -> Gang:
        """The gang as the decision sees it: its members not placed yet, its priority and age.

        `members`: the state's members of the group, when the caller has them
        already (the line reads a thousand gangs per fresh admission).
        """
        if members is None:
            members = self._state.members(spec.key)
        demands = [Demand(p.key, p.requests, p.placement) for p in members if not p.placed_node]
        placed = wholeness(spec, len(members) - len(demands))
        priority = max((p.priority for p in members), default=0)
        if pod is not None:
            priority = max(priority, pod.priority)
            if not delivered(members, pod.uid):
                with contextlib.suppress(QuantityError):
                    demands.append(
                        Demand(pod.key, pod_requests(pod.raw_spec), placement_of(pod.raw_spec))
                    )
        created = podgroup_created(self._state, spec.key, 0.0) or min(
            (p.created for p in members if p.created), default=wall()
        )
        waiting = self.waiting.get(spec.key)
        book = self.queues
        share = book.share(p for p in members if p.placed_node) if book is not None else 0.0
        return Gang(
            key=spec.key,
            priority=priority,
            created=created,
            demands=tuple(demands),
            need=min(len(demands), placed.missing),
            waiting_since=waiting.since if waiting is not None else None,
            share=share,
            packer=self._topology.packer(spec, pod, members),
        )

    def gangs(self, exclude: str, free: list[Bin] | None = None) -> list[Gang]:
        """The gangs waiting that may be admitted: in line (any order).

        A gang with a required topology level that no domain can hold now is
        left out: it cannot take room, and aged it must not hold back others.

        Kept between calls and redone by the change (the gangs whose group changed, the
        line's entries set or removed); with nothing in the way the same list as last
        time is handed out, which the queue check and the walk then know at once.
        """
        self._forget_changed()
        book = self.queues
        if book is not self._ready_book:
            self._ready_book = book
            self._ready.clear()
            self._ready_list = None
            self._dirty.update(self.waiting)
        dirty, self._dirty = self._dirty | self._waiting.changed, set()
        self._waiting.changed = set()
        for key in dirty:
            self._refresh(key, book)
        if book is not None:
            for key in self._placed:
                self._set_share(key, book.share(self._known[key].placed))
        out = {k for k in self._ledger.held if k in self._ready}
        denied = self._admission.denied
        out.update(k for k in list(denied) if k in self._ready and k in denied)
        if exclude in self._ready:
            out.add(exclude)
        for key in self._constrained:
            known = self._known[key]
            assert known.constraint is not None
            if free is None:
                free = self._state.room()
            if not self._topology.fits_one_domain(known.gang, known.constraint, free):
                out.add(key)
        line = self._ready_list
        if line is None:
            line = self._ready_list = list(self._ready.values())
        if not out:
            return line
        kept = self._filtered
        if kept is None or kept[0] is not line or kept[1] != out:
            kept = self._filtered = (line, out, [g for g in line if g.key not in out])
        return kept[2]  # the same list while the same gangs are left out of the same line

    def _refresh(self, key: str, book: QueueBook | None) -> None:
        """Redo one gang of _ready from its entry and the state (as gangs() did each call)."""
        entry = self.waiting.get(key)
        if entry is None or key in self._ledger.held:
            if entry is not None:
                self._dirty.add(key)  # held: looked at again once its claim ends
            self._drop(key)
            return
        known = self._known.get(key)
        if known is None or known.ref != entry.ref:
            known = self._learn(key, entry.ref)
            if known is None:  # its group is gone or unusable, or nothing is left to place
                del self.waiting[key]
                self._waiting.changed.discard(key)  # dropped here already
                self._drop(key)
                return
        if not known.whole:
            self._drop(key)
            return
        share = book.share(known.placed) if book is not None else 0.0
        gang = known.gang
        if gang.waiting_since != entry.since or gang.share != share:
            gang = known.gang = replace(gang, waiting_since=entry.since, share=share)
        if self._ready.get(key) is not gang:
            self._ready[key] = gang
            self._ready_list = None
        self._queue_of[key] = known.queue
        constraint = known.constraint
        if constraint is not None and constraint.required:
            self._constrained.add(key)
        else:
            self._constrained.discard(key)
        if known.placed and book is not None:
            self._placed.add(key)
        else:
            self._placed.discard(key)

    def _set_share(self, key: str, share: float) -> None:
        known = self._known[key]
        if known.gang.share != share:
            known.gang = self._ready[key] = replace(known.gang, share=share)
            self._ready_list = None

    def _drop(self, key: str) -> None:
        if self._ready.pop(key, None) is not None:
            self._ready_list = None
        self._queue_of.pop(key, None)
        self._constrained.discard(key)
        self._placed.discard(key)

    def learn(self, most: int) -> bool:
        """Build at most `most` gangs in line not known yet, as gangs() would on first sight
        (a slice of the warm-up, app/runtime/line_warmup.py); True: every one is known."""
        self._forget_changed()
        for key, entry in list(self.waiting.items()):
            known = self._known.get(key)
            if key in self._ledger.held or (known is not None and known.ref == entry.ref):
                continue
            if most <= 0:
                return False
            most -= 1
            if self._learn(key, entry.ref) is None:
                del self.waiting[key]
        return True

    def _forget_changed(self) -> None:
        """Drop what was known of the gangs whose pods or group object changed since last time."""
        stamp, changed = self._state.groups_changed_since(self._stamp)
        if changed is None:
            self._known.clear()
            self._ready.clear()
            self._ready_list = None
            self._dirty.update(self.waiting)
        else:
            for key in changed:
                if self._known.pop(key, None) is not None or key in self.waiting:
                    self._dirty.add(key)
        self._stamp = stamp
        if len(self._known) > 2 * len(self.waiting) + 64:  # gangs that left the line
            self._known = {k: v for k, v in self._known.items() if k in self.waiting}

    def _learn(self, key: str, ref: GroupRef) -> _Known | None:
        """The gang in line built from the state; None: drop it from the line."""
        try:
            spec = self._state.group_spec(ref)
        except (GroupNotFound, PodGroupSpecError):
            return None
        members = self._state.members(key)
        gang = self.gang(spec, None, members)
        if gang.need <= 0:
            return None
        known = self._known[key] = _Known(
            ref,
            gang,
            tuple(p for p in members if p.placed_node),
            not wholeness(spec, len(members)).missing,
            self._topology.constraint(spec),
            queue_of(spec, members),
        )
        return known

    def contest(self, exclude: str) -> Contest:
        """What a decision about gang `exclude` weighs (\"\": waking the line)."""
        state = self._state
        free = state.room()
        return Contest(
            free,
            self._ledger.holders(),
            self.gangs(exclude, free),
            state.allocatable_bins(),
            state.room_positions(),
            self._remainders,
        )

    def walked(self, contest: Contest, now: float, aging_seconds: float) -> Walked | None:
        """The room after every gang of `contest.line`, from the walk kept between calls
        (app/runtime/line_walk.py); for a gang not in line, behind all of them."""
        return self.walk.walked(LineAt.of(contest, now, aging_seconds))

    def assess(
        self, gang: Gang | None, queue: str, line: Sequence[Gang], holders: Sequence[Holder]
    ) -> Assessment:
        """QueueBook.assess() with the queue of each gang in `line` (the candidate's if unknown)."""
        book = self.queues
        assert book is not None
        kept = self._pairs
        if kept is not None and kept[0] is line and kept[1] == queue:
            pairs = kept[2]  # the same line as last time: the same list (the book's memo knows it)
        else:
            pairs = [(g, self._queue_of.get(g.key, queue)) for g in line]
            self._pairs = (line, queue, pairs)
        return book.assess(gang, queue, pairs, holders)

    def to_wake(self, now: float, aging_seconds: float) -> list[str]:
        """The gangs in line that would be admitted now, in line order."""
        contest = self.contest(exclude="")
        if self.queues is not None:
            contest.line = self.assess(None, "", contest.line, contest.holders).line
        return wake_order(contest, now, aging_seconds)

    def snapshot(self, now: float, aging_seconds: float) -> list[dict[str, Any]]:
        """For /debug/gangs: who waits, in line order; per aged gang, where it holds room back.

        `heldFor`: the nodes where an aged gang that does not fit keeps the
        gangs behind it from what its members can use (they may take the rest),
        or why it holds none.
        """
        contest = self.contest(exclude="")
        held = held_for(contest, now, aging_seconds)
        line: list[dict[str, Any]] = []
        for g in order_line(contest.line, now, aging_seconds):
            entry: dict[str, Any] = {
                "group": g.key,
                "priority": g.priority,
                "waitingSeconds": round(now - (g.waiting_since or now), 2),
                "aged": g.aged(now, aging_seconds),
            }
            if g.key in held:
                nodes, why = held[g.key]
                entry["heldFor"] = {"nodes": nodes[:_HELD_SHOWN], "nodeCount": len(nodes)}
                if why:
                    entry["heldFor"]["why"] = why
            line.append(entry)
        return line
