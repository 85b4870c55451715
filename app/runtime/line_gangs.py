"""The gangs in line, kept between calls and redone by the change.

A fresh admission weighs every gang in line. Building them from their members at
each admission was half of such a filter call with 1,000 gangs in line, and
walking the line's entries a third of one with 10,000 (BENCHMARKS.md). Here each
gang in line is built once and redone only when the state says its pods or group
object changed (`groups_changed_since`) or its line entry was set or removed
(`_Entries` notes it); what changes with every call (claims, denials, the room a
required topology level needs, the gang being decided) is read at each call. With
nothing changed the very same list is handed out again, which the queue check
(app/runtime/queues/book.py) and the line's walk (app/runtime/line_walk.py) then
know without looking at its gangs.

A gang denied for a while after a failed attempt stays in line, marked
(`Gang.denied`: it fits nowhere, and aged it holds what it can use), so the gang
behind it does not take its place because kube-scheduler's cache lagged a
moment. One whose attempts failed more than KEEPS_PLACE_FAILURES times in a row
is left out while denied, as a gang kube-scheduler will not place whatever the
extender reckons (a rule the packing does not model, such as inter-pod
anti-affinity) would otherwise hold back the gangs behind it for good.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.admission import Admission, wholeness
from app.core.contention import Gang
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.packing import Bin
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.core.topology.domains import TopologyConstraint
from app.runtime.claims import ClaimLedger
from app.runtime.gang_topology import GangTopology
from app.runtime.queues.book import QueueBook
from app.runtime.queues.tally import queue_of

KEEPS_PLACE_FAILURES = 2
"""Failed attempts in a row through which a denied gang keeps its place (module docstring)."""


@dataclass(slots=True)
class Waiting:
    """A gang in line, since when it has waited, and how many of its attempts failed in a row
    (admitted, then released without binding: see KEEPS_PLACE_FAILURES)."""

    ref: GroupRef
    since: float
    failed: int = 0


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


class LineGangs:
    """Who waits, and the gangs in line as the decision sees them (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        topology: GangTopology,
        ledger: ClaimLedger,
        build: Callable[[GroupSpec, Sequence[PodRecord]], Gang],
        queues: Callable[[], QueueBook | None],
    ) -> None:
        self._state = state
        self._admission = admission
        self._topology = topology
        # The gangs holding a claim are out of line.
        self._ledger = ledger
        self._build = build
        self._queues = queues
        self._waiting = _Entries()
        # group key -> its queue, for the gangs of the latest line.
        self._queue_of: dict[str, str] = {}
        # The gangs in line that may be admitted as far as the state and the line's entries
        # say (held, denied, required topology and the caller's exclusion are read at each
        # call), redone only for the keys in _dirty; the list of them as last handed out.
        self._ready: dict[str, Gang] = {}
        self._dirty: set[str] = set()
        self._held_later: set[str] = set()
        self._ready_list: list[Gang] | None = None
        # Of _ready: those with a required topology level, and those with placed members
        # (their share moves with the cluster's size); the queue book they were built with.
        self._constrained: set[str] = set()
        self._placed: set[str] = set()
        self._ready_book: QueueBook | None = None
        # The last list with gangs left out or marked denied: (the whole list, the keys left
        # out, the keys marked, the rest).
        self._filtered: tuple[list[Gang], set[str], set[str], list[Gang]] | None = None
        # Per denied gang that keeps its place: the gang of _ready marked, and its mark.
        self._marked: dict[str, tuple[Gang, Gang]] = {}
        # The gangs in line as last built, and the state's group stamp they are current with.
        self._known: dict[str, _Known] = {}
        self._stamp = -1

    @property
    def waiting(self) -> dict[str, Waiting]:
        """Who waits: group key -> its entry."""
        return self._waiting

    @waiting.setter
    def waiting(self, entries: dict[str, Waiting]) -> None:
        self._waiting = _Entries(entries)
        self._redo_all()

    def _redo_all(self) -> None:
        """Every gang in line (and every one kept of the last line) redone at the next read."""
        self._dirty.update(self._ready)
        self._dirty.update(self._waiting)

    def gangs(self, exclude: str, free: list[Bin] | None = None) -> list[Gang]:
        """The gangs in line that take part in decisions (any order).

        A gang with a required topology level that no domain can hold now is
        left out: it cannot take room, and aged it must not hold back others.
        A denied one is marked (Gang.denied), or left out when its attempts
        failed again and again (the module docstring).

        Kept between calls and redone by the change (the gangs whose group changed, the
        line's entries set or removed); with nothing in the way the same list as last
        time is handed out, which the queue check and the walk then know at once.
        """
        self._dirty |= self._held_later
        self._held_later = set()
        self._catch_up(sys.maxsize)
        book = self._queues()
        if book is not None:
            for key in self._placed:
                self._set_share(key, book.share(self._known[key].placed))
        out = {k for k in self._ledger.held if k in self._ready}
        denied = self._admission.denied
        resting = {k for k in list(denied) if k in self._ready and k in denied}
        marked = {k for k in resting if self._keeps_place(k)}
        out |= resting - marked
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
        if not out and not marked:
            return line
        kept = self._filtered
        if kept is None or kept[0] is not line or kept[1] != out or kept[2] != marked:
            rest = [self._mark(g) if g.key in marked else g for g in line if g.key not in out]
            kept = self._filtered = (line, out, marked, rest)
        return kept[3]  # the same list while the same gangs are left out of the same line

    def _keeps_place(self, key: str) -> bool:
        """Does the denied gang `key` keep its place in line (see the module docstring)?"""
        entry = self.waiting.get(key)
        return entry is not None and entry.failed <= KEEPS_PLACE_FAILURES

    def _mark(self, gang: Gang) -> Gang:
        """The gang marked denied: the same object while the same gang is (the walk knows it)."""
        kept = self._marked.get(gang.key)
        if kept is None or kept[0] is not gang:
            if len(self._marked) > 2 * len(self._ready) + 64:
                self._marked = {k: v for k, v in self._marked.items() if k in self._ready}
            kept = self._marked[gang.key] = (gang, replace(gang, denied=True))
        return kept[1]

    def _refresh(self, key: str, book: QueueBook | None) -> None:
        """Redo one gang of _ready from its entry and the state (as gangs() did each call)."""
        entry = self.waiting.get(key)
        if entry is None or key in self._ledger.held:
            if entry is not None:
                self._held_later.add(key)  # looked at again at each gangs(), for its claim
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
            if book is not None:
                book.request(gang)  # summed now, a slice of the warm-up, not in its queue check
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
        """Build or redo at most `most` gangs in line that changed, as gangs() would (a slice
        of the warm-up, app/runtime/line_warmup.py); True: every one is current."""
        return self._catch_up(most)

    def queue_of(self, key: str, otherwise: str) -> str:
        """The queue of a gang of the latest line (`otherwise` when it is not in it)."""
        return self._queue_of.get(key, otherwise)

    def _catch_up(self, most: int) -> bool:
        """Redo at most `most` of the gangs whose group or line entry changed; True: none is
        left (those holding a claim wait for the next gangs())."""
        self._forget_changed()
        book = self._queues()
        if book is not self._ready_book:
            self._ready_book = book
            self._redo_all()
        self._dirty |= self._waiting.changed
        self._waiting.changed = set()
        dirty = self._dirty
        for _ in range(min(most, len(dirty))):
            self._refresh(dirty.pop(), book)
        return not dirty

    def _forget_changed(self) -> None:
        """Drop what was known of the gangs whose pods or group object changed since last time."""
        stamp, changed = self._state.groups_changed_since(self._stamp)
        if changed is None:
            self._known.clear()
            self._redo_all()
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
        gang = self._build(spec, members)
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
