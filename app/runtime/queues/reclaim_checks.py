"""Reclaim for gangs of queues below their share that do not fit (app/runtime/queues/reclaimer.py).

Two ways in: the filter verb turned such a gang away (`reclaim()`), or
kube-scheduler found no node for one of its members before our filter was
asked (`unplaced()`, then `check()` a moment later). When the cluster is full,
kube-scheduler's own resource filter turns a member away first, so the verb
alone would never see a gang that only reclaim can place.

Reclaim judges the room by the gang's own admission (`fits_test`): the
decision the filter verb makes (GangTopology.decide: one domain of a required
level, each slice in its own, LWS exclusive topology, else a thorough
packing) over the room alone, and names the domains of its required level so
that victims in one of them are tried on their own; for a gang constrained
only on its slices, the domains of the slices' level and the slices' shape
(`slice_room`), so that victims are taken only in the domains they take.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from app.core.admission import Admission, wholeness
from app.core.clock import Clock
from app.core.contention import Contest, Gang, Ruling, room_left
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.packing import Bin
from app.core.queues import starving
from app.core.reclaim import Fits
from app.core.reclaim_slices import SliceRoom
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState
from app.core.topology.domains import TopologyError, by_domain
from app.core.topology.subgroups import Path
from app.runtime.claims import ClaimLedger
from app.runtime.gang_topology import GangTopology
from app.runtime.line import Candidate, Line
from app.runtime.queues.book import Assessment
from app.runtime.queues.reclaimer import Reclaimer
from app.runtime.queues.tally import queue_of
from app.runtime.queues.verdicts import request_of


@dataclass(frozen=True, slots=True)
class Needy:
    """The gang reclaim is for, as its admission sees it: its group (reference and spec)
    and the pod asked about."""

    ref: GroupRef
    spec: GroupSpec
    pod: Candidate | None = None


class Admitting(NamedTuple):
    """The arbiter's parts the checks read: the claims held, the line of waiting gangs,
    and how a gang is placed (its own fits test)."""

    ledger: ClaimLedger
    line: Line
    topology: GangTopology
    # --gang-feasibility: every gang waits in the line (else only those with a topology).
    every_gang: bool = True


def fits_test(topology: GangTopology, gang: Gang, needy: Needy) -> Fits:
    """Whether `gang` fits in a room by its own admission: the filter verb's decision over
    that room alone (a gang with a required rack fits only where one rack holds it; room
    freed in racks it cannot span is no room, docs/queues.md "Reclaim")."""
    spec, pod = needy.spec, needy.pod
    constraint = topology.constraint(spec, pod.topology if pod is not None else None)

    def fits(bins: Sequence[Bin]) -> bool:
        try:
            decision, _, _ = topology.decide(gang, constraint, Contest(bins), 0.0, 0.0, spec, pod)
        except TopologyError:  # slices the gang cannot have: no room will do
            return False
        return decision.verdict is Ruling.ADMIT

    return fits


def required_domains(
    topology: GangTopology, needy: Needy, room: Sequence[Bin]
) -> list[frozenset[str]]:
    """The nodes of each domain of the gang's required level(s) (none: it may go anywhere),
    for choose_victims() to try the victims of each on their own."""
    pod = needy.pod
    constraint = topology.constraint(needy.spec, pod.topology if pod is not None else None)
    if constraint is None:
        return []
    levels, anywhere = topology.resolver()(constraint)
    if anywhere:
        return []
    return [
        frozenset(b.name for b in group)
        for level in levels
        for group in by_domain(room, level).values()
    ]


def slice_room(
    topology: GangTopology, gang: Gang, needy: Needy, room: Sequence[Bin]
) -> SliceRoom | None:
    """For a gang with no required level of its own whose outermost constrained sub-groups
    (slices) share one required constraint: the domains of its level(s) and the slices'
    shape, for choose_victims() to take victims only in the domains they take (None: not
    such a gang; sub-groups of several constraints are left to the fits test alone)."""
    try:
        tree = topology.tree(needy.spec, needy.pod)
    except TopologyError:
        return None
    if tree is None or not tree.groups:
        return None
    counts: dict[Path, int] = {}
    sliced = []
    for demand in gang.demands:
        chain = tree.constrained(tree.paths.get(demand.key, ()))
        if chain:
            counts[chain[0].path] = counts.get(chain[0].path, 0) + 1
            sliced.append(demand)
    constraints = {group.constraint for group in tree.groups if group.path in counts}
    if len(constraints) != 1:
        return None
    (constraint,) = constraints
    assert constraint is not None
    levels, anywhere = topology.resolver()(constraint)
    if anywhere or not levels:
        return None  # a slice may straddle domains: any room will do
    # What every member asks at least: a node's slots of it bound the members it may take.
    least = {r: min(d.requests.get(r, 0) for d in sliced) for r in sliced[0].requests}
    return SliceRoom(
        tuple(
            tuple(frozenset(b.name for b in group) for group in by_domain(room, level).values())
            for level in levels
        ),
        least,
        min(counts.values()),
        len(counts),
        loose=len(sliced) < len(gang.demands),
    )


class ReclaimChecks:
    """Which gangs reclaim is asked about, and when."""

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        admitting: Admitting,
        reclaimer: Reclaimer | None,
        clock: Clock,
    ) -> None:
        self._state = state
        self._admission = admission
        self._ledger, self._line, self._topology, self._every_gang = admitting
        self._reclaimer = reclaimer
        self._clock = clock
        # Gangs kube-scheduler found no node for (its own filters, before ours): may reclaim.
        self._unplaced: dict[str, GroupRef] = {}
        self._timer: asyncio.TimerHandle | None = None

    def reclaim(
        self,
        gang: Gang,
        needy: Needy,
        queued: Assessment,
        contest: Contest,
        room: list[Bin] | None = None,
    ) -> str | None:
        """A gang of a queue below its share does not fit: take room back; what was done.

        None: reclaim does not apply (no reclaimer, or the queue is not below its
        share); "": the reclaimer was asked and did nothing. What the reclaimer says
        depends on the clock too (evictions under way expire).
        `needy`: the gang's group (and the pod asked about), for its own fits test.
        `contest`: what its admission weighed (the free room and the holders).
        `room`: free less the holders' promises, when the caller has it already.
        """
        view = queued.views.get(queued.queue)
        book = self._line.queues
        if self._reclaimer is None or view is None or book is None:
            return None
        if not starving(replace(view, head=request_of(gang)), book.overcommit):
            return None
        if room is None:
            room = room_left(contest.free, contest.holders, contest.positions)
        domains = required_domains(self._topology, needy, room)
        text = self._reclaimer.reclaim(
            gang,
            needy.ref,
            queued.queue,
            queued.views,
            room,
            queued.running,
            fits_test(self._topology, gang, needy),
            domains,
            None if domains else slice_room(self._topology, gang, needy, room),
        )
        return f"; {text}" if text else ""

    def unplaced(self, old: PodRecord, new: PodRecord) -> None:
        """kube-scheduler may have found no node for a member of a gang holding no claim:
        its own filters (not enough CPU on any node) turned it away before ours was asked."""
        assert new.group is not None
        message = new.unschedulable_message
        if (
            message
            # Any reason where queues may reclaim; else short of room only. Other reasons
            # (anti-affinity, volumes) are not what the line models: such a gang aged in
            # line would hold room back for a placement kube-scheduler refuses.
            and (self._line.queues is not None or new.refused_for_room)
            and message != old.unschedulable_message
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
        """The gangs kube-scheduler found no node for join the line (they wait for room as
        any gang our filter turned away: their place, aging, a wake-up when room frees);
        those of queues below their share reclaim.

        A gang whose members kube-scheduler's own filters turned away (every node short
        of CPU once the gangs ahead were bound) was never asked about by our filter: out
        of line, it lost its place to gangs created after it (found by the deep-line
        smoke test under load: one gang of 18 never joined).
        """
        self._timer = None
        pending, self._unplaced = self._unplaced, {}
        book = self._line.queues
        now = self._clock()
        for key, ref in pending.items():
            if key in self._ledger.held or key in self._admission.denied:
                continue
            try:
                spec = self._state.group_spec(ref)
            except (GroupNotFound, PodGroupSpecError):
                continue
            if not (self._every_gang or self._topology.applies(spec, None)):
                continue
            members = self._state.members(key)
            if wholeness(spec, len(members)).missing:
                continue
            gang = self._line.gang(spec, None, members)
            if gang.need <= 0:
                continue
            self._line.join(key, ref, now)
            if book is None or self._reclaimer is None:
                continue
            contest = self._line.contest(exclude=key)
            queue = queue_of(spec, members)
            queued = self._line.assess(gang, queue, contest.line, contest.holders)
            if queued.message is not None:
                continue
            room = room_left(contest.free, contest.holders, contest.positions)
            needy = Needy(ref, spec)
            if not fits_test(self._topology, gang, needy)(room):
                self.reclaim(gang, needy, queued, contest, room)

    def _schedule(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(0.1, self.check)
