"""Gang-aware preemption: which of kube-scheduler's candidates we accept, and their victims.

kube-scheduler's DefaultPreemption picks, per node, the lowest-priority pods
whose removal lets the preemptor fit, then asks extenders to confirm. It knows
nothing of gangs: it would evict one member of a running gang (breaking it)
or evict pods for a gang that can never start. This module is where that is
fixed. It removes candidates or adds victims on the same node; for a
plain preemptor the ordering of the survivors is kube-scheduler's own (PDB
violations, highest victim priority, priority sum, victim count, start
time), applied after us. For a gang member it picks the one candidate
itself, knowing where the member's siblings are going (the second half of
this module). Pure: reads ClusterState, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from app.admission import wholeness
from app.groups import GroupSpec, PodGroupSpecError
from app.packing import Bin, Demand, index_of, pack
from app.resources import Resources, add, format_resources, shortfall, subtract
from app.state import ClusterState, GroupNotFound, PodRecord


class VictimPolicy(StrEnum):
    # A gang member may be a victim only while its gang keeps minMember placed.
    PROTECT = "protect"
    # A gang member may be a victim only together with its whole gang.
    WHOLE_GANG = "whole-gang"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node kube-scheduler would preempt on, and the victims it chose (read by app/wire.py)."""

    node: str
    victim_uids: list[str]
    num_pdb_violations: int


@dataclass(frozen=True, slots=True)
class Preemptor:
    key: str
    uid: str
    priority: int
    group_key: str | None


@dataclass
class Selection:
    candidates: list[Candidate]
    # node -> why it was dropped, for the debug log.
    dropped: dict[str, str] = field(default_factory=dict)
    # Gangs losing members on a kept candidate; under whole-gang their other
    # members (on other nodes) go too if kube-scheduler picks that candidate.
    gangs_hit: set[str] = field(default_factory=set)


def _victim_group(state: ClusterState, pod: PodRecord) -> GroupSpec | None:
    """The gang a victim belongs to, None for a plain pod (or a broken group label)."""
    if pod.group is None:
        return None
    try:
        return state.group_spec(pod.group)
    except (GroupNotFound, PodGroupSpecError):
        return None


def select_victims(
    preemptor: Preemptor,
    candidates: list[Candidate],
    state: ClusterState,
    policy: VictimPolicy,
) -> Selection:
    selection = Selection([])
    for candidate in candidates:
        verdict = _judge(preemptor, candidate, state, policy)
        if isinstance(verdict, str):
            selection.dropped[candidate.node] = verdict
            continue
        kept, gangs = verdict
        selection.candidates.append(kept)
        selection.gangs_hit |= gangs
    return selection


def _judge(
    preemptor: Preemptor, candidate: Candidate, state: ClusterState, policy: VictimPolicy
) -> tuple[Candidate, set[str]] | str:
    """The candidate as we accept it (maybe with extra victims), or why it is refused."""
    victims_by_gang: dict[str, list[PodRecord]] = {}
    specs: dict[str, GroupSpec] = {}
    for uid in candidate.victim_uids:
        victim = state.pod_by_uid(uid)
        if victim is None:
            continue  # not in our cache yet: a pod we know nothing of is no gang member
        spec = _victim_group(state, victim)
        if spec is None:
            continue
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
        # whole-gang: every member must be evictable by this preemptor.
        protected = [p.key for p in placed if p.priority >= preemptor.priority]
        if protected:
            return (
                f"gang {gang} would have to go whole, but {', '.join(protected)} "
                "has priority >= the preemptor's"
            )
        listed = set(candidate.victim_uids)
        extra += [p.uid for p in placed if p.placed_node == candidate.node and p.uid not in listed]
    kept = Candidate(candidate.node, [*candidate.victim_uids, *extra], candidate.num_pdb_violations)
    return kept, set(victims_by_gang)


def preemption_gap(
    spec: GroupSpec, preemptor: Preemptor, pending_requests: list[Resources], state: ClusterState
) -> Resources:
    """What the gang would still lack even after evicting every lower-priority pod.

    Members preempt one by one; if the whole gang cannot fit anyway, the first
    members' victims would be evicted for nothing, the gang would time out
    and, once the victims' controllers recreate them, do it all again. Refusing
    up front stops that loop. The check is on cluster totals (optimistic about
    fragmentation): it only refuses what is certainly hopeless.
    """
    placed = state.placed_members(spec.key)
    missing = wholeness(spec, len(placed)).missing
    need: Resources = {}
    for requests in sorted(pending_requests, key=lambda r: r.get("cpu", 0))[:missing]:
        add(need, requests)
    if spec.min_resources:
        own: Resources = {}
        for member in placed:
            add(own, member.requests)
        rest = dict(spec.min_resources)
        subtract(rest, own)
        for name, amount in rest.items():
            need[name] = max(need.get(name, 0), amount)
    available = state.total_allocatable()
    for pod in state.pods.values():
        # Pods at the preemptor's priority or above stay, the gang's own members included.
        if pod.placed_node and not pod.terminal and pod.priority >= preemptor.priority:
            subtract(available, pod.requests)
    return shortfall(need, available)


def describe_gap(group_key: str, gap: Resources) -> str:
    return (
        f"gang {group_key} cannot fit even after evicting every lower-priority pod "
        f"(short by {format_resources(gap)}): preempting nothing"
    )


# ---- a gang's members preempting one after the other --------------------------------
#
# kube-scheduler preempts for one pod at a time, deletes the victims
# asynchronously and records the preemptor's nominatedNodeName; our watch
# reports both a few milliseconds later. Gang members fail together and
# preempt within those milliseconds, so without a memory of their own each
# sibling sees neither the room being freed nor who it is promised to, and
# evicts again: one node emptied for two members while a third node loses a
# pod for nothing. So for gang members the preempt verb (1) preempts nothing
# when the members still needing room fit in what earlier preemptions are
# freeing, (2) hands kube-scheduler a single candidate, the one that makes
# room for most members, and (3) remembers it until the member lands.

IN_FLIGHT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Preemption:
    """A candidate we let kube-scheduler carry out for a gang member."""

    preemptor_uid: str
    node: str
    requests: Resources
    victim_uids: frozenset[str]
    at: float


class PreemptionsInFlight:
    """Gang members' preemptions from our answer until the member holds a node.

    An entry also ends after IN_FLIGHT_SECONDS (kube-scheduler gave up on the
    nomination, or the victims outlived a normal grace period): siblings then
    preempt on what the cluster shows, as kube-scheduler alone would.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_uid: dict[str, Preemption] = {}

    def record(
        self, preemptor_uid: str, node: str, requests: Resources, victims: list[str]
    ) -> None:
        self._by_uid[preemptor_uid] = Preemption(
            preemptor_uid, node, requests, frozenset(victims), self._clock()
        )

    def active(self, state: ClusterState) -> list[Preemption]:
        now = self._clock()
        for uid, entry in list(self._by_uid.items()):
            preemptor = state.pod_by_uid(uid)
            landed = preemptor is not None and (
                bool(preemptor.placed_node) or preemptor.terminal or preemptor.deleting
            )
            if landed or now - entry.at > IN_FLIGHT_SECONDS:
                del self._by_uid[uid]
        return list(self._by_uid.values())


@dataclass(frozen=True, slots=True)
class GangRoom:
    """Where a gang's waiting members could go once earlier preemptions are done."""

    bins: list[Bin]
    # Pods on their way out (victims in flight, pods being deleted): counted free in bins.
    leaving: frozenset[str]
    # The members still needing room (unplaced, promised no node), the preemptor first.
    waiting: list[Demand]

    @property
    def fits(self) -> bool:
        """All waiting members fit: the siblings wait for the room, nobody needs evicting."""
        return pack(self.waiting, self.bins).fits


def gang_room(
    state: ClusterState,
    in_flight: Sequence[Preemption],
    preemptor: Preemptor,
    own: Demand,
    group_key: str,
) -> GangRoom:
    """Free capacity per schedulable node once leaving pods are gone and nominated pods landed.

    Leaving: victims of preemptions in flight, and ClusterState.leaving
    (pods being deleted or marked as victims). Nominated: the preemptors in
    flight and pods kube-scheduler nominated that rank at least as high as
    `preemptor` (its filters count those). The preemptor's own earlier
    nomination is not counted: asking again means kube-scheduler let go of it.
    """
    bins = state.room()
    by_node = index_of(bins)
    leaving = {pod.uid for pod in state.leaving.values()}
    for entry in in_flight:
        for uid in entry.victim_uids:
            victim = state.pod_by_uid(uid)
            if victim is None or victim.uid in leaving or victim.terminal:
                continue
            target = by_node.get(victim.placed_node)
            if target is not None:
                add(target.free, victim.requests)
                leaving.add(victim.uid)
    promised: dict[str, tuple[str, Resources]] = {
        pod.uid: (pod.nominated_node, pod.requests)
        for pod in state.nominated.values()
        if pod.priority >= preemptor.priority
    }
    for entry in in_flight:
        promised[entry.preemptor_uid] = (entry.node, entry.requests)
    promised.pop(preemptor.uid, None)
    for node_name, requests in promised.values():
        target = by_node.get(node_name)
        if target is not None:
            subtract(target.free, requests)

    waiting_members = [own]
    for pod in state.members(group_key):
        if pod.placed_node or pod.nominated_node or pod.uid in promised:
            continue  # holds a node, or is promised one
        if pod.uid != preemptor.uid and pod.key != own.key:
            waiting_members.append(Demand(pod.key, pod.requests, pod.placement))
    return GangRoom(bins, frozenset(leaving), waiting_members)


def choose_for_gang(
    candidates: Sequence[Candidate], state: ClusterState, room: GangRoom
) -> Candidate:
    """The one candidate to preempt on: kube-scheduler's order, with room for most members first.

    kube-scheduler ranks candidates by PDB violations, then the highest victim
    priority, then the victims' priority sum and count. Between candidates equal
    on the first two, the one whose freed room takes more of the waiting
    members wins: two members placed for one eviction beat one member each.
    The node name breaks the last ties, so the choice is reproducible.
    """
    room_by_node = {b.name: b for b in room.bins}

    def rank(candidate: Candidate) -> tuple[int, int, int, int, int, str]:
        known = [v for uid in candidate.victim_uids if (v := state.pod_by_uid(uid)) is not None]
        priorities = [v.priority for v in known]
        fitting = 0
        base = room_by_node.get(candidate.node)
        if base is not None:
            free = dict(base.free)
            for victim in known:
                if victim.uid not in room.leaving:
                    add(free, victim.requests)
            fitting = len(pack(room.waiting, [Bin(base.name, free, base.labels, base.taints)]).plan)
        return (
            candidate.num_pdb_violations,
            max(priorities, default=0),
            -fitting,
            sum(priorities),
            len(candidate.victim_uids),
            candidate.node,
        )

    return min(candidates, key=rank)
