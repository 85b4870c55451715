"""What a preempting gang may evict: the units on each node it plans over, and their budgets.

Only pods of lower priority than the gang, never its own members, never a
pod already leaving or promised to another plan. A running gang's members
go by the victim policy: under protect each member is a unit of one, drawn
from the gang's budget (the members above its minMember); under whole-gang
the members on one node are one unit that takes the whole gang along, and a
gang with any member that outranks the preemptor may not go at all.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from app.core.groups import GroupSpec
from app.core.preemption.cheapest_victims import Evictable, cheapest_victims
from app.core.preemption.eviction_budgets import protect_budget
from app.core.preemption.parked import room_as_scheduler_counts
from app.core.preemption.victims import Preemptor, VictimPolicy, victim_group
from app.core.records import PodRecord
from app.core.resources import Resources, add
from app.core.state import ClusterState


@dataclass
class VictimPool:
    """Per node, the units a gang may evict; and the budgets of running gangs (protect)."""

    by_node: dict[str, list[Evictable]] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)

    def offer(self, unit: Evictable) -> None:
        self.by_node.setdefault(unit.node, []).append(unit)


def victim_pool(
    state: ClusterState,
    policy: VictimPolicy,
    group_key: str,
    priority: int,
    nodes: Iterable[str],
    taken: Set[str],
) -> VictimPool:
    """What gang `group_key` (at `priority`) may evict on `nodes`; `taken`: other plans' victims."""
    pool = VictimPool()
    gangs: dict[str, GroupSpec | None] = {}
    # (gang, node) -> its members there, one unit each under the whole-gang policy.
    units: dict[tuple[str, str], list[PodRecord]] = {}
    leaving = state.leaving
    for pod in (p for name in nodes for p in state.pods_on(name)):
        if pod.priority >= priority or pod.terminal or pod.key in leaving or pod.uid in taken:
            continue
        spec = None
        if pod.group is not None:
            if pod.group.key == group_key:
                continue
            if pod.group.key not in gangs:
                gangs[pod.group.key] = victim_group(state, pod)
            spec = gangs[pod.group.key]
        if spec is None:
            pool.offer(_single(pod))
        elif policy is VictimPolicy.PROTECT:
            if spec.key not in pool.budgets:
                running = len(state.placed_members(spec.key))
                pool.budgets[spec.key] = protect_budget(running, spec.min_member)
            pool.offer(_single(pod, spec.key))
        else:
            units.setdefault((spec.key, pod.placed_node), []).append(pod)
    for (gang, _node), pods in units.items():
        whole = state.placed_members(gang)
        if any(p.priority >= priority for p in whole):
            continue  # the whole gang would go, and part of it outranks the preemptor
        pool.offer(_whole_gang(gang, pods, len(whole)))
    return pool


def _single(pod: PodRecord, gang: str | None = None) -> Evictable:
    """A pod as a unit of one; a protected gang's member spends its gang's budget."""
    uids, keys = (pod.uid,), (pod.key,)
    return Evictable(uids, keys, pod.placed_node, pod.requests, pod.priority, gang, gang)


def _whole_gang(gang: str, pods: list[PodRecord], evictions: int) -> Evictable:
    """A gang's members on one node, evicted with all `evictions` of the gang's placed members."""
    requests: Resources = {}
    for pod in pods:
        add(requests, pod.requests)
    return Evictable(
        tuple(p.uid for p in pods),
        tuple(p.key for p in pods),
        pods[0].placed_node,
        requests,
        max(p.priority for p in pods),
        gang,
        None,
        evictions,
    )


def node_victims(
    state: ClusterState,
    policy: VictimPolicy,
    preemptor: Preemptor,
    requests: Mapping[str, int],
    node: str,
    taken: Set[str] = frozenset(),
) -> list[str] | None:
    """The cheapest victims on `node` a pod in no gang may take there under the policy (the
    planner's pool and search, as for a gang), None when none let it fit; `taken`:
    victims someone else is evicting already.

    kube-scheduler's dry run ranks victims by priority and start time alone: of two pods
    of one priority it evicts the one started later, a running gang's member maybe, where
    another pod would do. The policy refuses that candidate (victims.select_victims), and
    the preemptor would wait though room can be made (the soak's seed 2: a pod of
    priority 10000 waited 13 minutes). Its node is offered again with these victims. The
    room is the node's as kube-scheduler counts it: every pod placed there, pods leaving
    included (they hold it until gone), less the pods nominated there at the
    preemptor's priority or above.
    """
    free = room_as_scheduler_counts(state, node, preemptor.priority, preemptor.uid)
    if free is None:
        return None
    deficit = {k: need - free.get(k, 0) for k, need in requests.items() if need > free.get(k, 0)}
    if not deficit:
        return None  # it fits as it is: nothing to evict for it
    pool = victim_pool(state, policy, preemptor.key, preemptor.priority, [node], taken)
    found = cheapest_victims(deficit, pool.by_node.get(node, []), pool.budgets)
    if found is None:
        return None
    return [uid for unit in found[1] for uid in unit.uids]
