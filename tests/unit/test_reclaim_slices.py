"""Reclaim for a gang constrained only on its slices: victims only in the racks its slices take.

The gang has no required level of its own; each slice of 2 one-CPU members
must fit whole in one rack (Kueue podset-slice-required-topology). Its fits
test is the admission's (place_tree), as app/runtime/queues/reclaim_checks.py
builds it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Contest, Gang, Ruling
from app.core.packing import Bin, Demand, give
from app.core.queues import QueueView, Running
from app.core.reclaim import Fits, choose_victims
from app.core.reclaim_slices import SliceRoom
from app.core.topology.domains import Domain
from app.core.topology.subgroups import GangShape, GangTree, Member, Slicing, tree_of
from app.core.topology.tree import place_tree
from tests.unit.test_queues import CPU, cpu, q, view

RACK = "example.com/rack"


def rack_nodes(racks: int, per_rack: int, cores: float = 1) -> list[Bin]:
    """Full racks r0.. of `per_rack` nodes of `cores` each (node names r<i>-n<j>)."""
    return [
        Bin(f"r{r}-n{n}", cpu(0), {RACK: f"r{r}"}) for r in range(racks) for n in range(per_rack)
    ]


def held(key: str, nodes: Mapping[str, float], created: float, queue: str = "a") -> Running:
    """A running gang of `queue` holding `nodes` (node -> cores)."""
    amounts = {n: cpu(c) for n, c in nodes.items()}
    return Running(key, queue, 0, created, amounts, cpu(sum(nodes.values())))


class SliceGang:
    """Queue b's gang of `count` one-CPU members in slices of `size` by rack, no gang level."""

    def __init__(self, count: int, size: int) -> None:
        members = [Member(f"b/x-{i}", rank=i) for i in range(count)]
        tree = tree_of("b/x", GangShape(Slicing(((RACK, size),), "test")), count, members)
        assert tree is not None
        self.tree: GangTree = tree
        self.demands = [Demand(m.key, cpu(1)) for m in members]
        self.gang = Gang("b/x", 0, 0.0, tuple(self.demands), count)
        self.size, self.count = size, count // size

    def placed(self, bins: Sequence[Bin]) -> Mapping[tuple[str, ...], Domain] | None:
        """Each slice's rack as the admission places the gang in `bins`; None: it does not fit."""
        got = place_tree(self.gang, None, self.tree, Contest(list(bins)), 0.0, 0.0)
        return got.groups if got.decision.verdict is Ruling.ADMIT else None

    def fits(self) -> Fits:
        return lambda bins: self.placed(bins) is not None

    def room(self, bins: Sequence[Bin]) -> SliceRoom:
        racks: dict[str, set[str]] = {}
        for b in bins:
            racks.setdefault(b.labels[RACK], set()).add(b.name)
        return SliceRoom(
            (tuple(frozenset(n) for n in racks.values()),), cpu(1), self.size, self.count
        )

    def victims(
        self, bins: Sequence[Bin], gangs: Sequence[Running], views: Mapping[str, QueueView]
    ) -> tuple[list[str] | None, list[str] | None]:
        """(the plan without the slices' room, the plan with it)."""
        args = ("b", self.demands, len(self.demands), bins, gangs, views)
        old = choose_victims(*args, fits=self.fits())
        return old, choose_victims(*args, fits=self.fits(), slices=self.room(bins))


def without(free: Sequence[Bin], gangs: Sequence[Running]) -> list[Bin]:
    bins = [b.with_free(dict(b.free)) for b in free]
    for gang in gangs:
        give(bins, gang.held)
    return bins


def test_a_rack_one_gang_frees_whole_is_fewer_victims_than_two_racks_of_small_ones() -> None:
    """Racks of two 1-CPU nodes. Queue a's most recent gangs are one-node gangs in r1 and r2;
    its oldest holds all of r3. Two slices of 2: reclaim's order alone takes r1's and r2's
    four gangs; r3's one gang and r1's two free the two racks with three."""
    bins = rack_nodes(4, 2)[2:]  # racks r1, r2, r3
    gangs = [
        held("a/r1-x", {"r1-n0": 1}, 9),
        held("a/r2-x", {"r2-n0": 1}, 8),
        held("a/r1-y", {"r1-n1": 1}, 7),
        held("a/r2-y", {"r2-n1": 1}, 6),
        held("a/r3-big", {"r3-n0": 1, "r3-n1": 1}, 1),
    ]
    views = {"a": view(q("a"), 6, 0), "b": view(q("b"), 0, 6, head=4)}
    old, new = SliceGang(4, 2).victims(bins, gangs, views)
    assert old == ["a/r1-x", "a/r2-x", "a/r1-y", "a/r2-y"]
    assert new == ["a/r1-x", "a/r1-y", "a/r3-big"]


def test_a_queues_share_is_not_spent_in_racks_no_slice_can_use() -> None:
    """Two racks of two nodes, each node queue a's gang. a may lose two gangs: by reclaim's
    order the most recent, one in each rack, and no rack can then hold a slice of 2. The
    slices' search takes the two of one rack (the gangs of r0 come first, by rank)."""
    bins = rack_nodes(2, 2)
    gangs = [
        held("a/r0-new", {"r0-n0": 1}, 9),
        held("a/r1-new", {"r1-n0": 1}, 8),
        held("a/r1-old", {"r1-n1": 1}, 7),
        held("a/r0-old", {"r0-n1": 1}, 6),
    ]
    views = {"a": view(q("a"), 4, 2), "b": view(q("b"), 0, 6, head=2)}
    old, new = SliceGang(2, 2).victims(bins, gangs, views)
    assert old is None
    assert new == ["a/r0-new", "a/r0-old"]


def test_no_rack_can_hold_a_slice_nothing_is_evicted() -> None:
    bins = rack_nodes(2, 1)
    gangs = [held("a/r0", {"r0-n0": 1}, 2), held("a/r1", {"r1-n0": 1}, 1)]
    views = {"a": view(q("a"), 2, 0), "b": view(q("b"), 0, 6, head=2)}
    old, new = SliceGang(2, 2).victims(bins, gangs, views)
    assert old is None and new is None


@st.composite
def slice_worlds(
    draw: st.DrawFn,
) -> tuple[list[Bin], list[Running], dict[str, QueueView], SliceGang]:
    """Three racks of two or three 2-CPU nodes, some room free; gangs of queues a, c (and b's
    own) on one to three nodes, anywhere; queue b's gang of 1 to 3 slices of 1 or 2."""
    bins = [
        Bin(f"r{r}-n{n}", cpu(draw(st.integers(0, 1))), {RACK: f"r{r}"})
        for r in range(3)
        for n in range(draw(st.integers(2, 3)))
    ]
    names = [b.name for b in bins]
    gangs: list[Running] = []
    for i in range(draw(st.integers(1, 9))):
        queue = draw(st.sampled_from(["a", "a", "a", "b", "c"]))
        nodes = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        cores = {n: float(draw(st.integers(1, 2))) for n in nodes}
        gangs.append(held(f"{queue}/g{i}", cores, float(i), queue))

    def allocated(queue: str) -> int:
        return sum(g.total["cpu"] for g in gangs if g.queue == queue) // CPU

    views = {
        "a": view(q("a"), allocated("a"), draw(st.integers(0, 4))),
        "b": view(q("b"), allocated("b"), 12, head=2),
        "c": view(q("c", reclaimable=draw(st.booleans())), allocated("c"), draw(st.integers(0, 4))),
    }
    size = draw(st.integers(1, 2))
    return bins, gangs, views, SliceGang(size * draw(st.integers(1, 3)), size)


@settings(max_examples=300, deadline=None)
@given(slice_worlds())
def test_victims_are_needed_fit_the_gang_and_lie_only_in_the_racks_its_slices_take(
    world: tuple[list[Bin], list[Running], dict[str, QueueView], SliceGang],
) -> None:
    free, gangs, views, needy = world
    fits = needy.fits()
    victims = choose_victims(
        "b", needy.demands, len(needy.demands), free, gangs, views,
        fits=fits, slices=needy.room(free),
    )  # fmt: skip
    if victims is None:
        return
    by_key = {g.key: g for g in gangs}
    chosen = [by_key[k] for k in victims]
    assert all(g.queue != "b" and views[g.queue].spec.reclaimable for g in chosen)
    assert not fits(free), "victims chosen for a gang that fits already"
    racks = needy.placed(without(free, chosen))
    assert racks is not None, f"the gang does not fit once {victims} leave"
    used = {d.value for d in racks.values()}
    rack_of = {b.name: b.labels[RACK] for b in free}
    for gang in chosen:
        assert {rack_of[n] for n in gang.held} & used, f"{gang.key} holds no room in {used}"
        rest = [g for g in chosen if g is not gang]
        assert not fits(without(free, rest)), f"{gang.key} is not needed: {victims}"


def test_a_large_cluster_costs_the_racks_by_bound_and_packs_little() -> None:
    """100 racks of ten 4-CPU nodes, full of queue a's 1,000 one-node gangs, the most recent
    of each rack interleaved; a gang of 4 slices of 8 one-CPU members (2 nodes a slice).
    Reclaim's order would take one gang in each of 100 racks first; the slices' search takes
    2 in each of 4 racks. Fits tests are counted, not timed: the racks are costed by the
    bound, the picked victims tested at once, then each for sparing."""
    racks, per_rack = 100, 10
    bins = [
        Bin(f"n{r}-{i}", cpu(0), {RACK: f"r{r}"}) for r in range(racks) for i in range(per_rack)
    ]
    gangs = [
        held(f"a/g{r}-{i}", {f"n{r}-{i}": 4}, created=i * racks + r)
        for r in range(racks)
        for i in range(per_rack)
    ]
    needy = SliceGang(32, 8)
    tests = 0
    fits = needy.fits()

    def counted(room: Sequence[Bin]) -> bool:
        nonlocal tests
        tests += 1
        return fits(room)

    views = {"a": view(q("a"), 4000, 0), "b": view(q("b"), 0, 32, head=32)}
    started = time.perf_counter()
    victims = choose_victims(
        "b", needy.demands, 32, bins, gangs, views, fits=counted, slices=needy.room(bins)
    )
    elapsed = time.perf_counter() - started
    assert victims is not None and len(victims) == 8
    assert len({v.split("-")[0] for v in victims}) == 4  # two gangs in each of four racks
    assert tests <= 2 + len(victims), tests
    print(f"\nslice-only reclaim over 1,000 nodes and 1,000 gangs: {elapsed:.3f}s, {tests} fits")
