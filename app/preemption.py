"""Gang-aware preemption: which of kube-scheduler's candidates we accept, and their victims.

kube-scheduler's DefaultPreemption picks, per node, the lowest-priority pods
whose removal lets the preemptor fit, then asks extenders to confirm. It knows
nothing of gangs: it would evict one member of a running gang (breaking it)
or evict pods for a gang that can never start. This module is where that is
fixed. It only removes candidates or adds victims on the same node; the
ordering of the survivors is kube-scheduler's own (PDB violations, highest
victim priority, priority sum, victim count, start time), applied after us.
Pure: reads ClusterState, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from app.admission import wholeness
from app.groups import GroupSpec, PodGroupSpecError
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
