"""Placing a gang made of groups: each sub-group whole in one domain of its level. Pure.

The tree (app/core/topology/subgroups.py): the gang, its slices or roles,
each member's path. place_tree(): in each domain of the gang's level
(fullest first, as for a flat gang, domains.place()), the members each
sub-group still lacks to reach its minimum are chosen (then the gang's own
minimum from the rest), and every constrained sub-group is given one domain
of its level inside its parent's, fullest first, where a first-fit packing
of its members, and of the sub-groups inside it, fits; the biggest
sub-group is given its domain first. The chosen members then carry their
sub-group's domain as a node selector into the one whole-gang decision
(app/core/contention.py), which weighs the line, the holders and aging as
for any gang: what it admits meets every sub-group's domain and every
role's minimum, or nothing is admitted. Members placed already pin their
sub-group's domain (a restarted member goes back to its slice's rack).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from app.core.contention import Contest, Decision, Gang, Ruling, decide, room_left
from app.core.packing import Bin, Demand, Packing, pack, take
from app.core.placement import ANY_NODE, Placement
from app.core.resources import Resources, fits, format_resources, total_of
from app.core.topology.domains import (
    Domain,
    TopologyConstraint,
    Where,
    by_domain,
    common_domain,
    fullest_first,
    level_origin,
    place,
    short_level,
)
from app.core.topology.subgroups import GangTree, Path, SubGroup

# ---- placement ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreePlaced:
    """place_tree()'s answer: the decision, the gang's domain and each sub-group's."""

    decision: Decision
    domain: Domain | None
    # Each constrained sub-group's domain (admitted gangs only).
    groups: Mapping[Path, Domain] = field(default_factory=dict)
    # Required level, no domain can hold the gang (not a matter of waiting in line).
    no_domain: bool = False


Resolve = Callable[[TopologyConstraint], tuple[list[str], bool]]
"""A sub-group's constraint as levels to try, lowest first, and whether "anywhere" follows
(domains.levels_to_try with the configured levels and HyperNode tiers)."""


def by_key(constraint: TopologyConstraint) -> tuple[list[str], bool]:
    """The default Resolve: the constraint's own node label (no tiers)."""
    return ([constraint.key] if constraint.key else []), not constraint.required


def place_tree(
    candidate: Gang,
    where: Where | None,
    tree: GangTree,
    contest: Contest,
    now: float,
    aging_seconds: float,
    resolve: Resolve = by_key,
) -> TreePlaced:
    """Admit `candidate` with each sub-group whole in one domain of its level (module doc).

    where: the gang's own constraint (None: no level for the gang as a whole).
    """
    chosen = choose(candidate, tree)
    nowhere = fits_no_node(candidate.key, chosen, tree, contest.free)
    if nowhere is not None:
        return TreePlaced(Decision(Ruling.SHORT, message=nowhere), None)
    labels: dict[str, Mapping[str, str]] = (
        {b.name: b.labels for b in (*contest.free, *contest.allocatable)} if tree.placed else {}
    )
    admitted: dict[Path, Domain] = {}

    def decide_in(inside: Contest, domain: Domain | None) -> Decision:
        assigner = _Assigner(tree, chosen, labels.get, resolve)
        domains = assigner.run(room_left(inside.free, inside.holders, inside.positions))
        if domains is None and inside.holders:
            # Not even with what other gangs hold now: is it theirs (wait) or the cluster's?
            domains = _Assigner(tree, chosen, labels.get, resolve).run(inside.free)
        if domains is None:
            return Decision(Ruling.SHORT, message=assigner.why(candidate.key, domain))
        held = tuple(_held_to(d, tree, domains) for d in chosen)
        decision = decide(
            replace(candidate, demands=held, need=len(held), packer=None),
            inside,
            now,
            aging_seconds,
        )
        if decision.verdict is Ruling.ADMIT:
            admitted.update(domains)
        return decision

    if where is None:
        decision = decide_in(contest, None)
        return TreePlaced(decision, None, admitted)
    placed = place(candidate, where, contest, now, aging_seconds, decide_in)
    return TreePlaced(placed.decision, placed.domain, admitted, placed.no_domain)


def pack_tree(tree: GangTree, resolve: Resolve, gang: Gang, bins: Sequence[Bin]) -> Packing:
    """The gang packed as its admission would place it: each sub-group whole in one
    domain of its level, fullest first (the room other gangs' decisions set aside for
    it while it waits in line)."""
    chosen = choose(gang, tree)
    labels = {b.name: b.labels for b in bins}
    room = [b.with_free(dict(b.free)) for b in bins]
    plan = _Assigner(tree, chosen, labels.get, resolve).plan(room)
    if plan is None:
        return Packing({}, gang.need, unplaced=tuple(d.key for d in chosen))
    return Packing(plan, gang.need)


def _size(demand: Demand) -> tuple[int, str]:
    return (sum(demand.requests.values()), demand.key)


def _under(path: Path, group: Path) -> bool:
    return path[: len(group)] == group


def choose(candidate: Gang, tree: GangTree) -> list[Demand]:
    """The members to place now: each sub-group's shortfall (deepest first), then the gang's.

    Smallest first within a sub-group, as a flat gang counts its need. A
    sub-group at its minimum already (its members placed) adds none.
    """
    paths = tree.paths
    picked: dict[str, Demand] = {}
    for group in sorted(tree.groups, key=lambda g: -len(g.path)):
        inside = [d for d in candidate.demands if _under(paths.get(d.key, ()), group.path)]
        have = sum(1 for path, _ in tree.placed if _under(path, group.path))
        have += sum(1 for d in inside if d.key in picked)
        short = group.min_member - have
        if short > 0:
            for demand in sorted((d for d in inside if d.key not in picked), key=_size)[:short]:
                picked[demand.key] = demand
    rest = candidate.need - len(picked)
    if rest > 0:
        for demand in sorted((d for d in candidate.demands if d.key not in picked), key=_size)[
            :rest
        ]:
            picked[demand.key] = demand
    return [d for d in candidate.demands if d.key in picked]


def _held_to(demand: Demand, tree: GangTree, domains: Mapping[Path, Domain]) -> Demand:
    """The member with its deepest sub-group's domain added as a node selector."""
    path = tree.paths.get(demand.key, ())
    domain = None
    for depth in range(len(path), 0, -1):
        domain = domains.get(path[:depth])
        if domain is not None:
            break
    if domain is None:
        return demand
    rules = demand.placement or ANY_NODE
    selector = tuple(sorted({*rules.node_selector, (domain.level, domain.value)}))
    return replace(demand, placement=Placement(selector, rules.terms, rules.tolerations))


def fits_no_node(
    key: str, chosen: Sequence[Demand], tree: GangTree, free: Sequence[Bin]
) -> str | None:
    """Why a sub-group's member fits on no node at all (naming the role), None if each may.

    Free capacity here is allocatable less the placed pods: no wait in line frees more.
    Members alike (sub-group, requests, placement) are asked once, and the first node
    with room ends the search.
    """
    asked: set[tuple[Path, tuple[tuple[str, int], ...], Placement | None]] = set()
    for demand in chosen:
        group = tree.group(tree.paths.get(demand.key, ()))
        if group is None:
            continue
        shape = (group.path, tuple(sorted(demand.requests.items())), demand.placement)
        if shape in asked:
            continue
        asked.add(shape)
        rules = demand.placement or ANY_NODE
        if any(
            fits(demand.requests, b.free) and rules.allows(b.name, b.labels, b.taints) for b in free
        ):
            continue
        allowed = [b for b in free if rules.allows(b.name, b.labels, b.taints)]
        wanted = {n: v for n, v in demand.requests.items() if v and n != "pods"}
        largest = {n: max((b.free.get(n, 0) for b in allowed), default=0) for n in wanted}
        return (
            f"gang {key} waits: {group.describe()} needs {format_resources(wanted)} on one "
            f"node; the largest free is {format_resources(largest)}"
            + ("" if allowed else " (no node its nodeSelector, affinity and taints allow)")
        )
    return None


class _Assigner:
    """Gives each constrained sub-group one domain inside its parent's, packing as it goes."""

    def __init__(
        self,
        tree: GangTree,
        chosen: Sequence[Demand],
        labels_of: Callable[[str], Mapping[str, str] | None],
        resolve: Resolve,
    ) -> None:
        self._labels_of = labels_of
        self._resolve = resolve
        self._children = tree.children()
        self._under: dict[Path, list[Demand]] = {(): list(chosen)}
        for group in tree.groups:
            self._under[group.path] = [
                d for d in chosen if _under(tree.paths.get(d.key, ()), group.path)
            ]
        self._pins: dict[Path, list[str]] = {}
        for group in tree.groups:
            nodes = [node for path, node in tree.placed if _under(path, group.path)]
            if nodes:
                self._pins[group.path] = nodes
        self.domains: dict[Path, Domain] = {}
        # The domains exclusive sub-groups were given (each holds one of them only).
        self._exclusive: set[Domain] = set()
        # The last sub-group no domain could hold (the outermost, once the run failed), and
        # the levels it was tried at.
        self._failed: tuple[SubGroup, list[str]] | None = None
        # The members left over where no sub-group was to blame, and their packing.
        self._short: tuple[Packing, list[Demand]] | None = None

    def plan(self, room: list[Bin]) -> dict[str, str] | None:
        """The chosen members' nodes, taken from `room`; None when a sub-group fits nowhere."""
        return self._assign((), room)

    def run(self, room: Sequence[Bin]) -> dict[Path, Domain] | None:
        """Each constrained sub-group's domain, None when one fits in none."""
        bins = [b.with_free(dict(b.free)) for b in room]
        if self._assign((), bins) is None:
            return None
        return self.domains

    def _assign(self, path: Path, bins: list[Bin]) -> dict[str, str] | None:
        """Pack the chosen members under `path` into `bins`, taking from them as it goes."""
        plan: dict[str, str] = {}
        children = sorted(
            self._children.get(path, ()),
            key=lambda g: (-sum(_size(d)[0] for d in self._under[g.path]), g.path),
        )
        for child in children:
            demands = self._under[child.path]
            if not demands:
                continue
            got = self._child(child, demands, bins)
            if got is None:
                return None
            plan.update(got)
        own = [d for d in self._under[path] if d.key not in plan]
        if own:
            packing = pack(own, bins)
            if not packing.fits:
                self._short = (packing, own)
                return None
            take(bins, packing.plan, own)
            plan.update(packing.plan)
        return plan

    def _child(
        self, child: SubGroup, demands: list[Demand], bins: list[Bin]
    ) -> dict[str, str] | None:
        """The child sub-group in the first domain of its level (fullest first) that holds it."""
        constraint = child.constraint
        if constraint is None:
            return self._assign(child.path, bins)
        levels, anywhere = self._resolve(constraint)
        for level in levels:  # lowest first
            groups = by_domain(bins, level)
            pins = self._pins.get(child.path)
            if pins:
                pin = common_domain(pins, lambda node: self._labels_of(node) or {}, level)
                order = [pin] if pin is not None and pin in groups else []
            else:
                order = fullest_first(groups, total_of(d.requests for d in demands))
            if child.exclusive:  # LWS: kube-scheduler's anti-affinity keeps sub-groups apart
                order = [value for value in order if Domain(level, value) not in self._exclusive]
            for value in order:
                inside = groups[value]
                trial = [b.with_free(dict(b.free)) for b in inside]
                plan = self._assign(child.path, trial)
                if plan is None:
                    continue
                take(inside, plan, demands)
                self.domains[child.path] = Domain(level, value)
                if child.exclusive:
                    self._exclusive.add(self.domains[child.path])
                return plan
        if anywhere:
            return self._assign(child.path, bins)  # preferred: anywhere inside its parent
        self._failed = (child, levels)
        return None

    def why(self, key: str, domain: Domain | None) -> str:
        """The sub-group that found no domain, for the members' FailedScheduling messages."""
        inside = f" inside {domain.describe()}" if domain is not None else ""
        if self._failed is None or self._failed[0].constraint is None:
            if self._short is None:
                return f"gang {key} does not fit{inside}"
            packing, demands = self._short
            return packing.describe(key, demands) + inside
        failed, levels = self._failed
        assert failed.constraint is not None
        demands = self._under[failed.path]
        need: Resources = {
            n: v for n, v in total_of(d.requests for d in demands).items() if v and n != "pods"
        }
        level = " or ".join(short_level(lv) for lv in levels) or "topology level"
        text = (
            f"gang {key} needs {failed.describe()} ({len(demands)} member(s), "
            f"{format_resources(need)}) whole in one {level}{inside} "
            f"({failed.constraint.describe()})"
        )
        if failed.path in self._pins:
            return text + f"; its placed members pin it to their {level}, which has no room now"
        if not levels:
            return text + "; no topology level is configured for it (--topology-levels)"
        return (
            text
            + f"; no {level} has room for it now (nodes without the {level_origin(levels[-1])} "
            "belong to none); it stays pending, nothing is reserved"
        )
