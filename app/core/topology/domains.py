"""Topology-aware gangs: the whole gang in one rack, block or zone. Pure decisions.

A topology *level* is a node label (`kubernetes.io/hostname`,
`example.com/rack`, `topology.kubernetes.io/zone`, ...); its values are the
*domains* of that level. The extender is configured once with the levels,
lowest tier first (`--topology-levels`), followed by the tiers of Volcano
HyperNodes when there are any (app/core/topology/hypernode.py). A gang asks for a level in
one of the ways its source knows (read by app/core/topology/sources.py): a native
PodGroup's topology key, Volcano's networkTopology (tiers: HyperNode tiers,
else the configured levels above the node), Kueue's annotations.

Required: every member in one domain of that level (Volcano hard: of a level
up to `highestTierAllowed`, lowest first). Preferred: the lowest level where
the whole gang fits in one domain, then the next level up, then anywhere.
Among the domains of a level, the fullest that still fits is tried first (the
least fragmentation: an empty rack stays empty for a larger gang). The
existing whole-gang decision (app/core/contention.py) runs per candidate domain.
Members placed already (a restarted member's siblings) pin the domain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from app.core.contention import Contest, Decision, Gang, Ruling, decide
from app.core.packing import Bin
from app.core.resources import Resources, fits, format_resources, total_of
from app.core.topology.hypernode import tier_of

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
DEFAULT_LEVELS = (HOSTNAME, ZONE)

# The label value of nodes outside any domain of a level.
_NO_DOMAIN = ""


class TopologyError(ValueError):
    """A topology constraint that cannot be used; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """Where a gang's members must (or should) be, together."""

    # The node label of the lowest level asked for ("" with `tier`: Volcano's first tier).
    key: str
    required: bool
    # Volcano highestTierAllowed: the widest tier allowed (1 = the lowest level above the node).
    tier: int | None = None
    # Volcano highestTierName: the widest tier allowed, by HyperNode spec.tierName.
    tier_name: str | None = None
    # Where it was declared, for messages ("PodGroup spec.schedulingConstraints.topology").
    origin: str = ""

    def describe(self) -> str:
        kind = "required" if self.required else "preferred"
        what = (
            f"topology key {self.key}"
            if self.key
            else f"network tier {self.tier_name or self.tier}"
        )
        return f"{kind} by {what} ({self.origin})" if self.origin else f"{kind} by {what}"


@dataclass(frozen=True, slots=True)
class Domain:
    """One domain of one level: the nodes whose label `level` has `value`."""

    level: str
    value: str

    def describe(self) -> str:
        return f"{short_level(self.level)} {self.value}"

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "value": self.value}


def short_level(level: str) -> str:
    """`example.com/rack` -> `rack`, `topology.kubernetes.io/zone` -> `zone`.

    A HyperNode tier (app/core/topology/hypernode.py) -> `tier-1 hypernode`.
    """
    tier = tier_of(level)
    if tier is not None:
        return f"tier-{tier} hypernode"
    return level.rsplit("/", 1)[-1]


def level_origin(level: str) -> str:
    """Where a level comes from, for messages: a node label or a HyperNode tier."""
    tier = tier_of(level)
    return f"HyperNode tier {tier}" if tier is not None else f"node label {level}"


# ---- configuration ---------------------------------------------------------------


def parse_levels(text: str) -> tuple[str, ...]:
    """`--topology-levels`: comma-separated node labels, lowest tier first, no repeats."""
    levels = tuple(part.strip() for part in text.split(",") if part.strip())
    if not levels:
        raise TopologyError("must name at least one node label (e.g. kubernetes.io/hostname)")
    if len(set(levels)) != len(levels):
        raise TopologyError(f"names a label twice: {text!r}")
    for level in levels:
        if any(c.isspace() for c in level):
            raise TopologyError(f"{level!r} is not a node label key")
    return levels


def with_key(levels: Sequence[str], key: str | None) -> tuple[str, ...]:
    """The levels with `--topology-key` added (just below the widest) when not among them."""
    if not key or key in levels:
        return tuple(levels)
    if len(levels) < 2:
        return (*levels, key)
    return (*levels[:-1], key, levels[-1])


def levels_to_try(
    constraint: TopologyConstraint,
    levels: Sequence[str],
    tier_names: Mapping[str, int] | None = None,
) -> tuple[list[str], bool]:
    """The levels a gang may be placed in, lowest first, and whether "anywhere" follows.

    levels: the configured node labels, then the HyperNode tiers there are
    (app/core/topology/hypernode.py). Volcano tiers are the HyperNode tiers when there are
    any (highestTierAllowed N: tiers 1..N; highestTierName: by spec.tierName),
    else the configured levels above the node (the hostname level is not a
    tier; a tier beyond the widest level is the widest level; a tier name is
    a level's short name, e.g. `rack`). A tier name that names none: no level.
    """
    hyper = [level for level in levels if tier_of(level) is not None]
    plain = [level for level in levels if tier_of(level) is None]
    if constraint.tier is not None or constraint.tier_name:
        if hyper:
            tiers = hyper
            highest = (
                (tier_names or {}).get(constraint.tier_name)
                if constraint.tier_name
                else constraint.tier
            )
            allowed = [level for level in hyper if highest and (tier_of(level) or 0) <= highest]
        else:
            tiers = [level for level in plain if level != HOSTNAME]
            if constraint.tier_name:
                short = [short_level(level) for level in tiers]
                highest = (
                    short.index(constraint.tier_name) + 1 if constraint.tier_name in short else 0
                )
            else:
                highest = constraint.tier or 0
            allowed = tiers[: min(highest, len(tiers))]
        if not constraint.required:
            return tiers, True
        return allowed, False
    key = constraint.key
    if constraint.required:
        return [key], False
    if key in plain:
        return list(plain[plain.index(key) :]), True
    return [key], True


# ---- placement --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    """decide() for a gang with a topology constraint, and the domain it was admitted in."""

    decision: Decision
    domain: Domain | None
    # Required level, no domain can hold the gang (not a matter of waiting in line).
    no_domain: bool = False


def by_domain(bins: Iterable[Bin], level: str) -> dict[str, list[Bin]]:
    """The bins per value of `level`; nodes without the label belong to no domain."""
    groups: dict[str, list[Bin]] = {}
    for b in bins:
        value = b.labels.get(level, _NO_DOMAIN)
        if value != _NO_DOMAIN:
            groups.setdefault(value, []).append(b)
    return groups


def fullest_first(groups: Mapping[str, Sequence[Bin]], need: Resources) -> list[str]:
    """The domains whose free capacity covers `need` in total, the least to spare first.

    Spare is measured relative to the need, summed over the resources the gang
    asks for: the fullest domain that can still hold the gang comes first.
    """
    fitting: list[tuple[float, str]] = []
    for value, bins in groups.items():
        # Only the resources the gang asks for: each domain's bins are summed
        # per call, thousands of them.
        free = {name: sum([b.free.get(name, 0) for b in bins]) for name in need}
        if not fits(need, free):
            continue
        spare = sum(
            (free.get(name, 0) - amount) / amount for name, amount in need.items() if amount
        )
        fitting.append((spare, value))
    return [value for _, value in sorted(fitting)]


def common_domain(
    nodes: Iterable[str], labels_of: Callable[[str], Mapping[str, str]], level: str
) -> str | None:
    """The one domain of `level` every node in `nodes` is in; None if none or several."""
    values = {labels_of(node).get(level, _NO_DOMAIN) for node in nodes}
    if len(values) != 1:
        return None
    value = values.pop()
    return value or None


@dataclass(frozen=True, slots=True)
class Where:
    """A gang's topology constraint, and what it is read against.

    levels: the node label keys from the lowest level up. placed_nodes:
    where the gang's placed members are; they pin the domain of each level
    (a restarted member goes back to its siblings' rack). tier_names:
    HyperNode spec.tierName -> tier, for Volcano's highestTierName.
    """

    constraint: TopologyConstraint
    levels: Sequence[str]
    placed_nodes: Sequence[str] = ()
    tier_names: Mapping[str, int] | None = None


DecideIn = Callable[[Contest, Domain | None], Decision]
"""The whole-gang decision inside one domain (None: anywhere), for place()."""


def place(
    candidate: Gang,
    where: Where,
    contest: Contest,
    now: float,
    aging_seconds: float,
    decide_in: DecideIn | None = None,
) -> Placed:
    """Admit `candidate` in one domain, trying levels lowest first and domains fullest first.

    decide_in: the decision inside one domain; default decide() (a gang made of
    groups places its sub-groups there first, app/core/topology/tree.py).
    """
    decide_in = decide_in or (lambda inside, _: decide(candidate, inside, now, aging_seconds))
    constraint, placed_nodes = where.constraint, where.placed_nodes
    tried, anywhere = levels_to_try(constraint, where.levels, where.tier_names)
    free, allocatable = contest.free, contest.allocatable
    # Only placed members' nodes are looked up (their domain pins the gang's).
    labels = {b.name: b.labels for b in (*free, *allocatable)} if placed_nodes else {}
    smallest = sorted(candidate.demands, key=lambda d: (sum(d.requests.values()), d.key))
    need = total_of(d.requests for d in smallest[: candidate.need])
    first_wait: Placed | None = None
    closest: tuple[Domain, Decision] | None = None
    for level in tried:
        groups = by_domain(free, level)
        alloc_groups = by_domain(allocatable, level) if allocatable else {}
        for value in _domain_order(groups, level, need, placed_nodes, labels):
            inside = replace(
                contest, free=groups[value], allocatable=alloc_groups.get(value, ()), positions=None
            )
            domain = Domain(level, value)
            decision = decide_in(inside, domain)
            if decision.verdict is Ruling.ADMIT:
                return Placed(decision, domain)
            if decision.verdict is Ruling.WAIT and first_wait is None:
                message = f"in {domain.describe()} ({constraint.describe()}): {decision.message}"
                waiting = Decision(Ruling.WAIT, behind=decision.behind, message=message)
                first_wait = Placed(waiting, None)
            elif closest is None:
                closest = (domain, decision)
    if anywhere:
        return Placed(decide_in(contest, None), None)
    if first_wait is not None:
        return first_wait
    return Placed(
        Decision(
            Ruling.SHORT,
            message=_no_domain_message(candidate, constraint, tried, need, placed_nodes, closest),
        ),
        None,
        no_domain=True,
    )


def _domain_order(
    groups: Mapping[str, Sequence[Bin]],
    level: str,
    need: Resources,
    placed_nodes: Sequence[str],
    labels: Mapping[str, Mapping[str, str]],
) -> list[str]:
    """The domains of `level` to try, in order: the placed members' own, else fullest first."""
    if not placed_nodes:
        return fullest_first(groups, need)
    pin = common_domain(placed_nodes, lambda node: labels.get(node, {}), level)
    return [pin] if pin is not None and pin in groups else []


def fits_one_domain(candidate: Gang, where: Where, free: Sequence[Bin]) -> bool:
    """Could the gang be admitted in one domain of its levels with the room free now?

    For the line of waiting gangs: a gang with a required level that no
    domain can hold now must not be counted as taking the room it would
    take anywhere, nor, once aged, hold back the gangs behind it.
    """
    return place(candidate, where, Contest(free), 0.0, 0.0).decision.verdict is Ruling.ADMIT


def placed_domain(
    constraint: TopologyConstraint,
    levels: Sequence[str],
    nodes: Sequence[str],
    labels_of: Callable[[str], Mapping[str, str]],
    tier_names: Mapping[str, int] | None = None,
) -> Domain | None:
    """The lowest domain of the gang's levels that every node in `nodes` is in; None: none."""
    if not nodes:
        return None
    for level in levels_to_try(constraint, levels, tier_names)[0]:
        value = common_domain(nodes, labels_of, level)
        if value is not None:
            return Domain(level, value)
    return None


def placed_message(key: str, constraint: TopologyConstraint, domain: Domain | None) -> str:
    """Where a gang with a topology constraint was placed (Event, log, PodGroup condition)."""
    if domain is None:
        return (
            f"gang {key} is placed anywhere: no single domain of its levels has room for it "
            f"now ({constraint.describe()})"
        )
    return (
        f"gang {key} is placed in {domain.describe()} "
        f"({short_level(domain.level)} = {level_origin(domain.level)}), {constraint.describe()}"
    )


def _no_domain_message(
    candidate: Gang,
    constraint: TopologyConstraint,
    tried: Sequence[str],
    need: Resources,
    placed_nodes: Sequence[str],
    closest: tuple[Domain, Decision] | None,
) -> str:
    where = " or ".join(short_level(level) for level in tried) or "topology level"
    text = (
        f"gang {candidate.key} needs its {candidate.need} missing member(s) "
        f"({format_resources({k: v for k, v in need.items() if v})}) in one {where} "
        f"({constraint.describe()})"
    )
    if placed_nodes:
        text += f", with its members already placed on {', '.join(sorted(set(placed_nodes))[:5])}"
    if not tried and constraint.tier_name:
        return text + (
            f"; highestTierName {constraint.tier_name} names no tier: no HyperNode has "
            f"spec.tierName {constraint.tier_name} and no level of --topology-levels is called so"
        )
    if not tried:
        return text + "; no topology level is configured above the node (--topology-levels)"
    if closest is None:
        return (
            text + f"; no {where} has that much free now (nodes without the "
            f"{level_origin(tried[-1])} belong to none); it stays pending, nothing is "
            "reserved, and is retried as capacity frees"
        )
    domain, decision = closest
    return (
        text + f"; none holds them now (closest, {domain.describe()}: {decision.message}); it "
        "stays pending, nothing is reserved, and is retried as capacity frees"
    )


def domain_message(
    group_key: str, domain: Domain, constraint: TopologyConstraint, node_value: str | None
) -> str:
    """What a node outside the gang's domain is told (kubectl describe pod)."""
    if node_value:
        where = f"this node is in {short_level(domain.level)} {node_value}"
    elif tier_of(domain.level) is not None:
        where = f"this node is in no {short_level(domain.level)}"
    else:
        where = f"this node has no label {domain.level}"
    return f"gang {group_key} is placed in {domain.describe()}, {constraint.describe()}; {where}"
