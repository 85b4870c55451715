"""Making a gang's preemption plan: its missing members, the room, the victims, the domain.

kube-scheduler's candidates are every node where evicting lower-priority pods
lets a member fit (in a cluster of more than 1,000 nodes, a 10% sample of
them, its own bound on preemption work); the nodes it did not offer either
fit a member already or cannot take one whatever is evicted. So the plan is
made over the nodes it offered and those with room for a member. A gang that
cannot preempt at all is told why, once per new reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial

from app.core.admission import wholeness
from app.core.contention import Gang
from app.core.groups import GroupRef, GroupSpec
from app.core.observer import GangObserver
from app.core.packing import Bin, Demand
from app.core.preemption.planner import Planner, PlanResult, plan, plan_in_domains
from app.core.preemption.pool_victims import PoolVictims, member_draws, pool_victims, pooled
from app.core.preemption.tree_plan import plan_tree
from app.core.preemption.victim_pool import VictimPool, victim_pool
from app.core.preemption.victims import Preemptor, VictimPolicy
from app.core.resources import Resources, add, fits
from app.core.shared_pools import freed_by
from app.core.state import ClusterState
from app.core.topology.domains import (
    Domain,
    TopologyConstraint,
    TopologyError,
    by_domain,
    common_domain,
    level_origin,
    levels_to_try,
    short_level,
)
from app.core.topology.sources import constraint_of
from app.core.topology.subgroups import GangTree
from app.core.topology.tree import choose
from app.runtime.gang_tree import gang_tree
from app.runtime.preemption.line_check import LineCheck
from app.runtime.preemption.plan import Answer, Plan, Slot
from app.runtime.preemption.plan_book import PlanBook
from app.runtime.preemption.room import PreemptionRoom

log = logging.getLogger(__name__)

# Past this many gangs told a refusal, the notes start over (each may be told once more).
_FORGET_REFUSALS_ABOVE = 10_000


class PlanMaker:
    def __init__(
        self,
        state: ClusterState,
        policy: VictimPolicy,
        book: PlanBook,
        room: PreemptionRoom,
        observer: GangObserver,
        levels: tuple[str, ...],
    ) -> None:
        self._state = state
        self._policy = policy
        self._book = book
        self._room = room
        self._observer = observer
        self._levels = levels
        # group -> the last refusal told to its users (an Event once per new reason).
        self._refused: dict[str, str] = {}
        # The line's verdict on the room a plan's victims leave (None: no line to ask).
        self.line: LineCheck | None = None

    def make(
        self,
        spec: GroupSpec,
        ref: GroupRef,
        preemptor: Preemptor,
        own: Demand,
        offered: set[str],
        now: float,
    ) -> Plan | Answer:
        """The gang's new plan, kept in the book; or the answer when there is nothing to plan."""
        try:
            tree, within = self._planner(spec)
        except TopologyError as error:
            return self._refusal(spec.key, f"gang {spec.key} cannot preempt: {error}")
        demands = self._demands(spec, preemptor, own, tree)
        bins = self._bins(spec.key, preemptor.priority, demands, offered)
        gang, taken = (spec.key, preemptor.priority), self._book.taken()
        pool = victim_pool(self._state, self._policy, *gang, [b.name for b in bins], taken)
        constraint = constraint_of(
            spec.topology, ((p.key, p.topology) for p in self._state.members(spec.key))
        )
        pools = None
        if any(b.pools for b in bins):  # victims may free devices of shared pools
            holds = self._room.pool_holds()
            pools = pool_victims(self._state, self._policy, gang, holds, pool, taken)
            within = pooled(within, pools)
        domain, result = self._search(spec.key, constraint, demands, bins, pool, within)
        if result is None:
            return self._refusal(spec.key, self._cannot(spec.key, constraint, len(demands), tree))
        made = _from_result(
            ref, preemptor.priority, result, demands, now, self._book.deadline(now), tree
        )
        made.domain = domain
        if pools is not None:  # what each slot's member draws of the shared pools
            _draw_slots(made, member_draws(result, _requests(demands), bins, pools))
        if not made.victims:
            # The members fit without evicting anyone (room being freed, or free
            # room the filter keeps for a gang ahead in line): nothing to evict.
            return Answer(
                [],
                f"the {len(demands)} member(s) of gang {spec.key} still needing room fit "
                "without evictions; they wait for it",
                unplanned=True,
            )
        waits = self._line_waits(spec, preemptor, own, made, pools)
        if waits is not None:
            return self._refusal(
                spec.key,
                f"gang {spec.key} preempts nothing: evicting {made.evictions} pod(s) would not "
                f"start it, the line keeps it waiting: {waits}",
            )
        self._book.add(made)
        self._refused.pop(spec.key, None)
        where = f" in {domain.describe()} ({level_origin(domain.level)})" if domain else ""
        text = f"gang {spec.key} preempts{where}: {made.describe()}"
        log.info(text, extra={"podgroup": spec.key, "pod": preemptor.key, "verb": "preempt"})
        self._observer.preemption_planned(spec.key, text)
        return made

    def _planner(self, spec: GroupSpec) -> tuple[GangTree | None, Planner]:
        """The gang's tree (None: flat) and the planner for one domain (TopologyError: its
        slices cannot be read): each sub-group in a domain of its level, as the filter reads it."""
        tree = gang_tree(self._state, spec)
        if tree is None or not tree.groups:
            return None, plan
        return tree, partial(
            plan_tree, tree=tree, resolve=self._levels_to_try, labels_of=self._state.labels_of
        )

    def _refusal(self, group_key: str, message: str) -> Answer:
        """Nothing to evict: the users are told why (refuse()), and so is the member."""
        self.refuse(group_key, message)
        return Answer([], message, unplanned=True)

    def _line_waits(
        self,
        spec: GroupSpec,
        preemptor: Preemptor,
        own: Demand,
        made: Plan,
        pools: PoolVictims | None = None,
    ) -> str | None:
        """Why the line would keep the gang waiting once the plan's victims are gone."""
        if self.line is None:
            return None
        freed: dict[str, Resources] = {}
        gone: set[str] = set()
        for uid, (key, node) in made.victims.items():
            victim = self._state.pod_by_uid(uid)
            gone.add(key)
            if victim is not None:
                add(freed.setdefault(node, {}), victim.requests)
                if pools is not None and victim.group is not None:
                    gone |= pools.whole.get(victim.group.key, frozenset())
        given = freed_by(pools.holds, gone | set(self._state.leaving)) if pools else []
        return self.line.waits(spec, preemptor.uid, own, freed, given)

    def refuse(self, group_key: str, message: str) -> None:
        """Tell the gang's users why it cannot preempt, unless that was the last thing told."""
        if self._refused.get(group_key) == message:
            return
        if len(self._refused) > _FORGET_REFUSALS_ABOVE:
            self._refused.clear()
        self._refused[group_key] = message
        self._observer.preemption_refused(group_key, message)

    def _demands(
        self, spec: GroupSpec, preemptor: Preemptor, own: Demand, tree: GangTree | None = None
    ) -> list[Demand]:
        """The members the gang still needs placed, the preemptor first.

        A gang made of groups: each sub-group's shortfall first, as its admission
        chooses them (tree.choose), so that what is planned can be admitted.
        """
        members = self._state.members(spec.key)
        placed = len(self._state.placed_members(spec.key))
        missing = max(wholeness(spec, placed).missing, 1)
        others = sorted(
            (
                Demand(p.key, p.requests, p.placement)
                for p in members
                if not p.placed_node and p.counts_as_member and p.uid != preemptor.uid
            ),
            key=lambda d: (sum(d.requests.values()), d.key),
        )
        if tree is None:
            return [own, *others][:missing]
        gang = Gang(spec.key, preemptor.priority, 0.0, (own, *others), missing)
        return choose(gang, tree)

    def _bins(
        self, group_key: str, priority: int, demands: Sequence[Demand], offered: set[str]
    ) -> list[Bin]:
        """The nodes kube-scheduler offered, and those with room for the smallest member."""
        smallest = min(demands, key=lambda d: sum(d.requests.values())).requests
        return [
            b
            for b in self._room.bins(group_key, priority)
            if b.name in offered or fits(smallest, b.free)
        ]

    def _search(
        self,
        key: str,
        constraint: TopologyConstraint | None,
        demands: Sequence[Demand],
        bins: Sequence[Bin],
        pool: VictimPool,
        within: Planner = plan,
    ) -> tuple[Domain | None, PlanResult | None]:
        if constraint is None:
            return None, within(demands, bins, pool.by_node, pool.budgets)
        return self._plan_in_topology(key, constraint, demands, bins, pool, within)

    def _cannot(
        self,
        key: str,
        constraint: TopologyConstraint | None,
        missing: int,
        tree: GangTree | None = None,
    ) -> str:
        where = ""
        if tree is not None:
            where = " with each of its sub-groups whole in one domain of its level"
        if constraint is not None and constraint.required:
            levels = " or ".join(short_level(level) for level in self._levels_to_try(constraint)[0])
            where += f" in any one {levels} ({constraint.describe()})"
        return (
            f"gang {key} cannot preempt: its {missing} missing member(s) do not "
            f"fit{where} even after evicting every pod they may evict (lower priority, not "
            "in the gang, not protected by a running gang's minMember under "
            f"--gang-victim-policy={self._policy})"
        )

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
        pool: VictimPool,
        within: Planner = plan,
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
                pool.by_node,
                pool.budgets,
                [(value, [b.name for b in members]) for value, members in sorted(groups.items())],
                within,
            )
            if found is not None:
                return Domain(level, found[0]), found[1]
        if anywhere:
            return None, within(demands, bins, pool.by_node, pool.budgets)
        return None, None


def _requests(demands: Sequence[Demand]) -> dict[str, Resources]:
    return {d.key: d.requests for d in demands}


def _draw_slots(made: Plan, draws: Mapping[str, dict[str, Resources]]) -> None:
    """Record on each slot what its planned member draws of the shared pools."""
    for slot in made.slots:
        slot.pools = draws.get(slot.planned, {})


def _from_result(
    ref: GroupRef,
    priority: int,
    result: PlanResult,
    demands: Sequence[Demand],
    now: float,
    deadline: float,
    tree: GangTree | None = None,
) -> Plan:
    """The plan's slots (a gang made of groups: each for a member of its sub-group)."""
    requests = _requests(demands)
    paths = tree.paths if tree is not None else {}
    slots: list[Slot] = []
    victims: dict[str, tuple[str, str]] = {}
    for planned in result.nodes:
        uids = tuple(uid for v in planned.victims for uid in v.uids)
        for unit in planned.victims:
            for uid, key in zip(unit.uids, unit.keys, strict=True):
                victims[uid] = (key, planned.node)
        for i, member in enumerate(planned.members):
            slots.append(
                Slot(
                    planned.node,
                    requests[member],
                    uids if i == 0 else (),
                    path=paths.get(member, ()),
                    planned=member,
                )
            )
    return Plan(
        ref=ref,
        priority=priority,
        made_at=now,
        deadline=deadline,
        slots=slots,
        victims=victims,
        evictions=result.cost.evictions,
        paths=dict(paths),
        groups=dict(result.groups),
    )
