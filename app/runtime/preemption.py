"""Gang-aware preemption: the one owner of what is evicted, for whom, and until when.

kube-scheduler's DefaultPreemption picks, per node, the lowest-priority pods
whose removal lets the preemptor fit, then asks extenders to confirm. It
knows nothing of gangs. For a **plain preemptor** we only refuse candidates
that would break a running gang (`select_victims`); kube-scheduler orders the
survivors. For a **gang member** the first preempt call makes one plan for
the whole gang (app/core/preemption_planner.py: the nodes its missing members go
to and the fewest victims on them), and every member's call is answered
from that plan: a member gets its planned node with that node's victims, or
nothing when its room is free or being freed already. No new victims while
the plan lives; it is made again only once it ended (done, expired, or
cancelled because a fact it rested on changed).

Every other component asks `PreemptionPlans` instead of keeping preemption
state: the gate whether a waiting pod is a victim (`is_victim`), the
evictor whom a victim made room for (`beneficiary`), /debug the live
plans. It wakes the members waiting for room when their victims are gone,
including victims kube-scheduler only held (never bound), whose deletion
it does not treat as a reason to retry the preemptor. No I/O of its own:
the waker and the observers do the writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.admission import wholeness
from app.core.clock import Clock, monotonic
from app.core.groups import GroupRef, GroupSpec, PodGroupSpecError
from app.core.observer import GangObserver, NullObserver
from app.core.packing import Bin, Demand, index_of
from app.core.preemption_planner import Evictable, PlanResult, plan, plan_in_domains
from app.core.resources import Resources, add, shortfall, subtract
from app.core.state import ClusterState, GroupNotFound, PodRecord
from app.core.topology import (
    DEFAULT_LEVELS,
    Domain,
    TopologyConstraint,
    by_domain,
    common_domain,
    level_origin,
    levels_to_try,
    short_level,
)
from app.core.topology_sources import constraint_of
from app.ops.metrics import Metrics
from app.runtime.wakeup import SiblingWaker

log = logging.getLogger(__name__)

# How long a plan may take from the first eviction to the gang holding its
# nodes: victims' grace period (30 s by default) and the members' scheduling.
PLAN_SECONDS = 60.0
# How long a pod handed to kube-scheduler as a victim is remembered (gate hold, Events).
VICTIM_MEMORY_SECONDS = 30.0
# After a held (never bound) victim is gone, its preemptor is woken again this
# much later: kube-scheduler forgets the assumed victim only once it handled
# the bind verb's answer, and a preemptor woken before that fails once more.
PREEMPTOR_RETRY_SECONDS = 2.0


class VictimPolicy(StrEnum):
    # A gang member may be a victim only while its gang keeps minMember placed.
    PROTECT = "protect"
    # A gang member may be a victim only together with its whole gang.
    WHOLE_GANG = "whole-gang"


class PlanKind(StrEnum):
    PREEMPTION = "preemption"  # made by the preempt verb: slots on nodes, victims per slot
    RECLAIM = "reclaim"  # queue reclaim (app/runtime/reclaimer.py): whole gangs evicted, no slots


class PlanPhase(StrEnum):
    PLANNED = "planned"  # made; no victim handed to kube-scheduler yet
    EVICTING = "evicting"  # victims handed, some still on their nodes
    PLACING = "placing"  # every victim gone: members are being placed
    DONE = "done"  # the gang holds minMember (bound or reserved)
    EXPIRED = "expired"
    CANCELLED = "cancelled"


ENDED = frozenset({PlanPhase.DONE, PlanPhase.EXPIRED, PlanPhase.CANCELLED})


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node kube-scheduler would preempt on, and the victims it chose (read by web/wire.py)."""

    node: str
    victim_uids: list[str]
    num_pdb_violations: int


@dataclass(frozen=True, slots=True)
class Preemptor:
    key: str
    uid: str
    priority: int
    group_key: str | None


# ---- plain preemptors: refuse candidates that would break a running gang --------------


@dataclass
class Selection:
    candidates: list[Candidate]
    # node -> why it was dropped, for the debug log.
    dropped: dict[str, str] = field(default_factory=dict)


def _victim_group(state: ClusterState, pod: PodRecord) -> GroupSpec | None:
    """The gang a victim belongs to, None for a plain pod (or a broken group label)."""
    if pod.group is None:
        return None
    try:
        return state.group_spec(pod.group)
    except (GroupNotFound, PodGroupSpecError):
        return None


def select_victims(
    preemptor: Preemptor, candidates: list[Candidate], state: ClusterState, policy: VictimPolicy
) -> Selection:
    selection = Selection([])
    for candidate in candidates:
        verdict = _judge(preemptor, candidate, state, policy)
        if isinstance(verdict, str):
            selection.dropped[candidate.node] = verdict
        else:
            selection.candidates.append(verdict)
    return selection


def _judge(
    preemptor: Preemptor, candidate: Candidate, state: ClusterState, policy: VictimPolicy
) -> Candidate | str:
    """The candidate as we accept it (maybe with extra victims), or why it is refused.

    A victim whose bind call the gate has refused is not on the node any more,
    though kube-scheduler's snapshot of this cycle may still show it there. It
    is not evicted: deleting a pod kube-scheduler already forgot is no event
    that retries the preemptor, which would then wait, nominated, for minutes.
    Without it kube-scheduler forgets the pod, and that retries the preemptor.
    """
    victims_by_gang: dict[str, list[PodRecord]] = {}
    specs: dict[str, GroupSpec] = {}
    kept = [uid for uid in candidate.victim_uids if not _refused_here(state, uid)]
    if not kept:
        return (
            "every victim kube-scheduler chose has left the node already (the gate refused "
            "its bind call); the preemptor is retried once kube-scheduler forgets them"
        )
    for uid in kept:
        victim = state.pod_by_uid(uid)
        spec = _victim_group(state, victim) if victim is not None else None
        if victim is None or spec is None:
            continue  # a pod we know nothing of, or a plain pod
        if spec.key == preemptor.group_key:
            return f"victim {victim.key} is a member of the preemptor's own gang {spec.key}"
        victims_by_gang.setdefault(spec.key, []).append(victim)
        specs[spec.key] = spec
    extra: list[str] = []
    for gang, victims in victims_by_gang.items():
        spec = specs[gang]
        placed = state.placed_members(gang)
        if policy is VictimPolicy.PROTECT:
            left = len(placed) - len(victims)
            if wholeness(spec, left).missing:
                return (
                    f"evicting {len(victims)} member(s) of gang {gang} would leave {left} "
                    f"placed, below its minMember {spec.min_member}"
                )
            continue
        protected = [p.key for p in placed if p.priority >= preemptor.priority]
        if protected:
            return (
                f"gang {gang} would have to go whole, but {', '.join(protected)} "
                "has priority >= the preemptor's"
            )
        listed = set(kept)
        extra += [p.uid for p in placed if p.placed_node == candidate.node and p.uid not in listed]
    return Candidate(candidate.node, [*kept, *extra], candidate.num_pdb_violations)


def _refused_here(state: ClusterState, uid: str) -> bool:
    victim = state.pod_by_uid(uid)
    return victim is not None and victim.bind_refused and not victim.placed_node


# ---- gang preemptors: one plan per gang ------------------------------------------------


@dataclass(slots=True)
class Slot:
    """Room for one member on one node; the first slot on a node carries its victims."""

    node: str
    requests: Resources
    victims: tuple[str, ...]
    # uid of the member this slot was given to ("" while nobody asked for it).
    member: str = ""


@dataclass(slots=True)
class Plan:
    ref: GroupRef
    priority: int
    made_at: float
    deadline: float
    slots: list[Slot]
    # victim uid -> (pod key, node): every victim of the plan.
    victims: dict[str, tuple[str, str]]
    evictions: int
    phase: PlanPhase = PlanPhase.PLANNED
    reason: str = ""
    handed: set[str] = field(default_factory=set)
    # The topology domain every slot is in (None: the gang has no topology constraint).
    domain: Domain | None = None
    kind: PlanKind = PlanKind.PREEMPTION

    @property
    def group(self) -> str:
        return self.ref.key

    def describe(self) -> str:
        if self.kind is PlanKind.RECLAIM:
            names = sorted(key for key, _node in self.victims.values())
            return f"{self.evictions} eviction(s) by queue reclaim: {', '.join(names)}"
        by_node: dict[str, list[str]] = {}
        members: dict[str, int] = {}
        for slot in self.slots:
            members[slot.node] = members.get(slot.node, 0) + 1
        for key, node in self.victims.values():
            by_node.setdefault(node, []).append(key.rsplit("/", 1)[-1])
        parts = [
            f"{node} ({members[node]} member(s)"
            + (
                f", evicting {', '.join(sorted(by_node[node]))})"
                if node in by_node
                else ", free room)"
            )
            for node in sorted(members)
        ]
        return f"{self.evictions} eviction(s) for {len(self.slots)} member(s): " + "; ".join(parts)

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "group": self.group,
            "kind": self.kind.value,
            "phase": self.phase.value,
            "priority": self.priority,
            "evictions": self.evictions,
            "ageSeconds": round(now - self.made_at, 2),
            "deadlineSeconds": round(self.deadline - now, 2),
            "slots": [
                {
                    "node": s.node,
                    "victims": [self.victims[v][0] for v in s.victims],
                    "member": s.member,
                }
                for s in self.slots
            ],
            "reason": self.reason,
            "domain": self.domain.to_json() if self.domain is not None else None,
        }


@dataclass(frozen=True, slots=True)
class Answer:
    """What the preempt verb sends back for a gang member, and why (for the log)."""

    candidates: list[Candidate]
    message: str


class PreemptionPlans:
    def __init__(
        self,
        state: ClusterState,
        policy: VictimPolicy,
        metrics: Metrics,
        *,
        waker: SiblingWaker | None = None,
        observer: GangObserver | None = None,
        clock: Clock = monotonic,
        plan_seconds: float = PLAN_SECONDS,
        levels: tuple[str, ...] = DEFAULT_LEVELS,
    ) -> None:
        self._state = state
        self._levels = levels
        self._policy = policy
        self._metrics = metrics
        self._waker = waker
        self._observer: GangObserver = observer or NullObserver()
        self._clock = clock
        self._plan_seconds = plan_seconds
        self.plans: dict[str, Plan] = {}
        # victim uid -> (whom it makes room for: a gang or pod key, when handed).
        self._victims: dict[str, tuple[str, float]] = {}
        # group -> the last refusal told to its users (an Event once per new reason).
        self._refused: dict[str, str] = {}

    # ---- questions from the verb, the gate, the evictor ---------------------------------

    def is_victim(self, uid: str) -> bool:
        noted = self._victims.get(uid)
        return noted is not None and self._clock() - noted[1] < VICTIM_MEMORY_SECONDS

    def beneficiary(self, uid: str) -> str | None:
        noted = self._victims.get(uid)
        return noted[0] if noted is not None else None

    def plain(self, preemptor: Preemptor, candidates: list[Candidate]) -> list[Candidate]:
        """A pod in no gang: kube-scheduler's candidates that break no running gang."""
        selection = select_victims(preemptor, candidates, self._state, self._policy)
        for node, why in selection.dropped.items():
            log.info(
                "candidate dropped: %s",
                why,
                extra={"pod": preemptor.key, "node": node, "verb": "preempt"},
            )
        for candidate in selection.candidates:
            self._note_victims(candidate.victim_uids, preemptor.key)
        return selection.candidates

    def answer(
        self,
        spec: GroupSpec,
        ref: GroupRef,
        preemptor: Preemptor,
        own: Demand,
        candidates: Sequence[Candidate],
    ) -> Answer:
        """A gang member's preempt call: answered from its gang's plan, made now if none lives."""
        now = self._clock()
        for live in list(self.plans.values()):
            # An expired plan's reservations must not hold room for anyone.
            self._check(live, now)
        current = self.plans.get(spec.key)
        if current is None:
            made = self._make(spec, ref, preemptor, own, {c.node for c in candidates}, now)
            if isinstance(made, Answer):
                return made
            current = made
        return self._serve(current, preemptor, own, candidates)

    def lives(self, group_key: str) -> bool:
        """Has this gang a plan that still holds (checked against the cluster now)?"""
        current = self.plans.get(group_key)
        if current is None:
            return False
        self._check(current, self._clock())
        return group_key in self.plans

    def reclaim(self, ref: GroupRef, priority: int, victims: Sequence[PodRecord]) -> None:
        """Queue reclaim evicts `victims` (a whole gang) so that gang `ref` gets room.

        Recorded as the gang's plan: its own preempt calls then wait for this
        room instead of evicting more, /debug shows it, and its members are
        woken once the victims are gone. A preemption plan it had gives way.
        """
        now = self._clock()
        current = self.plans.get(ref.key)
        if current is not None and current.kind is not PlanKind.RECLAIM:
            self._end(current, PlanPhase.CANCELLED, "queue reclaim makes the room instead")
            current = None
        if current is None:
            current = Plan(
                ref,
                priority,
                now,
                now + self._plan_seconds,
                [],
                {},
                0,
                PlanPhase.EVICTING,
                kind=PlanKind.RECLAIM,
            )
            self.plans[ref.key] = current
        for pod in victims:
            current.victims[pod.uid] = (pod.key, pod.placed_node)
            current.handed.add(pod.uid)
        current.evictions = len(current.victims)
        self._note_victims([p.uid for p in victims], ref.key)

    def refuse(self, group_key: str, message: str) -> None:
        """The verb found the gang cannot preempt at all (too few members, denied, ...)."""
        self._refuse(group_key, message)

    def snapshot(self) -> list[dict[str, Any]]:
        now = self._clock()
        for live in list(self.plans.values()):
            self._check(live, now)
        return [p.to_json(now) for p in self.plans.values()]

    # ---- making a plan ----------------------------------------------------------------

    def _make(
        self,
        spec: GroupSpec,
        ref: GroupRef,
        preemptor: Preemptor,
        own: Demand,
        offered: set[str],
        now: float,
    ) -> Plan | Answer:
        """Plan over the nodes kube-scheduler offered and those with room for a member.

        kube-scheduler's candidates are every node where evicting lower-priority
        pods lets a member fit (in a cluster of more than 1,000 nodes, a 10%
        sample of them, its own bound on preemption work); the nodes it did not
        offer either fit a member already or cannot take one whatever is evicted.
        """
        demands = self._demands(spec, preemptor, own)
        smallest = min(demands, key=lambda d: sum(d.requests.values())).requests
        bins = [
            b
            for b in self._bins(spec.key, preemptor.priority)
            if b.name in offered or not shortfall(smallest, b.free)
        ]
        evictable, budgets = self._evictable(spec.key, preemptor.priority, [b.name for b in bins])
        constraint = constraint_of(
            spec.topology, ((p.key, p.topology) for p in self._state.members(spec.key))
        )
        domain: Domain | None = None
        if constraint is None:
            result = plan(demands, bins, evictable, budgets)
        else:
            domain, result = self._plan_in_topology(
                spec.key, constraint, demands, bins, evictable, budgets
            )
        if result is None:
            where = ""
            if constraint is not None and constraint.required:
                levels = " or ".join(
                    short_level(level) for level in self._levels_to_try(constraint)[0]
                )
                where = f" in any one {levels} ({constraint.describe()})"
            message = (
                f"gang {spec.key} cannot preempt: its {len(demands)} missing member(s) do not "
                f"fit{where} even after evicting every pod they may evict (lower priority, not "
                "in the gang, not protected by a running gang's minMember under "
                f"--gang-victim-policy={self._policy})"
            )
            self._refuse(spec.key, message)
            return Answer([], message)
        made = self._from_result(ref, preemptor.priority, result, demands, now)
        made.domain = domain
        if not made.victims:
            # The members fit without evicting anyone (room being freed, or free
            # room the filter keeps for a gang ahead in line): nothing to evict.
            return Answer(
                [],
                f"the {len(demands)} member(s) of gang {spec.key} still needing room fit "
                "without evictions; they wait for it",
            )
        self._cancel_lower(made)
        self.plans[spec.key] = made
        self._refused.pop(spec.key, None)
        self._metrics.preemption_plan_evictions.observe(made.evictions)
        where = f" in {domain.describe()} ({level_origin(domain.level)})" if domain else ""
        text = f"gang {spec.key} preempts{where}: {made.describe()}"
        log.info(text, extra={"podgroup": spec.key, "pod": preemptor.key, "verb": "preempt"})
        self._observer.preemption_planned(spec.key, text)
        return made

    def _levels_to_try(self, constraint: TopologyConstraint) -> tuple[list[str], bool]:
        """levels_to_try() over the configured levels and the HyperNode tiers there are."""
        return levels_to_try(
            constraint,
            self._state.topology_levels(self._levels),
            self._state.hypernodes.tier_names,
        )

    def _plan_in_topology(
        self,
        key: str,
        constraint: TopologyConstraint,
        demands: Sequence[Demand],
        bins: Sequence[Bin],
        evictable: dict[str, list[Evictable]],
        budgets: dict[str, int],
    ) -> tuple[Domain | None, PlanResult | None]:
        """The cheapest plan inside one domain, lowest level first; preferred: then anywhere.

        Placed members pin the domain of each level, as in the filter verb.
        """
        tried, anywhere = self._levels_to_try(constraint)
        placed = [p.placed_node for p in self._state.placed_members(key)]
        for level in tried:
            groups = by_domain(bins, level)
            if placed:
                pin = common_domain(placed, self._state.labels_of, level)
                groups = {pin: groups[pin]} if pin is not None and pin in groups else {}
            found = plan_in_domains(
                demands,
                bins,
                evictable,
                budgets,
                [(value, [b.name for b in members]) for value, members in sorted(groups.items())],
            )
            if found is not None:
                return Domain(level, found[0]), found[1]
        if anywhere:
            return None, plan(demands, bins, evictable, budgets)
        return None, None

    def _demands(self, spec: GroupSpec, preemptor: Preemptor, own: Demand) -> list[Demand]:
        """The members the gang still needs placed, the preemptor first."""
        members = self._state.members(spec.key)
        placed = sum(1 for p in members if p.placed_node and not p.terminal)
        missing = max(wholeness(spec, placed).missing, 1)
        others = sorted(
            (
                Demand(p.key, p.requests, p.placement)
                for p in members
                if not p.placed_node and p.counts_as_member and p.uid != preemptor.uid
            ),
            key=lambda d: (sum(d.requests.values()), d.key),
        )
        return [own, *others][:missing]

    def _bins(self, group_key: str, priority: int) -> list[Bin]:
        """Free room per node, with what others were promised taken out.

        Promised: pods kube-scheduler nominated that rank at least as high
        (its filters keep their room), and the open slots of other live plans
        of gangs that rank at least as high; their handed victims count as gone.
        """
        bins = self._state.room()
        by_node = index_of(bins)
        leaving = self._state.leaving
        for pod in self._state.nominated.values():
            if pod.priority >= priority and (pod.group is None or pod.group.key != group_key):
                target = by_node.get(pod.nominated_node)
                if target is not None:
                    subtract(target.free, pod.requests)
        for other in self.plans.values():
            if other.group == group_key or other.phase in ENDED:
                continue
            for uid in other.handed:
                victim = self._state.pod_by_uid(uid)
                if victim is not None and victim.key not in leaving and not victim.terminal:
                    target = by_node.get(victim.placed_node)
                    if target is not None:
                        add(target.free, victim.requests)
            if other.priority < priority:
                continue
            for slot in other.slots:
                if not self._slot_filled(slot):
                    target = by_node.get(slot.node)
                    if target is not None:
                        subtract(target.free, slot.requests)
        return bins

    def _evictable(
        self, group_key: str, priority: int, nodes: Sequence[str]
    ) -> tuple[dict[str, list[Evictable]], dict[str, int]]:
        """Per node, what the gang may evict; and the budgets of running gangs (protect)."""
        taken = {uid for p in self.plans.values() if p.phase not in ENDED for uid in p.victims}
        by_node: dict[str, list[Evictable]] = {}
        budgets: dict[str, int] = {}
        gangs: dict[str, GroupSpec | None] = {}
        units: dict[tuple[str, str], list[PodRecord]] = {}
        leaving = self._state.leaving
        for pod in (p for name in nodes for p in self._state.pods_on(name)):
            node = pod.placed_node
            if pod.priority >= priority or pod.terminal or pod.key in leaving or pod.uid in taken:
                continue
            spec = None
            if pod.group is not None:
                if pod.group.key == group_key:
                    continue
                if pod.group.key not in gangs:
                    gangs[pod.group.key] = _victim_group(self._state, pod)
                spec = gangs[pod.group.key]
            if spec is None:
                by_node.setdefault(node, []).append(
                    Evictable((pod.uid,), (pod.key,), node, pod.requests, pod.priority)
                )
            elif self._policy is VictimPolicy.PROTECT:
                if spec.key not in budgets:
                    running = len(self._state.placed_members(spec.key))
                    budgets[spec.key] = max(0, running - spec.min_member)
                by_node.setdefault(node, []).append(
                    Evictable(
                        (pod.uid,), (pod.key,), node, pod.requests, pod.priority, spec.key, spec.key
                    )
                )
            else:
                units.setdefault((spec.key, node), []).append(pod)
        for (gang, node), pods in units.items():
            whole = self._state.placed_members(gang)
            if any(p.priority >= priority for p in whole):
                continue  # the whole gang would go, and part of it outranks the preemptor
            requests: Resources = {}
            for pod in pods:
                add(requests, pod.requests)
            by_node.setdefault(node, []).append(
                Evictable(
                    tuple(p.uid for p in pods),
                    tuple(p.key for p in pods),
                    node,
                    requests,
                    max(p.priority for p in pods),
                    gang,
                    None,
                    len(whole),
                )
            )
        return by_node, budgets

    def _from_result(
        self,
        ref: GroupRef,
        priority: int,
        result: PlanResult,
        demands: Sequence[Demand],
        now: float,
    ) -> Plan:
        requests = {d.key: d.requests for d in demands}
        slots: list[Slot] = []
        victims: dict[str, tuple[str, str]] = {}
        for planned in result.nodes:
            uids = tuple(uid for v in planned.victims for uid in v.uids)
            for unit in planned.victims:
                for uid, key in zip(unit.uids, unit.keys, strict=True):
                    victims[uid] = (key, planned.node)
            for i, member in enumerate(planned.members):
                slots.append(Slot(planned.node, requests[member], uids if i == 0 else ()))
        return Plan(
            ref=ref,
            priority=priority,
            made_at=now,
            deadline=now + self._plan_seconds,
            slots=slots,
            victims=victims,
            evictions=result.cost.evictions,
        )

    def _cancel_lower(self, made: Plan) -> None:
        """A lower-priority gang's live plan on the same nodes gives way to this one."""
        nodes = {s.node for s in made.slots}
        for other in list(self.plans.values()):
            if (
                other.group != made.group
                and other.priority < made.priority
                and other.phase not in ENDED
            ):
                shared = nodes & {s.node for s in other.slots}
                if shared:
                    self._end(
                        other,
                        PlanPhase.CANCELLED,
                        f"higher-priority gang {made.group} needs node(s) "
                        + ", ".join(sorted(shared)),
                    )

    # ---- answering a member from the plan -------------------------------------------------

    def _serve(
        self, current: Plan, preemptor: Preemptor, own: Demand, candidates: Sequence[Candidate]
    ) -> Answer:
        if current.kind is PlanKind.RECLAIM:
            return Answer(
                [],
                f"gang {current.group} gets its room by queue reclaim ({current.describe()}); "
                "the member waits for it",
            )
        slot = next((s for s in current.slots if s.member == preemptor.uid), None)
        if slot is None:
            open_slots = [s for s in current.slots if not s.member and s.requests == own.requests]
            open_slots.sort(key=lambda s: (not s.victims, s.node))
            if not open_slots:
                return Answer(
                    [],
                    f"gang {current.group}'s preemption plan has no room for this member "
                    f"({current.describe()}); it waits for the gang's planned members",
                )
            slot = open_slots[0]
            slot.member = preemptor.uid
        present = [uid for uid in slot.victims if self._still_there(uid)]
        if not present:
            why = "being freed" if slot.victims else "free"
            return Answer([], f"planned room on {slot.node} is {why}; the member waits for it")
        current.handed.update(present)
        if current.phase is PlanPhase.PLANNED:
            current.phase = PlanPhase.EVICTING
        self._note_victims(present, current.group)
        pdb = next((c.num_pdb_violations for c in candidates if c.node == slot.node), 0)
        return Answer(
            [Candidate(slot.node, present, pdb)],
            f"planned node {slot.node}, evicting {len(present)} pod(s)",
        )

    def _still_there(self, uid: str) -> bool:
        pod = self._state.pod_by_uid(uid)
        return pod is not None and bool(pod.placed_node) and not pod.terminal

    def _slot_filled(self, slot: Slot) -> bool:
        if not slot.member:
            return False
        member = self._state.pod_by_uid(slot.member)
        return member is not None and bool(member.placed_node)

    def _note_victims(self, uids: Sequence[str], beneficiary: str) -> None:
        now = self._clock()
        if len(self._victims) > 10_000:
            cutoff = now - VICTIM_MEMORY_SECONDS
            self._victims = {u: v for u, v in self._victims.items() if v[1] >= cutoff}
        for uid in uids:
            self._victims[uid] = (beneficiary, now)

    # ---- the plan's life -------------------------------------------------------------------

    def _check(self, current: Plan, now: float) -> None:
        """End the plan if the gang is whole, its deadline passed or a planned node is gone."""
        if current.phase in ENDED:
            return
        try:
            spec = self._state.group_spec(current.ref)
        except (GroupNotFound, PodGroupSpecError):
            self._end(current, PlanPhase.CANCELLED, "its group is gone or invalid")
            return
        placed = sum(
            1 for p in self._state.members(current.group) if p.placed_node and not p.terminal
        )
        if not wholeness(spec, placed).missing:
            self._end(current, PlanPhase.DONE, "the gang holds minMember")
            return
        gone = sorted(
            {
                s.node
                for s in current.slots
                if (n := self._state.nodes.get(s.node)) is None or n.unschedulable
            }
        )
        if gone:
            self._end(current, PlanPhase.CANCELLED, f"node(s) {', '.join(gone)} gone or cordoned")
            return
        remaining = [uid for uid in current.victims if self._still_there(uid)]
        if current.phase is PlanPhase.EVICTING and not remaining:
            current.phase = PlanPhase.PLACING
        if now > current.deadline:
            late = [current.victims[uid][0] for uid in remaining if uid in current.handed]
            why = (
                f"victim(s) {', '.join(sorted(late))} did not leave within {self._plan_seconds:g}s"
                if late
                else f"the members were not placed within {self._plan_seconds:g}s"
            )
            self._end(current, PlanPhase.EXPIRED, why)

    def _end(self, current: Plan, phase: PlanPhase, reason: str) -> None:
        current.phase = phase
        current.reason = reason
        self.plans.pop(current.group, None)
        self._metrics.preemption_plans.labels(phase.value).inc()
        level = logging.INFO if phase is PlanPhase.DONE else logging.WARNING
        log.log(
            level,
            "preemption plan %s: %s",
            phase.value,
            reason,
            extra={"podgroup": current.group, "verb": "preempt"},
        )
        if phase is not PlanPhase.DONE:
            self._observer.preemption_ended(
                current.group, f"preemption plan {phase.value}: {reason}"
            )

    def _refuse(self, group_key: str, message: str) -> None:
        if self._refused.get(group_key) == message:
            return
        if len(self._refused) > 10_000:
            self._refused.clear()
        self._refused[group_key] = message
        self._observer.preemption_refused(group_key, message)

    def on_nodes_changed(self) -> None:
        now = self._clock()
        for current in list(self.plans.values()):
            self._check(current, now)

    def on_pod_change(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """Move plans along as victims leave and members land; wake whoever waits for room."""
        if old is None:
            return
        gone = new is None or new.terminal or (not new.placed_node and bool(old.placed_node))
        if new is None and old.preempted and not old.node_name:
            # A victim that was only held (never bound) is gone: see PREEMPTOR_RETRY_SECONDS.
            self._wake_nominated()
        if old.group is not None and old.group.key in self.plans and new is not None:
            # A member reserved in the gate reaches the watch as bound: check then too.
            if new.placed_node and (not old.placed_node or new.node_name != old.node_name):
                self._check(self.plans[old.group.key], self._clock())
            return
        if not gone or not self.plans:
            return
        for current in list(self.plans.values()):
            if old.uid in current.victims:
                self._check(current, self._clock())
                if not any(self._still_there(uid) for uid in current.victims) and self._waker:
                    # Every victim gone: the members answered "wait" sit in
                    # kube-scheduler's unschedulable queue.
                    self._waker.wake(current.group)
            for slot in current.slots:
                if slot.member == old.uid and new is None:
                    slot.member = ""

    def _wake_nominated(self) -> None:
        if self._waker is None:
            return
        nominated = [p for p in self._state.nominated.values() if not p.node_name]
        self._waker.wake_pods("preemptor-wakeup", nominated)
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_later(
                PREEMPTOR_RETRY_SECONDS, self._wake_nominated_again, {p.uid for p in nominated}
            )

    def _wake_nominated_again(self, uids: set[str]) -> None:
        if self._waker is None:
            return
        still = [p for p in self._state.nominated.values() if p.uid in uids and not p.node_name]
        self._waker.wake_pods("preemptor-wakeup", still)
