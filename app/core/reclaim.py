"""Reclaim's choice: which whole gangs of queues above their share make room for a needy one. Pure.

The rule is in docs/queues.md ("Reclaim") and choose_victims(); the queues'
shares it reads are app/core/queues.py's, the evictions
app/runtime/queues/reclaimer.py's. Room is judged by the needy gang's own
fits test (its topology: one domain of a required level, its slices in
theirs), so no victim is taken whose room the gang cannot use.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from app.core.packing import Bin, Demand, give, index_of, pack
from app.core.queues import QueueView, Running

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
) -> list[str] | None:
    """The gangs to evict so a gang of queue `needy` fits; None when reclaim cannot help
    (or is not needed: the gang fits in `free` already).

    Victims: whole gangs of reclaimable queues other than `needy` that are
    above their deserved share when chosen (a queue is not taken below it),
    lowest priority first, then the most recently created; then the fewest:
    a victim whose room turns out not to be needed is spared again, until
    every victim left is needed (without any one of them the gang does not fit).

    `fits`: the gang's own test (default: `need` of `demands` anywhere,
    flat_fits). `domains`: node sets the gang may have to fit inside one of
    (the domains of its required topology level). The victims of every pool
    are tried: first all of them, then per domain only those holding room in
    it (so a queue's share is not spent on victims elsewhere before the ones
    in a domain that can hold the gang are reached); the plan with the fewest
    victims wins, then the one whose highest victim priority is lowest, then
    the one whose victims come first in the order above (the most recent).
    """
    test = fits or flat_fits(demands, need)
    if test(free):
        return None
    order = sorted(
        (g for g in running if g.queue != needy and _reclaimable(views.get(g.queue))),
        key=lambda g: (g.priority, -g.created, g.key),
    )
    pools: list[list[Running]] = [order]
    seen = {tuple(g.key for g in order)}
    for nodes in domains:
        pool = [g for g in order if any(node in nodes for node in g.held)]
        keys = tuple(g.key for g in pool)
        if pool and keys not in seen:
            seen.add(keys)
            pools.append(pool)
    rank = {g.key: i for i, g in enumerate(order)}

    def cost(plan: Sequence[Running]) -> tuple[int, int, list[int]]:
        return len(plan), max(g.priority for g in plan), sorted(rank[g.key] for g in plan)

    best: list[Running] | None = None
    for pool in pools:
        plan = _plan(pool, free, views, test)
        if plan is not None and (best is None or cost(plan) < cost(best)):
            best = plan
    return [g.key for g in best] if best is not None else None


def _reclaimable(view: QueueView | None) -> bool:
    return view is not None and view.spec.reclaimable


def _plan(
    order: Sequence[Running],
    free: Sequence[Bin],
    views: Mapping[str, QueueView],
    fits: Fits,
) -> list[Running] | None:
    """choose_victims() over the candidates `order` (gangs of reclaimable queues other
    than the needy one), in that order; None: no plan."""
    bins = [b.with_free(dict(b.free)) for b in free]
    index = index_of(bins)
    allocated = {n: dict(v.allocated) for n, v in views.items()}
    chosen: list[Running] = []
    for gang in order:
        view = views[gang.queue]
        held = allocated[gang.queue]
        if not any(held.get(r, 0) > v for r, v in view.deserved.items()):
            continue
        chosen.append(gang)
        for r, v in gang.total.items():
            held[r] = held.get(r, 0) - v
        give(bins, gang.held, index=index)
        if fits(bins):
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
            if fits(trial):
                bins = trial
                chosen.remove(gang)
                spared = True
    return chosen
