"""Preemption for devices of pools published for many nodes: the victims that give them back.

The plan (planner.py, tree_plan.py) finds, node by node, the fewest victims
whose requests make room for the members placed there. A device of a pool
published for many nodes (ResourceSlice nodeSelector, allNodes) is no one
node's: every node the pool serves shows it in full (a pod there may take any
of it), and a victim on any of them that holds some of it frees it for all.
Read node by node, a plan would see the pool free on every node but the
holder's and evict nobody, and the gang would wait for devices nobody frees.

So once a plan is found, its members are drawn on the pools as a packing
draws on them (app/core/shared_pools.py PoolDraws: a member's node's own
devices first, then its pools as a flow, each pool once for the gang), with each pool
given back what the plan's victims hold of it (exactly their allocated
claims' devices; a claim shared by several pods once, and only when every pod
using it goes). What is still short is freed by the cheapest further victims
holding the pools' devices, wherever they run, by the same rules (lower
priority, budgets, fewest evictions first). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from app.core.packing import Bin, Demand
from app.core.preemption.cheapest_victims import Cost, Evictable, cheapest_victims
from app.core.preemption.planner import PlannedNode, Planner, PlanResult
from app.core.preemption.victim_pool import VictimPool, victim_pool
from app.core.preemption.victims import VictimPolicy
from app.core.resources import Resources, add
from app.core.shared_pools import PoolDraws, PoolHold, credited, freed_by, pool_shares
from app.core.state import ClusterState

# Rounds of further victims before the plan is given up (each round covers what the
# last replay found short; a later round is needed only where a freed claim is shared).
MAX_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class PoolVictims:
    """What a plan may add for the shared pools."""

    # What each allocated claim holds of each shared pool, and its users (pod keys).
    holds: Sequence[PoolHold]
    # Per node, the units the gang may evict wherever a pool's devices are held.
    units: Mapping[str, Sequence[Evictable]] = field(default_factory=dict)
    # Their budgets (running gangs under protect), with the plan's own.
    budgets: Mapping[str, int] = field(default_factory=dict)
    # Gang key -> its placed members' pod keys: a whole-gang unit takes them all along.
    whole: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def gone(self, units: Iterable[Evictable]) -> set[str]:
        """The pod keys that go with `units` (a whole-gang unit: every placed member)."""
        keys: set[str] = set()
        for unit in units:
            keys.update(unit.keys)
            if unit.gang is not None and unit.budget is None:
                keys.update(self.whole.get(unit.gang, ()))
        return keys


def pool_victims(
    state: ClusterState,
    policy: VictimPolicy,
    gang: tuple[str, int],
    holds: Sequence[PoolHold],
    pool: VictimPool,
    taken: Set[str],
) -> PoolVictims:
    """What gang (key, priority) may evict for the shared pools: the units wherever the
    `holds` run (victim_pool's rules), with `pool`'s (the plan's own nodes') budgets."""
    key, priority = gang
    pods = state.pods
    nodes = sorted(
        {
            record.placed_node
            for hold in holds
            for user in hold.users
            if (record := pods.get(user)) is not None and record.placed_node
        }
    )
    anywhere = victim_pool(state, policy, key, priority, nodes, taken)
    whole: dict[str, frozenset[str]] = {}
    if policy is VictimPolicy.WHOLE_GANG:
        for units in (*pool.by_node.values(), *anywhere.by_node.values()):
            for unit in units:
                if unit.gang is not None and unit.gang not in whole:
                    placed = state.placed_members(unit.gang)
                    whole[unit.gang] = frozenset(p.key for p in placed)
    return PoolVictims(holds, anywhere.by_node, {**anywhere.budgets, **pool.budgets}, whole)


def pooled(within: Planner, pools: PoolVictims) -> Planner:
    """`within`, with each plan it finds made whole for the shared pools (top_up)."""

    def planner(
        demands: Sequence[Demand],
        bins: Sequence[Bin],
        evictable: Mapping[str, Sequence[Evictable]],
        budgets: Mapping[str, int] | None,
    ) -> PlanResult | None:
        result = within(demands, bins, evictable, budgets)
        if result is None or not any(b.pools for b in bins):
            return result
        return top_up(result, demands, bins, pools, budgets)

    return planner


def top_up(
    result: PlanResult,
    demands: Sequence[Demand],
    bins: Sequence[Bin],
    pools: PoolVictims,
    budgets: Mapping[str, int] | None = None,
) -> PlanResult | None:
    """`result` with the further victims its members' shared pools need; None: none free enough.

    bins: the room the plan was made on (each pooled bin's pools as the room
    has them, what is leaving already given back).
    """
    requests = {d.key: d.requests for d in demands}
    limits = {**pools.budgets, **(budgets or {})}
    for _ in range(MAX_ROUNDS):
        short, serving = pool_shortfall(result, requests, bins, pools)
        if not short:
            return result
        extra = _cheapest(short, serving, result, pools, limits)
        if extra is None:
            return None
        result = _with(result, *extra)
    return None


def pool_shortfall(
    result: PlanResult,
    requests: Mapping[str, Resources],
    bins: Sequence[Bin],
    pools: PoolVictims,
) -> tuple[Resources, set[str]]:
    """What the plan's members lack of the shared pools once its victims are gone, and the
    names of the pools serving the members that lack it."""
    trial = room_after(result, bins, pools)
    index = {b.name: i for i, b in enumerate(trial)}
    draws = PoolDraws()
    short: Resources = {}
    serving: set[str] = set()
    for planned in result.nodes:
        i = index.get(planned.node)
        if i is None or not trial[i].pools:
            continue
        b = trial[i]
        for key in planned.members:
            missing = draws.draw(i, b, requests.get(key, {}))
            if missing:
                add(short, missing)
                serving.update(p.name for p in b.pools)
    return short, serving


def room_after(result: PlanResult, bins: Sequence[Bin], pools: PoolVictims) -> list[Bin]:
    """`bins` with the plan's victims gone: their requests back on their nodes, and the
    shared pools given back what their claims hold (copies; `bins` are left as they are)."""
    chosen = result.victims
    room = {b.name: dict(b.free) for b in bins}
    for unit in chosen:
        if unit.node in room:
            add(room[unit.node], unit.requests)
    return credited(
        [b.with_free(room[b.name]) for b in bins], freed_by(pools.holds, pools.gone(chosen))
    )


def member_draws(
    result: PlanResult,
    requests: Mapping[str, Resources],
    bins: Sequence[Bin],
    pools: PoolVictims,
) -> dict[str, dict[str, Resources]]:
    """What each planned member draws of each shared pool (member key -> pool name ->
    devices), drawn as a packing draws over the room the plan's victims leave."""
    plan = {key: planned.node for planned in result.nodes for key in planned.members}
    shares = pool_shares(requests, plan, room_after(result, bins, pools))
    return {key: {name: amounts for name, _node, amounts in drawn} for key, drawn in shares.items()}


def _cheapest(
    short: Resources,
    serving: Set[str],
    result: PlanResult,
    pools: PoolVictims,
    limits: Mapping[str, int],
) -> tuple[Cost, list[Evictable]] | None:
    """The cheapest units not in the plan whose claims free `short` of the `serving` pools."""
    chosen = result.victims
    taken = {uid for unit in chosen for uid in unit.uids}
    gone = pools.gone(chosen)
    holds = [h for h in pools.holds if h.pool.name in serving and not h.users <= gone]
    candidates: list[Evictable] = []
    originals: dict[tuple[str, ...], Evictable] = {}
    for units in pools.units.values():
        for unit in units:
            if taken.intersection(unit.uids):
                continue
            with_it = gone | pools.gone((unit,))
            frees: Resources = {}
            for hold in holds:
                if hold.users <= with_it:
                    add(frees, {r: v for r, v in hold.held.items() if r in short})
            if frees:
                candidates.append(unit._replace(requests=frees))
                originals[unit.uids] = unit
    spent: dict[str, int] = {}
    for unit in chosen:
        if unit.budget is not None:
            spent[unit.budget] = spent.get(unit.budget, 0) + 1
    left = {key: limit - spent.get(key, 0) for key, limit in limits.items()}
    found = cheapest_victims(short, candidates, left)
    if found is None:
        return None
    return found[0], [originals[unit.uids] for unit in found[1]]


def _with(result: PlanResult, cost: Cost, extra: Sequence[Evictable]) -> PlanResult:
    """The plan with `extra` victims on their nodes (a node with no member: victims only)."""
    nodes = list(result.nodes)
    where = {planned.node: i for i, planned in enumerate(nodes)}
    for unit in extra:
        i = where.get(unit.node)
        if i is None:
            where[unit.node] = len(nodes)
            nodes.append(PlannedNode(unit.node, (), (unit,)))
        else:
            planned = nodes[i]
            nodes[i] = PlannedNode(planned.node, planned.members, (*planned.victims, unit))
    return PlanResult(tuple(nodes), result.cost + cost, result.groups)
