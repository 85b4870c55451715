"""Reclaim for gangs of queues below their share that do not fit (app/runtime/queues/reclaimer.py).

Two ways in: the filter verb turned such a gang away (`reclaim()`), or
kube-scheduler found no node for one of its members before our filter was
asked (`unplaced()`, then `check()` a moment later). When the cluster is full,
kube-scheduler's own resource filter turns a member away first, so the verb
alone would never see a gang that only reclaim can place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from app.core.admission import Admission, wholeness
from app.core.clock import Clock
from app.core.contention import Gang, Holder, room_left
from app.core.groups import GroupRef, PodGroupSpecError
from app.core.packing import Bin, pack
from app.core.queues import starving
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.runtime.claims import ClaimLedger
from app.runtime.line import Line
from app.runtime.queues.book import Assessment, request_of
from app.runtime.queues.reclaimer import Reclaimer
from app.runtime.queues.tally import queue_of


class ReclaimChecks:
    """Which gangs reclaim is asked about, and when."""

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        ledger: ClaimLedger,
        line: Line,
        reclaimer: Reclaimer | None,
        clock: Clock,
    ) -> None:
        self._state = state
        self._admission = admission
        self._ledger = ledger
        self._line = line
        self._reclaimer = reclaimer
        self._clock = clock
        # Gangs kube-scheduler found no node for (its own filters, before ours): may reclaim.
        self._unplaced: dict[str, GroupRef] = {}
        self._timer: asyncio.TimerHandle | None = None

    def reclaim(
        self,
        gang: Gang,
        ref: GroupRef,
        queued: Assessment,
        free: Sequence[Bin],
        holders: Sequence[Holder],
        room: list[Bin] | None = None,
    ) -> str | None:
        """A gang of a queue below its share does not fit: take room back; what was done.

        None: reclaim does not apply (no reclaimer, or the queue is not below its
        share); "": the reclaimer was asked and did nothing. What the reclaimer says
        depends on the clock too (evictions under way expire).
        `room`: free less the holders' promises, when the caller has it already.
        """
        view = queued.views.get(queued.queue)
        book = self._line.queues
        if self._reclaimer is None or view is None or book is None:
            return None
        if not starving(replace(view, head=request_of(gang)), book.overcommit):
            return None
        if room is None:
            room = room_left(free, holders)
        text = self._reclaimer.reclaim(gang, ref, queued.queue, queued.views, room, queued.running)
        return f"; {text}" if text else ""

    def unplaced(self, old: PodRecord, new: PodRecord) -> None:
        """kube-scheduler may have found no node for a member of a gang holding no claim."""
        assert new.group is not None
        if (
            self._line.queues is not None
            and new.unschedulable_message
            and new.unschedulable_message != old.unschedulable_message
            and not new.placed_node
            and new.group.key not in self._ledger.held
        ):
            self._unplaced[new.group.key] = new.group
            self._schedule()

    def retry(self, gang_key: str) -> bool:
        """The gang's reclaim was refused (a disruption budget): look for other victims soon.

        False: the gang is not in line any more, nothing to retry.
        """
        waiting = self._line.waiting.get(gang_key)
        if waiting is None:
            return False
        self._unplaced[gang_key] = waiting.ref
        self._schedule()
        return True

    def check(self) -> None:
        """Reclaim for the gangs found no node that belong to queues below their share.

        They join the line too, to be woken when room frees.
        """
        self._timer = None
        pending, self._unplaced = self._unplaced, {}
        book = self._line.queues
        if book is None:
            return
        now = self._clock()
        for key, ref in pending.items():
            if key in self._ledger.held or key in self._admission.denied:
                continue
            try:
                spec = self._state.group_spec(ref)
            except (GroupNotFound, PodGroupSpecError):
                continue
            members = self._state.members(key)
            if wholeness(spec, len(members)).missing:
                continue
            gang = self._line.gang(spec, None, members)
            if gang.need <= 0:
                continue
            self._line.join(key, ref, now)
            contest = self._line.contest(exclude=key)
            queue = queue_of(spec, members)
            queued = self._line.assess(gang, queue, contest.line, contest.holders)
            if queued.message is not None:
                continue
            room = room_left(contest.free, contest.holders, contest.positions)
            if not pack(gang.demands, room, gang.need).fits:
                self.reclaim(gang, ref, queued, contest.free, contest.holders, room)

    def _schedule(self) -> None:
        if self._timer is not None or self._reclaimer is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(0.1, self.check)
