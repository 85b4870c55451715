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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cachetools import TTLCache

from app.core.admission import Admission, DenyReason, FilterReason, Verdict, wholeness
from app.core.clock import Clock, monotonic, wall
from app.core.contention import Gang, Holder, Ruling, decide, order_line, room_left, wake_order
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.observer import GangObserver, NullObserver
from app.core.packing import Bin, Demand, pack, placement_of
from app.core.queues import starving
from app.core.resources import QuantityError, Resources, add, pod_requests
from app.core.state import ClusterState, GroupNotFound, PodRecord
from app.core.topology import (
    DEFAULT_LEVELS,
    Domain,
    TopologyConstraint,
    fits_one_domain,
    place,
    placed_message,
)
from app.core.topology_sources import constraint_of
from app.ops.metrics import Metrics
from app.runtime.gate import PermitGate, SettleOutcome
from app.runtime.queue_book import Assessment, QueueBook
from app.runtime.reclaimer import Reclaimer
from app.runtime.wakeup import SiblingWaker

log = logging.getLogger(__name__)

# How often the filter verb looks over every claim for one to drop (its
# PodGroup gone, or no member reached the gate in time). A claiming gang
# losing a member is looked at on the next filter call, whatever the time:
# that is the case where a stale claim would hold capacity for nothing.
PRUNE_INTERVAL_SECONDS = 0.25

_REASONS = {
    Ruling.WAIT: FilterReason.WAITING_BEHIND,
    Ruling.SHORT: FilterReason.INSUFFICIENT_CAPACITY,
}

# In kube-scheduler's FitError when its preemption found victims for the pod.
_PREEMPTING = "preemption: found a potential placement"


# How long a claim that made other gangs give way is not failed fast (see _Claim).
_GIVE_WAY_GRACE_SECONDS = 3.0


@dataclass(slots=True)
class _Claim:
    ref: GroupRef
    priority: int
    created: float
    # member key -> node the packing promised it.
    plan: dict[str, str]
    requests: dict[str, Resources]
    made_at: float
    # When the gang first waited in line (kept for aging if it is released).
    since: float | None
    # Members' PodScheduled messages when the claim was made: only a change counts.
    baseline: dict[str, str] = field(default_factory=dict)
    # The topology domain the whole gang was admitted in (None: no constraint, or anywhere).
    domain: Domain | None = None
    constraint: TopologyConstraint | None = None
    # Made by taking room from gangs that gave way: until then, a member that
    # kube-scheduler finds no node for is not failed fast (its own cache still
    # holds the released members until it handles their refused binds, and
    # forgetting them retries the member; a NodeResourcesFit rejection is not
    # retried by anything else).
    released_others_until: float = 0.0


@dataclass(slots=True)
class _Waiting:
    ref: GroupRef
    since: float


@dataclass(frozen=True, slots=True)
class Candidate:
    """The pod the filter verb is deciding about (it may not be in our watch yet)."""

    key: str
    uid: str
    priority: int
    raw_spec: Mapping[str, Any]
    # Kueue's topology annotations on the pod (it may not be in our watch yet).
    topology: TopologyConstraint | None = None


class Arbiter:
    def __init__(
        self,
        state: ClusterState,
        admission: Admission,
        gate: PermitGate,
        wait_seconds: Callable[[GroupSpec], float],
        *,
        waker: SiblingWaker | None = None,
        observer: GangObserver | None = None,
        aging_seconds: float = 60.0,
        clock: Clock = monotonic,
        levels: tuple[str, ...] = DEFAULT_LEVELS,
        metrics: Metrics | None = None,
        every_gang: bool = True,
        queues: QueueBook | None = None,
        reclaimer: Reclaimer | None = None,
    ) -> None:
        """every_gang: --gang-feasibility; False: only gangs with a topology constraint."""
        self._state = state
        self.every_gang = every_gang
        # Teams' shares (app/runtime/queue_book.py): consulted only once a Queue object exists.
        self.queues = queues
        self._reclaimer = reclaimer
        # group key -> its queue, for the gangs of the latest line.
        self._queue_of: dict[str, str] = {}
        # Gangs kube-scheduler found no node for (its own filters, before ours): may reclaim.
        self._unplaced: dict[str, GroupRef] = {}
        self._reclaim_check: asyncio.TimerHandle | None = None
        self.levels = levels
        self._metrics = metrics
        self._admission = admission
        self._gate = gate
        self._wait_seconds = wait_seconds
        self.waker = waker
        self._observer: GangObserver = observer or NullObserver()
        self.aging_seconds = aging_seconds
        self._clock = clock
        self.claims: dict[str, _Claim] = {}
        self.waiting: dict[str, _Waiting] = {}
        # pod uid -> recent messages our filter or gate gave it: its PodScheduled
        # condition quoting one of them is not a capacity failure.
        self._ours: TTLCache[str, tuple[str, ...]] = TTLCache(100_000, 300, timer=clock)
        self._reconsider: asyncio.TimerHandle | None = None
        # Bumped whenever capacity, claims or the line change; a group's last
        # rejection is reused while it stays current (a storm of retried
        # members of one gang costs one packing, not one per member).
        self._version = 0
        self._pruned_at = -math.inf
        # Claiming gangs that lost a member since the last prune.
        self._recheck: set[str] = set()
        self._memo: dict[str, tuple[int, int, Verdict]] = {}
        # group key -> (version, whether its required topology fits one domain now).
        self._fits: dict[str, tuple[int, bool]] = {}
        # claim key -> (its members' stamp, the claim, what it holds): see _holder().
        self._holders: dict[str, tuple[int, _Claim, Holder]] = {}

    # ---- the filter verb's question ------------------------------------------------------

    def applies(self, spec: GroupSpec, pod_topology: TopologyConstraint | None) -> bool:
        """Is the gang admitted as a whole here? Every gang with --gang-feasibility; without
        it, the gangs with a topology constraint: one domain is a whole-gang decision."""
        return self.every_gang or self.constraint(spec, pod_topology) is not None

    def admit(self, spec: GroupSpec, ref: GroupRef, pod: Candidate) -> Verdict:
        """May this member go on to a node now? Claims the gang's capacity when it may."""
        now = self._clock()
        self._prune(now)
        if spec.key in self.claims:
            return Verdict(True, FilterReason.HOLDING)
        memo = self._memo.get(spec.key)
        if memo is not None and memo[:2] == (self._version, int(now)):
            return memo[2]
        gang = self._gang(spec, pod)
        if gang.need <= 0:
            # Already whole (extra members beyond minMember): nothing to hold.
            return Verdict(True, FilterReason.COMPLETE)
        free, allocatable = self._bins()
        holders = self.holders()
        line = self._line(exclude=spec.key, free=free)
        queued: Assessment | None = None
        if self.queues is not None and self.queues.active:
            queue = self.queues.queue_of(spec, self._state.members(spec.key))
            queued = self._assess(gang, queue, line, holders)
            if queued.message is not None:
                return self._turn_away(spec.key, ref, now, FilterReason.QUEUE_SHARE, queued.message)
            line = queued.line
        constraint = self.constraint(spec, pod.topology)
        domain: Domain | None = None
        if constraint is None:
            decision = decide(gang, free, holders, line, now, self.aging_seconds, allocatable)
        else:
            placed = place(
                gang,
                constraint,
                self._state.topology_levels(self.levels),
                free,
                holders,
                line,
                now,
                self.aging_seconds,
                allocatable,
                [p.placed_node for p in self._state.placed_members(spec.key)],
                self._state.hypernodes.tier_names,
            )
            decision, domain = placed.decision, placed.domain
        if decision.verdict is not Ruling.ADMIT:
            message = decision.message
            if queued is not None:
                message += self._reclaim(gang, ref, queued, free, holders)
            return self._turn_away(spec.key, ref, now, _REASONS[decision.verdict], message)
        self._version += 1
        if self._reclaimer is not None:
            self._reclaimer.forget(spec.key)
        for key in decision.release:
            self._give_way(key, spec.key, gang.priority)
        since = self.waiting.pop(spec.key, None)
        self.claims[spec.key] = _Claim(
            ref=ref,
            priority=gang.priority,
            created=gang.created,
            plan=dict(decision.plan),
            requests={d.key: d.requests for d in gang.demands},
            made_at=now,
            since=since.since if since is not None else None,
            baseline={
                p.key: p.unschedulable_message
                for p in self._state.members(spec.key)
                if not p.placed_node
            },
            domain=domain,
            released_others_until=now + _GIVE_WAY_GRACE_SECONDS if decision.release else 0.0,
            constraint=constraint,
        )
        log.info(
            "gang claimed capacity for %d member(s)",
            len(decision.plan),
            extra={"podgroup": spec.key, "verb": "filter", "pod": pod.key},
        )
        if constraint is not None:
            self._placed(spec.key, constraint, domain, pod.key)
        if self.waker is not None:
            self.waker.wake(spec.key, exclude_uid=pod.uid)
        if queued is not None:
            # Its queue's share grew: a gang of another queue that was waiting
            # for this one to reach its share may go now, into room left free.
            self._schedule_reconsider()
        return Verdict(True, FilterReason.CLAIMED)

    def holders(self) -> list[Holder]:
        """What every admitted gang holds now (the queue status counts them)."""
        return [self._holder(k, c) for k, c in self.claims.items()]

    def _turn_away(
        self, key: str, ref: GroupRef, now: float, reason: FilterReason, message: str
    ) -> Verdict:
        """The gang waits in line: remembered for aging, its answer reused while nothing moves."""
        if key not in self.waiting:
            self.waiting[key] = _Waiting(ref, now)
            self._version += 1
        verdict = Verdict(False, reason, message)
        if len(self._memo) > 10_000:
            self._memo.clear()
        self._memo[key] = (self._version, int(now), verdict)
        return verdict

    def _assess(
        self, gang: Gang | None, queue: str, line: list[Gang], holders: list[Holder]
    ) -> Assessment:
        assert self.queues is not None
        return self.queues.assess(
            gang, queue, [(g, self._queue_of.get(g.key, queue)) for g in line], holders
        )

    def _reclaim(
        self,
        gang: Gang,
        ref: GroupRef,
        queued: Assessment,
        free: list[Bin],
        holders: list[Holder],
        room: list[Bin] | None = None,
    ) -> str:
        """A gang of a queue below its share does not fit: take room back (runtime/reclaimer.py).

        `room`: free less the holders' promises, when the caller has it already.
        """
        view = queued.views.get(queued.queue)
        if self._reclaimer is None or view is None or self.queues is None:
            return ""
        request: dict[str, int] = {}
        for demand in gang.demands:
            add(request, demand.requests)
        if not starving(replace(view, head=request), self.queues.overcommit):
            return ""
        if room is None:
            room, _index = room_left(free, holders)
        text = self._reclaimer.reclaim(gang, ref, queued.queue, queued.views, room, queued.running)
        return f"; {text}" if text else ""

    def constraint(
        self, spec: GroupSpec, pod_topology: TopologyConstraint | None = None
    ) -> TopologyConstraint | None:
        """The gang's topology constraint: its group object's, else its pods' annotations."""
        return constraint_of(
            spec.topology,
            ((p.key, p.topology) for p in self._state.members(spec.key)),
            pod_topology,
        )

    def domain(
        self, spec: GroupSpec, pod_topology: TopologyConstraint | None = None
    ) -> tuple[Domain, TopologyConstraint] | None:
        """The domain the gang's members must go to now, and why; None: any node.

        While the gang holds a claim: the domain it was admitted in. Otherwise
        (extra members of a whole gang, restarted members) a required level's
        domain its placed members share.
        """
        claim = self.claims.get(spec.key)
        if claim is not None:
            if claim.domain is None or claim.constraint is None:
                return None
            return claim.domain, claim.constraint
        constraint = self.constraint(spec, pod_topology)
        if constraint is None or not constraint.required:
            return None
        placed = [p.placed_node for p in self._state.placed_members(spec.key)]
        domain = self._state.placed_domain(constraint, self.levels, placed)
        return (domain, constraint) if domain is not None else None

    def _placed(
        self, key: str, constraint: TopologyConstraint, domain: Domain | None, pod: str
    ) -> None:
        text = placed_message(key, constraint, domain)
        log.info(
            text,
            extra={
                "podgroup": key,
                "pod": pod,
                "verb": "filter",
                "domain": domain.to_json() if domain is not None else None,
            },
        )
        if self._metrics is not None:
            self._metrics.topology_placements.labels(
                domain.level if domain is not None else "anywhere"
            ).inc()
        self._observer.gang_placed(key, text)

    def note_rejection(self, uid: str, message: str) -> None:
        """Our filter turned this pod away with `message` (not a capacity failure)."""
        if uid:
            self._ours[uid] = ((self._ours.get(uid) or ()) + (message,))[-4:]

    # ---- inputs of the pure decision ---------------------------------------------------

    def _gang(self, spec: GroupSpec, pod: Candidate | None) -> Gang:
        members = self._state.members(spec.key)
        demands = [Demand(p.key, p.requests, p.placement) for p in members if not p.placed_node]
        placed = wholeness(spec, len(members) - len(demands))
        priority = max((p.priority for p in members), default=0)
        if pod is not None:
            priority = max(priority, pod.priority)
            if not any(p.uid == pod.uid for p in members):
                # Our watch has not delivered the pod being filtered yet.
                with contextlib.suppress(QuantityError):
                    demands.append(
                        Demand(pod.key, pod_requests(pod.raw_spec), placement_of(pod.raw_spec))
                    )
        record = self._state.podgroups.get(spec.key)
        created = record.created if record is not None and record.created else 0.0
        if not created:
            created = min((p.created for p in members if p.created), default=wall())
        waiting = self.waiting.get(spec.key)
        share = 0.0
        if self.queues is not None and self.queues.active:
            share = self.queues.share(p for p in members if p.placed_node)
        return Gang(
            key=spec.key,
            priority=priority,
            created=created,
            demands=tuple(demands),
            need=min(len(demands), placed.missing),
            waiting_since=waiting.since if waiting is not None else None,
            share=share,
        )

    def _line(self, exclude: str, free: list[Bin] | None = None) -> list[Gang]:
        """The gangs waiting that may be admitted: in line (any order).

        A gang with a required topology level that no domain can hold now is
        left out: it cannot take room, and aged it must not hold back others.
        """
        line: list[Gang] = []
        for key, entry in list(self.waiting.items()):
            if key == exclude or key in self.claims:
                continue
            try:
                spec = self._state.group_spec(entry.ref)
            except (GroupNotFound, PodGroupSpecError):
                del self.waiting[key]
                continue
            gang = self._gang(spec, None)
            if gang.need <= 0:
                del self.waiting[key]
                continue
            if (
                wholeness(spec, len(self._state.members(key))).missing
                or key in self._admission.denied
            ):
                continue
            constraint = self.constraint(spec)
            if constraint is not None and constraint.required:
                if free is None:
                    free = self._state.room()
                if not self._fits_one_domain(gang, constraint, free):
                    continue
            if self.queues is not None and self.queues.active:
                if len(self._queue_of) > 10_000:
                    self._queue_of.clear()
                self._queue_of[key] = self.queues.queue_of(spec, self._state.members(key))
            line.append(gang)
        return line

    def _fits_one_domain(self, gang: Gang, constraint: TopologyConstraint, free: list[Bin]) -> bool:
        """fits_one_domain(), remembered while capacity, claims and the line stay the same."""
        known = self._fits.get(gang.key)
        if known is not None and known[0] == self._version:
            return known[1]
        if len(self._fits) > 10_000:
            self._fits.clear()
        placed = [p.placed_node for p in self._state.placed_members(gang.key)]
        fits = fits_one_domain(
            gang,
            constraint,
            self._state.topology_levels(self.levels),
            free,
            placed,
            self._state.hypernodes.tier_names,
        )
        self._fits[gang.key] = (self._version, fits)
        return fits

    def _bins(self) -> tuple[list[Bin], list[Bin]]:
        """(what is free on each schedulable node, its allocatable): the packing's input.

        The allocatable bins share the node records' dicts: packing never
        changes the bins it is given (app/core/packing.py).
        """
        allocatable = [
            Bin(node.name, node.allocatable, node.labels, node.taints)
            for node in self._state.nodes.values()
            if not node.unschedulable
        ]
        return self._state.room(), allocatable

    def _holder(self, key: str, claim: _Claim) -> Holder:
        """What a claiming gang holds; reused while neither the claim nor a member changed.

        Every fresh admission weighs itself against all claims, and with
        hundreds of gangs arriving interleaved (bench/e2e.py case (c)) this
        was the largest part of a gang member's filter.
        """
        stamp = self._state.group_stamp(key)
        cached = self._holders.get(key)
        if cached is not None and cached[0] == stamp and cached[1] is claim:
            return cached[2]
        if len(self._holders) > 2 * len(self.claims) + 64:
            self._holders = {k: v for k, v in self._holders.items() if k in self.claims}
        holder = self._compute_holder(key, claim)
        self._holders[key] = (stamp, claim, holder)
        return holder

    def _compute_holder(self, key: str, claim: _Claim) -> Holder:
        remaining: dict[str, Resources] = {}
        for pod_key, node in claim.plan.items():
            pod = self._state.pods.get(pod_key)
            if pod is not None and (pod.placed_node or not pod.counts_as_member):
                continue
            add(remaining.setdefault(node, {}), claim.requests.get(pod_key, {}))
        reserved: dict[str, Resources] = {}
        for pod in self._state.members(key):
            if pod.reserved_node and not pod.node_name:
                add(reserved.setdefault(pod.reserved_node, {}), pod.requests)
        return Holder(key, claim.priority, claim.created, remaining, reserved)

    # ---- keeping claims honest -------------------------------------------------------------

    def _prune(self, now: float) -> None:
        """Drop claims that no longer stand; every claim only once per PRUNE_INTERVAL_SECONDS.

        It runs on every filter call, so looking at hundreds of claims each
        time cost more than the rest of a gang member's filter.
        """
        if now - self._pruned_at >= PRUNE_INTERVAL_SECONDS:
            self._pruned_at = now
            keys = list(self.claims)
        else:
            keys = [k for k in self._recheck if k in self.claims]
        self._recheck.clear()
        for key in keys:
            claim = self.claims[key]
            try:
                spec = self._state.group_spec(claim.ref)
            except (GroupNotFound, PodGroupSpecError):
                self._drop(key)
                continue
            if wholeness(spec, len(self._state.members(key))).missing:
                self._drop(key)
            elif not self._gate.waiting(key) and now - claim.made_at > self._wait_seconds(spec):
                log.info(
                    "claim dropped: no member reached the gate in time",
                    extra={"podgroup": key},
                )
                self._drop(key)

    def _drop(self, key: str) -> None:
        self._version += 1
        claim = self.claims.pop(key, None)
        if claim is not None:
            self._schedule_reconsider()

    def on_settled(self, key: str, outcome: SettleOutcome) -> None:
        """The gate bound or released the gang's wave: its claim ends."""
        self._version += 1
        claim = self.claims.pop(key, None)
        if outcome is SettleOutcome.RELEASED and claim is not None:
            # Back in line, keeping its place for aging.
            self.waiting[key] = _Waiting(claim.ref, claim.since or claim.made_at)
        self._schedule_reconsider()

    def _give_way(self, key: str, winner: str, priority: int) -> None:
        self._version += 1
        claim = self.claims.pop(key, None)
        if claim is None:
            return
        message = (
            f"gang {key} (priority {claim.priority}) gave way to gang {winner} (priority "
            f"{priority}), which became complete and needs the capacity it held; its "
            f"reserved members were released and it waits behind {winner}"
        )
        log.info(message, extra={"podgroup": key, "verb": "filter"})
        self.waiting[key] = _Waiting(claim.ref, claim.since or claim.made_at)
        released = self._gate.release_group(key, message)
        for member in released:
            self.note_rejection(member.uid, message)
        self._observer.gang_released(key, released, message)

    def on_nodes_changed(self) -> None:
        """A node added (or grown, or uncordoned) may let gangs in line fit."""
        self._version += 1
        self._schedule_reconsider()

    def on_queues_changed(self) -> None:
        """A Queue was added, changed or deleted: shares move, the line may move."""
        self._version += 1
        self._schedule_reconsider()

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """Wake the line when capacity frees, fail a claim fast."""
        if (
            old is not None
            and old.group is not None
            and old.group.key in self.claims
            and (new is None or not new.counts_as_member)
        ):
            self._recheck.add(old.group.key)
        if (
            old is None
            or new is None
            or old.placed_node != new.placed_node
            or old.counts_as_member != new.counts_as_member
            or old.terminal != new.terminal
        ):
            self._version += 1
        if (
            old is not None
            and old.placed_node
            and not old.terminal
            and (new is None or new.terminal or new.deleting or not new.placed_node)
        ):
            self._schedule_reconsider()
        if new is None or old is None or new.group is None or new.uid != old.uid:
            return
        if (
            self.queues is not None
            and self.queues.active
            and new.unschedulable_message
            and new.unschedulable_message != old.unschedulable_message
            and not new.placed_node
            and new.group.key not in self.claims
        ):
            self._unplaced[new.group.key] = new.group
            self._schedule_reclaim_check()
        claim = self.claims.get(new.group.key)
        message = new.unschedulable_message
        if (
            claim is None
            or new.placed_node
            or not message
            or message == old.unschedulable_message
            or message == claim.baseline.get(new.key)
            or any(ours in message for ours in self._ours.get(new.uid) or ())
            # kube-scheduler is evicting pods to make room for it: it will be placed.
            or new.nominated_node
            or _PREEMPTING in message
            or self._clock() < claim.released_others_until
        ):
            return
        self._fail_fast(new.group.key, claim, new, message)

    def _fail_fast(self, key: str, claim: _Claim, pod: PodRecord, why: str) -> None:
        self._version += 1
        self.claims.pop(key, None)
        ttl = self._admission.denied_ttl_seconds
        message = (
            f"gang {key} released its reservations at once: member {pod.name} found no node "
            f"({why}); the whole gang is retried in {ttl:g}s"
        )
        log.info(message, extra={"podgroup": key, "pod": pod.key, "reason": DenyReason.CAPACITY})
        self.waiting[key] = _Waiting(claim.ref, claim.since or claim.made_at)
        released = self._gate.release_group(key, message)
        for member in released:
            self.note_rejection(member.uid, message)
        self._admission.deny(key, DenyReason.CAPACITY, message)
        self._observer.gang_released(key, released, message)
        if self.waker is not None:
            self.waker.wake_after(key, ttl + 0.1)
        self._schedule_reconsider()

    # ---- reclaim for gangs kube-scheduler turned away itself ----------------------------

    def _schedule_reclaim_check(self) -> None:
        if self._reclaim_check is not None or self._reclaimer is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._reclaim_check = loop.call_later(0.1, self.check_reclaims)

    def retry_reclaim(self, gang_key: str) -> None:
        """The gang's reclaim was refused (a disruption budget): look for other victims soon."""
        waiting = self.waiting.get(gang_key)
        if waiting is None:
            return
        self._version += 1
        self._unplaced[gang_key] = waiting.ref
        self._schedule_reclaim_check()

    def check_reclaims(self) -> None:
        """Gangs kube-scheduler found no node for: reclaim for those of queues below their share.

        When the cluster is full, kube-scheduler's own resource filter turns a
        member away before our filter verb is asked, so the verb alone would
        never see a gang that only reclaim can place. They join the line too,
        to be woken when room frees.
        """
        self._reclaim_check = None
        pending, self._unplaced = self._unplaced, {}
        if self.queues is None or not self.queues.active:
            return
        now = self._clock()
        for key, ref in pending.items():
            if key in self.claims or key in self._admission.denied:
                continue
            try:
                spec = self._state.group_spec(ref)
            except (GroupNotFound, PodGroupSpecError):
                continue
            members = self._state.members(key)
            if wholeness(spec, len(members)).missing:
                continue
            gang = self._gang(spec, None)
            if gang.need <= 0:
                continue
            if key not in self.waiting:
                self.waiting[key] = _Waiting(ref, now)
                self._version += 1
            free, _allocatable = self._bins()
            holders = self.holders()
            queue = self.queues.queue_of(spec, members)
            queued = self._assess(gang, queue, self._line(exclude=key, free=free), holders)
            if queued.message is not None:
                continue
            room, _index = room_left(free, holders)
            if not pack(gang.demands, room, gang.need).fits:
                self._reclaim(gang, ref, queued, free, holders, room)

    # ---- waking the line -------------------------------------------------------------------

    def _schedule_reconsider(self) -> None:
        if self._reconsider is not None or self.waker is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._reconsider = loop.call_later(0.05, self._wake_line)

    def _wake_line(self) -> None:
        self._reconsider = None
        if self.waker is None or not self.waiting:
            return
        now = self._clock()
        free, allocatable = self._bins()
        holders = self.holders()
        line = self._line(exclude="", free=free)
        if self.queues is not None and self.queues.active:
            line = self._assess(None, "", line, holders).line
        for key in wake_order(
            line, free, holders, now, self.aging_seconds, allocatable=allocatable
        ):
            self.waker.wake(key)

    def snapshot(self) -> dict[str, Any]:
        """For /debug/gangs: who holds capacity, who waits, in line order (and each queue)."""
        now = self._clock()
        queues = (
            {"queues": self.queues.snapshot()}
            if self.queues is not None and self.queues.active
            else {}
        )
        return queues | {
            "claims": [
                {"group": k, "priority": c.priority, "members": len(c.plan)}
                # The topology domain, only for gangs placed in one (app/core/topology.py).
                | ({"domain": c.domain.to_json()} if c.domain is not None else {})
                for k, c in self.claims.items()
            ],
            "line": [
                {
                    "group": g.key,
                    "priority": g.priority,
                    "waitingSeconds": round(now - (g.waiting_since or now), 2),
                    "aged": g.aged(now, self.aging_seconds),
                }
                for g in order_line(self._line(exclude=""), now, self.aging_seconds)
            ],
        }
