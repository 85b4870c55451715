"""First fit remembers, per member shape, the bins from the first that had no room
(app/core/packing.py, AllowedBins.full): packings sharing that memo over bins that only
shrink place every member exactly where packings without it do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Contest, Gang, decide
from app.core.packing import AllowedNodes, Bin, Demand, pack, take
from app.core.placement import Placement

_SHAPES = st.sampled_from([(1, 1), (2, 1), (1, 2), (3, 3), (2, 2)])


def _bins(sizes: list[tuple[int, int]]) -> list[Bin]:
    return [
        Bin(f"n{i}", {"cpu": c, "memory": m, "pods": 4}, {"zone": f"z{i % 2}"})
        for i, (c, m) in enumerate(sizes)
    ]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=12),
    gangs=st.lists(
        st.tuples(st.lists(_SHAPES, min_size=1, max_size=4), st.booleans(), st.booleans()),
        max_size=25,
    ),
)
def test_shared_memo_places_each_gang_as_a_fresh_packing_does(
    sizes: list[tuple[int, int]], gangs: list[tuple[list[tuple[int, int]], bool, bool]]
) -> None:
    """A line of gangs set aside one after another (the room shrinks), some in one zone."""
    bins = _bins(sizes)
    shared: AllowedNodes = {}
    zone = Placement(node_selector=(("zone", "z1"),))
    for n, (shapes, zoned, taken) in enumerate(gangs):
        demands = [
            Demand(f"g{n}-{i}", {"cpu": c, "memory": m, "pods": 1}, zone if zoned else None)
            for i, (c, m) in enumerate(shapes)
        ]
        memo = pack(demands, bins, allowed_nodes=shared)
        fresh = pack(demands, bins)
        assert memo == fresh
        if memo.fits and taken:
            take(bins, memo.plan, demands)


def test_a_fresh_gang_behind_a_long_line_is_decided_as_without_the_memo() -> None:
    """decide() over a line that fills the first nodes: the same plan as a slow walk's."""
    free = [Bin(f"n{i}", {"cpu": 8, "pods": 110}) for i in range(60)]

    def gang(key: str, cpu: int, members: int, created: float) -> Gang:
        demands = tuple(Demand(f"{key}-{i}", {"cpu": cpu, "pods": 1}) for i in range(members))
        return Gang(key, 0, created, demands, members, waiting_since=created)

    line = [gang(f"w{i}", 1 + i % 3, 4, float(i)) for i in range(100)]
    fresh = gang("new", 5, 3, 1000.0)
    decision = decide(fresh, Contest(free, (), line), 1000.0, 1e9)
    # Without any memo: set each gang ahead aside by a packing of its own.
    bins = [Bin(b.name, dict(b.free)) for b in free]
    for g in line:
        packing = pack(g.demands, bins, g.need)
        if packing.fits:
            take(bins, packing.plan, g.demands)
    assert decision.plan == pack(fresh.demands, bins, fresh.need).plan
