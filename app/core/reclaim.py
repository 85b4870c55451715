"""Reclaim's choice: which whole gangs of queues above their share make room for a needy one. Pure.

The rule is in docs/queues.md ("Reclaim") and choose_victims(); the queues'
shares it reads are app/core/queues.py's, the evictions
app/runtime/queues/reclaimer.py's. Room is judged by the needy gang's own
fits test (its topology: one domain of a required level, its slices in
theirs), so no victim is taken whose room the gang cannot use; a gang
constrained only on its slices looks for victims only in the domains its
slices take (app/core/reclaim_slices.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from app.core.packing import Bin, Demand, give, index_of, pack
from app.core.queues import QueueView, Running
from app.core.reclaim_slices import DomainCosts, SliceRoom, cheapest_domains
from app.core.resources import Resources, add, total_of
from app.core.resources import fits as fits_in
from app.core.shared_pools import PoolHold, credited, freed_by

Fits = Callable[[Sequence[Bin]], bool]
"""Whether the needy gang fits in this room by its own placement rules (its required
topology level, its sub-groups' domains...): the test reclaim chooses victims by."""


def flat_fits(demands: Sequence[Demand], need: int) -> Fits:
    """The fits test of a gang with no placement rules: `need` of `demands` packed anywhere."""
    return lambda bins: pack(demands, bins, need).fits


def choose_victims(
    needy: str,
    demands: Sequence[Demand],
    need: int,
    free: Sequence[Bin],
    running: Sequence[Running],
    views: Mapping[str, QueueView],
    *,
    fits: Fits | None = None,
    domains: Sequence[Collection[str]] = (),
    pool_holds: Sequence[PoolHold] = (),
    slices: SliceRoom | None = None,
) -> list[str] | None:
    """The gangs to evict so a gang of queue `needy` fits; None when reclaim cannot help
    (or is not needed: the gang fits in `free` already).

    Victims: whole gangs of reclaimable queues other than `needy` that are
    above their deserved share when chosen (a queue is not taken below it),
    lowest priority first, then the most recently created; then the fewest:
    a victim whose room turns out not to be needed is spared again, until
    every victim left is needed (without any one of them the gang does not fit).

    `fits`: the gang's own test (default: `need` of `demands` anywhere,
    flat_fits). `domains`: the node sets of the domains of its required
    topology level(s), one of which must hold it. Given them, the candidates
    are taken per domain, only those holding room in it (so a queue's share
    is not spent on victims in racks that cannot hold the gang before the
    ones in a rack that can are reached, nor a rack's room judged with
    victims elsewhere): the domains are tried in the order of their first
    candidate in the order above (at equal, lowest level first), those that
    could not hold the gang even with every candidate the share lets go are
    passed over without a packing, and the first plan found is taken.
    `slices`: for a gang with no required level of its own whose slices each
    need one domain of theirs: victims only in the domains the slices take,
    the fewest (_by_slices).
    `pool_holds`: what allocated claims hold of the device pools published for many nodes
    (app/core/shared_pools.py): a victim's going gives its pools back what its members'
    claims hold, as its nodes get their room back.
    """
    test = fits or flat_fits(demands, need)
    if test(free):
        return None
    order = sorted(
        (g for g in running if g.queue != needy and _reclaimable(views.get(g.queue))),
        key=lambda g: (g.priority, -g.created, g.key),
    )
    if domains:
        where = (domains, _least(demands, need))
        plan = _per_domain(order, free, views, (test, pool_holds), where)
    elif slices is not None:
        plan = _by_slices(order, free, views, (test, pool_holds), slices)
    else:
        plan = _plan(order, free, views, (test, pool_holds))
    return [g.key for g in plan] if plan is not None else None


def _given_back(
    bins: Sequence[Bin], chosen: Sequence[Running], holds: Sequence[PoolHold]
) -> Sequence[Bin]:
    """`bins` (the victims' nodes given their room back) with the shared pools given back
    what the `chosen` victims' claims hold: the room the gang would have once they go."""
    if not holds or not chosen:
        return bins
    freed = freed_by(holds, frozenset().union(*(g.pods for g in chosen)))
    return credited(bins, freed) if freed else bins


def _least(demands: Sequence[Demand], need: int) -> Resources:
    """The least room `need` of `demands` take: the smallest of them, summed."""
    smallest = sorted(demands, key=lambda d: (sum(d.requests.values()), d.key))
    return total_of(d.requests for d in smallest[:need])


def _per_domain(
    order: Sequence[Running],
    free: Sequence[Bin],
    views: Mapping[str, QueueView],
    test: tuple[Fits, Sequence[PoolHold]],
    where: tuple[Sequence[Collection[str]], Resources],
) -> list[Running] | None:
    """The first plan of one domain's candidates (choose_victims); `where`: the domains and
    the least room the gang takes in one of them."""
    domains, least = where
    rank = {g.key: i for i, g in enumerate(order)}
    pools: list[tuple[int, int, list[Running], Collection[str]]] = []
    for i, nodes in enumerate(domains):
        pool = [g for g in order if any(node in nodes for node in g.held)]
        if pool:
            pools.append((rank[pool[0].key], i, pool, nodes))
    for _, _, pool, nodes in sorted(pools, key=lambda p: p[:2]):
        if _may_hold(nodes, free, _takeable(pool, views), least):
            plan = _plan(pool, free, views, test)
            if plan is not None:
                return plan
    return None


def _by_slices(
    order: Sequence[Running],
    free: Sequence[Bin],
    views: Mapping[str, QueueView],
    test: tuple[Fits, Sequence[PoolHold]],
    slices: SliceRoom,
) -> list[Running] | None:
    """choose_victims() for a gang constrained only on its slices: at each of their levels
    (lowest first), the victims of the domains the knapsack picks (reclaim_slices.py) tried
    first, then the rest of those domains' candidates; failing that, those of every domain
    that may hold a slice. Members in no slice may need room elsewhere: then, last, any."""
    for domains in slices.levels:
        plan = _sliced(order, free, views, test, (slices, domains))
        if plan is not None:
            return plan
    return _plan(order, free, views, test) if slices.loose else None


def _sliced(
    order: Sequence[Running],
    free: Sequence[Bin],
    views: Mapping[str, QueueView],
    test: tuple[Fits, Sequence[PoolHold]],
    where: tuple[SliceRoom, Sequence[Collection[str]]],
) -> list[Running] | None:
    """_by_slices() at one level; `where`: the slices and the domains of the level."""
    shape, domains = where
    domain_of = {node: i for i, nodes in enumerate(domains) for node in nodes}
    pools: list[list[Running]] = [[] for _ in domains]
    for gang in order:
        for i in sorted({domain_of[n] for n in gang.held if n in domain_of}):
            pools[i].append(gang)
    bins: list[list[Bin]] = [[] for _ in domains]
    for b in free:
        if b.name in domain_of:
            bins[domain_of[b.name]].append(b)
    rank = {g.key: i for i, g in enumerate(order)}
    options = [
        DomainCosts(bins[i], _takeable(pools[i], views), shape).costs(rank)
        for i in range(len(domains))
    ]
    picked = cheapest_domains(options, shape.count)
    every = [i for i, o in enumerate(options) if o]
    if picked is not None:
        planned, chosen = picked
        planned.sort(key=lambda g: rank[g.key])
        first = {g.key for g in planned}
        rest = (g for g in _in(order, pools, chosen) if g.key not in first)
        plan = _plan([*planned, *rest], free, views, test, len(planned))
        if plan is not None or sorted(chosen) == every:
            return plan
    # The bound was wrong (nodes of other shapes, a pinned slice): every domain that may
    # hold a slice, in reclaim's order.
    return _plan(_in(order, pools, every), free, views, test) if every else None


def _in(
    order: Sequence[Running], pools: Sequence[Sequence[Running]], chosen: Sequence[int]
) -> list[Running]:
    """The candidates of `order` holding room in the domains `chosen` (pools: each domain's)."""
    keys = {g.key for i in chosen for g in pools[i]}
    return [g for g in order if g.key in keys]


def _may_hold(
    nodes: Collection[str], free: Sequence[Bin], pool: Sequence[Running], least: Resources
) -> bool:
    """Could the domain hold `least` with every candidate in `pool` gone (those the greedy
    pass may take)? A cheap bound: most domains of a large cluster are passed over
    without a packing. Not one served by a shared device pool: its devices are not in
    the nodes' free room, so no bound is read there."""
    within = [b for b in free if b.name in nodes]
    if any(b.pools for b in within):
        return True
    room = total_of(b.free for b in within)
    for gang in pool:
        for node, amounts in gang.held.items():
            if node in nodes:
                add(room, amounts)
    return fits_in(least, room)


def _reclaimable(view: QueueView | None) -> bool:
    return view is not None and view.spec.reclaimable


def _takeable(order: Sequence[Running], views: Mapping[str, QueueView]) -> list[Running]:
    """The candidates of `order` the greedy pass would take one after the other were the gang
    never to fit: each while its queue is still above its share (the queue is not taken
    below it). The greedy pass takes a prefix of them."""
    allocated = {n: dict(v.allocated) for n, v in views.items()}
    taken: list[Running] = []
    for gang in order:
        held = allocated[gang.queue]
        if any(held.get(r, 0) > v for r, v in views[gang.queue].deserved.items()):
            taken.append(gang)
            for r, v in gang.total.items():
                held[r] = held.get(r, 0) - v
    return taken


def _plan(
    order: Sequence[Running],
    free: Sequence[Bin],
    views: Mapping[str, QueueView],
    test: tuple[Fits, Sequence[PoolHold]],
    at_once: int = 0,
) -> list[Running] | None:
    """choose_victims() over the candidates `order` (gangs of reclaimable queues other
    than the needy one), in that order; None: no plan. `test`: the gang's fits test and
    the shared pools' holds (given back for the victims chosen). `at_once`: the first so
    many candidates are taken before the first test (a bound said they are needed)."""
    fits, holds = test
    bins = [b.with_free(dict(b.free)) for b in free]
    index = index_of(bins)
    chosen: list[Running] = []
    takeable = _takeable(order, views)
    at_once = min(at_once, len(takeable))
    for gang in takeable:
        chosen.append(gang)
        give(bins, gang.held, index=index)
        if len(chosen) >= at_once and fits(_given_back(bins, chosen, holds)):
            break
    else:
        return None
    # The fewest: spare any victim the gang fits without, latest chosen first, until
    # none can be spared (a fits test need not be monotone: first fit, a tree's domains).
    spared = True
    while spared:
        spared = False
        for gang in reversed(list(chosen)):
            trial = [b.with_free(dict(b.free)) for b in bins]
            give(
                trial, {n: {r: -v for r, v in amounts.items()} for n, amounts in gang.held.items()}
            )
            if fits(_given_back(trial, [g for g in chosen if g is not gang], holds)):
                bins = trial
                chosen.remove(gang)
                spared = True
    return chosen
