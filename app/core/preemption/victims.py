"""Which victims a preemptor may take: the rules that keep running gangs whole.

kube-scheduler's DefaultPreemption picks, per node, the lowest-priority pods
whose removal lets the preemptor fit. It knows nothing of gangs, so for a
plain preemptor (a pod in no gang) these rules refuse the candidates that
would break a running gang, and under the whole-gang policy extend a
candidate's victims to the gang's other members on that node, so that a
gang never keeps running below minMember. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum

from app.core.admission import wholeness
from app.core.groups import GroupSpec, PodGroupSpecError
from app.core.records import GroupNotFound, PodRecord
from app.core.state import ClusterState


class VictimPolicy(StrEnum):
    # A gang member may be a victim only while its gang keeps minMember placed.
    PROTECT = "protect"
    # A gang member may be a victim only together with its whole gang.
    WHOLE_GANG = "whole-gang"


@dataclass(frozen=True, slots=True)
class VictimCandidate:
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


@dataclass
class Selection:
    candidates: list[VictimCandidate]
    # node -> why it was dropped, for the debug log.
    dropped: dict[str, str] = field(default_factory=dict)
    # The dropped nodes whose victims would have broken a running gang (victim_pool.node_victims).
    for_gangs: set[str] = field(default_factory=set)


_ALL_LEAVING = (
    "every victim kube-scheduler chose is leaving the node already (being deleted, "
    "evicted by a gang's preemption, or refused by the gate); the preemptor is "
    "retried as they go"
)


def victim_group(state: ClusterState, pod: PodRecord) -> GroupSpec | None:
    """The gang a victim belongs to, None for a plain pod (or a broken group label)."""
    if pod.group is None:
        return None
    try:
        return state.group_spec(pod.group)
    except (GroupNotFound, PodGroupSpecError):
        return None


def select_victims(
    preemptor: Preemptor,
    candidates: list[VictimCandidate],
    state: ClusterState,
    policy: VictimPolicy,
    going: Collection[str] = frozenset(),
) -> Selection:
    """The candidates the preemptor may take, each with the victims to evict; `going`:
    victims someone else is evicting already (a gang's preemption plan)."""
    selection = Selection([])
    for candidate in candidates:
        verdict = _judge(preemptor, candidate, state, policy, going)
        if isinstance(verdict, str):
            selection.dropped[candidate.node] = verdict
            if verdict != _ALL_LEAVING:
                selection.for_gangs.add(candidate.node)
        else:
            selection.candidates.append(verdict)
    return selection


def _judge(
    preemptor: Preemptor,
    candidate: VictimCandidate,
    state: ClusterState,
    policy: VictimPolicy,
    going: Collection[str],
) -> VictimCandidate | str:
    """The candidate as we accept it (maybe with extra victims), or why it is refused.

    A victim already leaving in our view is not evicted again, though kube-scheduler's
    snapshot of this cycle may still show it staying: one whose bind call the gate has
    refused (not on the node any more), one being deleted, one a gang's plan is evicting
    (`going`). Its departure retries the preemptor; kube-scheduler's own eviction of it
    would not. Deleting a pod kube-scheduler already forgot is no event that retries the
    preemptor, and kube-scheduler v1.37's asynchronous preemption ignores a victim's
    deletion that reaches it before its own delete call for that victim has been made,
    then gets "not found" and does not retry the preemptor either: either way it would
    wait, nominated, for minutes. A candidate left with no victim is refused: the
    preemptor is retried as they go.
    """
    kept, known = _staying(candidate, state, going)
    if not kept:
        return _ALL_LEAVING
    gangs = _victims_by_gang(preemptor, known, state)
    if isinstance(gangs, str):
        return gangs
    extra: list[str] = []
    for spec, victims in gangs.values():
        placed = state.placed_members(spec.key)
        if policy is VictimPolicy.PROTECT:
            left = len(placed) - len(victims)
            if wholeness(spec, left).missing:
                return (
                    f"evicting {len(victims)} member(s) of gang {spec.key} would leave {left} "
                    f"placed, below its minMember {spec.min_member}"
                )
            continue
        protected = [p.key for p in placed if p.priority >= preemptor.priority]
        if protected:
            return (
                f"gang {spec.key} would have to go whole, but {', '.join(protected)} "
                "has priority >= the preemptor's"
            )
        listed = set(kept) | set(going)
        extra += [p.uid for p in placed if p.placed_node == candidate.node and p.uid not in listed]
    return VictimCandidate(candidate.node, [*kept, *extra], candidate.num_pdb_violations)


def _staying(
    candidate: VictimCandidate, state: ClusterState, going: Collection[str]
) -> tuple[list[str], list[PodRecord]]:
    """The candidate's victims not leaving already (see _judge), and those our watch knows."""
    kept: list[str] = []
    known: list[PodRecord] = []
    for uid in candidate.victim_uids:
        victim = state.pod_by_uid(uid)
        if victim is not None and victim.bind_refused and not victim.placed_node:
            continue  # the gate refused its bind call: not on the node
        if uid in going or (victim is not None and victim.deleting):
            continue
        kept.append(uid)
        if victim is not None:
            known.append(victim)
    return kept, known


def _victims_by_gang(
    preemptor: Preemptor, victims: list[PodRecord], state: ClusterState
) -> dict[str, tuple[GroupSpec, list[PodRecord]]] | str:
    """The victims that are gang members, per gang; or why the preemptor may not take them."""
    gangs: dict[str, tuple[GroupSpec, list[PodRecord]]] = {}
    for victim in victims:
        spec = victim_group(state, victim)
        if spec is None:
            continue  # a plain pod
        if spec.key == preemptor.group_key:
            return f"victim {victim.key} is a member of the preemptor's own gang {spec.key}"
        gangs.setdefault(spec.key, (spec, []))[1].append(victim)
    return gangs
