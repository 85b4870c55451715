"""Plumbing for gangs under contention: feeds app/core/contention.py and acts on its answers.

The filter verb asks `admit()` once a group passed the Coscheduling rules
(app/core/admission.py). The arbiter builds the inputs of the pure decision from
the cluster state (free capacity per node, the gangs holding claims, the
gangs waiting in line) and then does what the decision says: records the
claim, releases the reservations of lower-priority gangs that must give way,
or turns the member away with the message that names the gang ahead or the
capacity that is missing.

It also keeps claims honest as the cluster moves:
- the gate reports when a gang's wave was bound or released (claim ends);
- a member of a claiming gang that kube-scheduler finds no node for (its
  PodScheduled condition turns Unschedulable with a message that is not
  ours) fails the whole gang at once: its reservations are released and the
  group backs off for --denied-pg-expiration-seconds (fail fast, instead of
  holding the capacity until the gate's timeout);
- a claim whose members never reached the gate within the group's wait is
  dropped;
- whenever capacity frees up (a placed pod finished or went away, a gang was
  released), the gangs in line that now fit are woken, in line order.
Everything runs on the event loop; no I/O here except through the waker and
the gate.

Its parts, one job each: the claims (app/runtime/claims.py), the line
(app/runtime/line.py), the topology lookup (app/runtime/gang_topology.py),
releasing claims early (app/runtime/claim_release.py) and reclaim for queues
(app/runtime/queues/reclaim_checks.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from app.core.admission import Admission, FilterReason, Verdict
from app.core.contention import Decision, Gang, Holder, Ruling
from app.core.devices.shortfall import ShortfallMemo
from app.core.groups import GroupRef, GroupSpec
from app.core.records import PodRecord
from app.core.state import ClusterState
from app.core.topology.domains import Domain, TopologyConstraint, TopologyError
from app.runtime.answers import Answers
from app.runtime.arbiter_setup import ArbiterPeers, ArbiterSettings
from app.runtime.claim_release import ClaimRelease
from app.runtime.claims import Claim, ClaimLedger
from app.runtime.gang_topology import GangTopology, Held
from app.runtime.gate import PermitGate
from app.runtime.holds import HoldPeers, LineHolds
from app.runtime.line import Candidate, Line
from app.runtime.line_gangs import Waiting
from app.runtime.line_warmup import LineWarmup
from app.runtime.queues.book import Assessment
from app.runtime.queues.reclaim_checks import Admitting, Needy, ReclaimChecks
from app.runtime.queues.tally import queue_of
from app.runtime.reconsider import Reconsider
from app.runtime.revision import Revision
from app.runtime.waiting_room import SettleOutcome

__all__ = ["Arbiter"]

log = logging.getLogger(__name__)

_REASONS = {
    Ruling.WAIT: FilterReason.WAITING_BEHIND,
    Ruling.SHORT: FilterReason.INSUFFICIENT_CAPACITY,
}

# How long a claim that made other gangs give way is not failed fast (see Claim).
_GIVE_WAY_GRACE_SECONDS = 3.0


class Arbiter:
    """The one the filter verb and the watches talk to; its parts never talk to them."""

    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        gate: PermitGate,
        wait_seconds: Callable[[GroupSpec], float],
        peers: ArbiterPeers | None = None,
        settings: ArbiterSettings | None = None,
    ) -> None:
        peers = peers or ArbiterPeers()
        self.settings = settings = settings or ArbiterSettings()
        self._state = state
        self._clock = settings.clock
        self.waker = peers.waker
        self._reclaimer = peers.reclaimer
        self._revision = Revision()
        self.shortfalls = ShortfallMemo()  # the gangs' device shortfalls, kept for retries
        self.ledger = ClaimLedger(state, self._revision, gate, wait_seconds)
        self.topology = GangTopology(
            state, settings.levels, self._revision, peers.metrics, peers.observer
        )
        self.line = Line(state, admission, self.topology, peers.queues, self._revision, self.ledger)
        self._release = ClaimRelease(self.ledger, self.line, gate, admission, peers, self._clock)
        admitting = Admitting(self.ledger, self.line, self.topology, settings.every_gang)
        self._reclaims = ReclaimChecks(state, admission, admitting, peers.reclaimer, self._clock)
        self._reconsider = Reconsider(
            self.line, self.waker, self._prune, settings.aging_seconds, self._clock
        )
        self._schedule_reconsider = self._reconsider.schedule
        # A gang's last rejection, reused while nothing it weighed changed.
        self.answers = Answers(
            state, self._revision, admission, self.line, self.ledger, settings.aging_seconds
        )
        # The line's gangs built and its walk done ahead, in slices (started by the service).
        self.warmup = LineWarmup(
            state, self.line, self._revision, self._clock, settings.aging_seconds
        )
        # Members held out of kube-scheduler's queue while their gang waits (started by the
        # service; without a waker nothing is ever released, so nothing is held).
        self.holds = self._reconsider.holds = (
            LineHolds(
                state,
                (self.line, self.ledger),
                HoldPeers(self.waker, peers.observer, self._schedule_reconsider),
                enabled=settings.hold,
                clock=self._clock,
            )
            if self.waker is not None
            else None
        )

    @property
    def claims(self) -> dict[str, Claim]:
        """The gangs holding a claim, by group key."""
        return self.ledger.held

    @property
    def waiting(self) -> dict[str, Waiting]:
        """The gangs in line, by group key."""
        return self.line.waiting

    # ---- the filter verb's question ------------------------------------------------------

    def applies(self, spec: GroupSpec, pod: Candidate | None) -> bool:
        """Is the gang admitted as a whole here? Every gang with --gang-feasibility, else
        those with a topology constraint or slices (one domain each: a whole-gang decision)."""
        return self.settings.every_gang or self.topology.applies(spec, pod)

    def admit(self, spec: GroupSpec, ref: GroupRef, pod: Candidate) -> Verdict:
        """May this member go on to a node now? Claims the gang's capacity when it may."""
        now = self._clock()
        self._prune(now)
        if spec.key in self.claims:
            return Verdict(True, FilterReason.HOLDING)
        gang = self.line.gang(spec, pod)
        if gang.need <= 0:
            # Already whole (extra members beyond minMember): nothing to hold.
            return Verdict(True, FilterReason.COMPLETE)
        stamps = (self._state.group_stamp(gang.key), self._revision.version)
        if short := self.shortfalls.of(gang, self._state.devices, self.ledger.holders, stamps):
            self.line.join(gang.key, ref, now)
            return Verdict(False, FilterReason.INSUFFICIENT_CAPACITY, short)
        if (answered := self.answers.recall(gang, now)) is not None:
            return answered
        contest = self.line.contest(exclude=spec.key)
        queued: Assessment | None = None
        book = self.line.queues
        if book is not None:
            queue = queue_of(spec, self._state.members(spec.key))
            queued = self.line.assess(gang, queue, contest.line, contest.holders)
            if queued.message is not None:
                verdict = Verdict(False, FilterReason.QUEUE_SHARE, queued.message)
                return self._turn_away(gang, ref, now, verdict)
            contest.line = queued.line
        constraint = self.topology.constraint(spec, pod.topology)
        aging = self.settings.aging_seconds
        # The line walked before: a fresh gang packs into the room after it, one in line into
        # the room before its place (Walked.room_for).
        contest.walked = self.line.walked(contest, now, aging, gang)
        try:  # TopologyError: slices the gang cannot have
            decision, domain, held = self.topology.decide(
                gang, constraint, contest, now, aging, spec, pod
            )
        except TopologyError as err:
            return self._turn_away(gang, ref, now, Verdict(False, FilterReason.BAD_GROUP, str(err)))
        if decision.verdict is not Ruling.ADMIT:
            reclaimed = None
            if queued is not None:
                reclaimed = self._reclaims.reclaim(gang, Needy(ref, spec, pod), queued, contest)
            message = decision.message + (reclaimed or "")
            verdict = Verdict(False, _REASONS[decision.verdict], message)
            return self._turn_away(gang, ref, now, verdict, reclaimed is not None)
        self._claim(gang, ref, decision, now, (constraint, domain, held or {}))
        self.topology.announce(spec.key, len(decision.plan), pod.key, (constraint, domain, held))
        if self.waker is not None:
            self.waker.wake(spec.key, exclude_uid=pod.uid)
        if queued is not None:
            # Its queue's share grew: a gang of another queue that was waiting
            # for this one to reach its share may go now, into room left free.
            self._schedule_reconsider()
        return Verdict(True, FilterReason.CLAIMED)

    def _claim(
        self,
        gang: Gang,
        ref: GroupRef,
        decision: Decision,
        now: float,
        where: tuple[TopologyConstraint | None, Domain | None, Held],
    ) -> None:
        """The gang is admitted: the gangs it takes room from give way, it leaves the line."""
        self._revision.bump()
        if self._reclaimer is not None:
            self._reclaimer.forget(gang.key)
        for key in decision.release:
            self._release.give_way(key, gang.key, gang.priority)
        grace_until = now + _GIVE_WAY_GRACE_SECONDS if decision.release else 0.0
        self.ledger.make(gang, ref, decision, self.line.leave(gang.key), where, (now, grace_until))

    def holders(self) -> list[Holder]:
        """What every admitted gang holds now (the queue status counts them)."""
        return self.ledger.holders()

    def _turn_away(
        self, gang: Gang, ref: GroupRef, now: float, verdict: Verdict, paced: bool = False
    ) -> Verdict:
        """The gang waits in line: remembered for aging, its verdict kept for its retries."""
        self.line.join(gang.key, ref, now)
        self.answers.keep(gang, self.line.waiting[gang.key].since, verdict, now, paced=paced)
        return verdict

    def domain(
        self,
        spec: GroupSpec,
        pod_topology: TopologyConstraint | None = None,
        pod: Candidate | None = None,
    ) -> tuple[Domain, TopologyConstraint] | None:
        """The domain the gang's member must go to now (its sub-group's), and why; None: any."""
        return self.topology.domain(spec, pod_topology, self.claims.get(spec.key), pod)

    def note_rejection(self, uid: str, message: str) -> None:
        """Our filter turned this pod away with `message` (not a capacity failure)."""
        self._release.note_rejection(uid, message)

    # ---- keeping claims honest -------------------------------------------------------------

    def _prune(self, now: float) -> None:
        for key in self.ledger.stale(now):
            if self.ledger.end(key) is not None:
                self._schedule_reconsider()

    def on_settled(self, key: str, outcome: SettleOutcome) -> None:
        """The gate bound or released the gang's wave: its claim ends."""
        if self._release.settled(key, outcome is SettleOutcome.RELEASED):
            self._revision.bump()
        self._schedule_reconsider()

    def on_nodes_changed(self) -> None:
        """A node added (or grown, or uncordoned) may let gangs in line fit."""
        self._revision.bump()
        self._schedule_reconsider()

    def on_queues_changed(self) -> None:
        """A Queue was added, changed or deleted: shares move, the line may move."""
        self._revision.bump()
        self._schedule_reconsider()

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """Wake the line when capacity frees, fail a claim fast; held gangs join the line."""
        if self.holds is not None:
            self.holds.on_pod_change(old, new)
        if (
            old is not None
            and old.group is not None
            and old.group.key in self.claims
            and (new is None or not new.counts_as_member)
        ):
            self.ledger.recheck(old.group.key)
            self._schedule_reconsider()  # no filter call may come to end its claim (issue 49)
        if (
            old is None
            or new is None
            or old.placed_node != new.placed_node
            or old.counts_as_member != new.counts_as_member
            or old.terminal != new.terminal
        ):
            self._revision.bump()
        if (
            old is not None
            and old.placed_node
            and not old.terminal
            and (new is None or new.terminal or new.deleting or not new.placed_node)
        ) or (self.holds is not None and _unnominated(old, new)):
            self._schedule_reconsider()
        if new is None or old is None or new.group is None or new.uid != old.uid:
            return
        self._reclaims.unplaced(old, new)
        if self._release.fail_fast(old, new):
            self._schedule_reconsider()

    # ---- reclaim for gangs kube-scheduler turned away itself ----------------------------

    def retry_reclaim(self, gang_key: str) -> None:
        """The gang's reclaim was refused (a disruption budget): look for other victims soon."""
        if self._reclaims.retry(gang_key):
            self._revision.bump()

    def check_reclaims(self) -> None:
        """Gangs kube-scheduler found no node for: reclaim for those of queues below their share."""
        self._reclaims.check()

    # ---- waking the line -------------------------------------------------------------------

    @property
    def reconsidering(self) -> bool:
        """The line's reconsidering is scheduled and has not run yet (tests wait on it)."""
        return self._reconsider.pending

    def snapshot(self) -> dict[str, Any]:
        """For /debug/gangs: who holds capacity, who waits, in line order (and each queue)."""
        now = self._clock()
        book = self.line.queues
        queues = {"queues": book.snapshot()} if book is not None else {}
        held = {"held": self.holds.snapshot()} if self.holds is not None else {}
        line = {"line": self.line.snapshot(now, self.settings.aging_seconds)}
        return queues | {"claims": self.ledger.snapshot()} | line | held


def _unnominated(old: PodRecord | None, new: PodRecord | None) -> bool:
    """A pod kube-scheduler kept room for, not placed, lost its nomination (or went): held
    gangs may fit in what kube-scheduler sees free now (app/core/fit_now.py)."""
    return (
        old is not None
        and bool(old.nominated_node)
        and not old.placed_node
        and (new is None or not (new.nominated_node or new.placed_node))
    )
