"""The bounded search behind first fit (app/core/packing_search.py), against brute force."""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.core.contention import Contest, Gang, Ruling, decide
from app.core.packing import Bin, Demand, pack
from app.core.packing_search import pack_thoroughly, search
from app.core.placement import Placement
from app.core.resources import fits, subtract

ZONE_A = Placement(node_selector=(("zone", "a"),))


def _bins(nodes: list[tuple[int, int, int, str]]) -> list[Bin]:
    return [
        Bin(f"n{i}", {"cpu": c, "memory": m, "pods": p}, {"zone": z})
        for i, (c, m, p, z) in enumerate(nodes)
    ]


def _demands(members: list[tuple[int, int, bool]]) -> list[Demand]:
    return [
        Demand(f"m{i}", {"cpu": c, "memory": m, "pods": 1}, ZONE_A if zoned else None)
        for i, (c, m, zoned) in enumerate(members)
    ]


def _placeable(demands: list[Demand], bins: list[Bin], wanted: int) -> bool:
    """Brute force: some choice of node (or none) per member places `wanted` of them."""
    for choice in itertools.product(range(-1, len(bins)), repeat=len(demands)):
        if sum(1 for c in choice if c >= 0) < wanted:
            continue
        left = [dict(b.free) for b in bins]
        ok = True
        for d, c in zip(demands, choice, strict=True):
            if c < 0:
                continue
            b = bins[c]
            rules = d.placement or Placement()
            if not rules.allows(b.name, b.labels, b.taints) or not fits(d.requests, left[c]):
                ok = False
                break
            subtract(left[c], d.requests)
        if ok:
            return True
    return False


def _valid(plan: dict[str, str], demands: list[Demand], bins: list[Bin]) -> bool:
    by_name = {b.name: dict(b.free) for b in bins}
    labels = {b.name: b.labels for b in bins}
    for d in demands:
        node = plan.get(d.key)
        if node is None:
            continue
        if not (d.placement or Placement()).allows(node, labels[node], ()):
            return False
        if not fits(d.requests, by_name[node]):
            return False
        subtract(by_name[node], d.requests)
    return True


def test_first_fit_misses_a_gang_that_fits_and_the_search_places_it() -> None:
    # Nodes of 6 and 4 CPU, 4 GiB each; members 1 CPU / 4 GiB and 5 CPU / 1 GiB. First
    # fit puts the first (equal dominant share, first by name) on the 6-CPU node, and the
    # second then fits nowhere; on an empty cluster that answer never changes.
    bins = _bins([(6, 4, 2, "a"), (4, 4, 2, "a")])
    demands = [
        Demand("a", {"cpu": 1, "memory": 4, "pods": 1}),
        Demand("b", {"cpu": 5, "memory": 1, "pods": 1}),
    ]
    assert not pack(demands, bins).fits
    packing = pack_thoroughly(demands, bins)
    assert packing.fits
    assert packing.plan == {"a": "n1", "b": "n0"}


def test_an_aged_gang_first_fit_misplaces_is_admitted_not_passed_over() -> None:
    # The decision the filter verb makes for that gang, in line and aged: admitted.
    bins = _bins([(6, 4, 2, "a"), (4, 4, 2, "a")])
    gang = Gang(
        "ns/big",
        0,
        0.0,
        (
            Demand("big-0", {"cpu": 1, "memory": 4, "pods": 1}),
            Demand("big-1", {"cpu": 5, "memory": 1, "pods": 1}),
        ),
        2,
        waiting_since=-100.0,
    )
    decision = decide(gang, Contest(bins, (), [gang], bins), 0.0, 60.0)
    assert decision.verdict is Ruling.ADMIT
    assert decision.plan == {"big-0": "n1", "big-1": "n0"}


def test_short_in_total_is_first_fits_answer_without_a_search() -> None:
    bins = _bins([(4, 4, 2, "a")])
    demands = _demands([(3, 1, False), (3, 1, False)])
    packing = pack_thoroughly(demands, bins)
    assert not packing.fits
    assert packing.shortfall == {"cpu": 2}


def test_the_search_gives_up_at_its_budget() -> None:
    bins = _bins([(6, 4, 2, "a"), (4, 4, 2, "a")])
    demands = [
        Demand("a", {"cpu": 1, "memory": 4, "pods": 1}),
        Demand("b", {"cpu": 5, "memory": 1, "pods": 1}),
    ]
    assert search(demands, bins, 2) is not None
    assert search(demands, bins, 2, budget=1) is None


_NODE = st.tuples(
    st.integers(1, 8), st.integers(1, 8), st.integers(1, 3), st.sampled_from(["a", "b"])
)
_MEMBER = st.tuples(st.integers(1, 6), st.integers(0, 6), st.booleans())


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(_NODE, min_size=1, max_size=3),
    members=st.lists(_MEMBER, min_size=1, max_size=4),
    fewer=st.integers(0, 2),
)
@example(nodes=[(6, 4, 2, "a"), (4, 4, 2, "a")], members=[(1, 4, False), (5, 1, False)], fewer=0)
@example(
    nodes=[(6, 4, 2, "a"), (4, 4, 2, "a"), (6, 4, 2, "a")],
    members=[(5, 0, False), (5, 0, False), (2, 4, False)],
    fewer=0,
)
@example(  # a member no node allows, and enough others (first fit took the wrong one)
    nodes=[(2, 1, 2, "b")],
    members=[(1, 0, False), (1, 0, False), (1, 0, True), (2, 0, False)],
    fewer=2,
)
def test_the_search_places_exactly_the_gangs_brute_force_can(
    nodes: list[tuple[int, int, int, str]], members: list[tuple[int, int, bool]], fewer: int
) -> None:
    bins = _bins(nodes)
    demands = _demands(members)
    wanted = max(1, len(demands) - fewer)
    packing = pack_thoroughly(demands, bins, wanted)
    assert packing.fits == _placeable(demands, bins, wanted)
    if packing.fits:
        assert len(packing.plan) >= wanted
        assert _valid(packing.plan, demands, bins)
