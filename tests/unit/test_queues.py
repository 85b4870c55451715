"""The queue core: deserved shares (water-filling), enqueue, DRF order, reclaim choice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Gang
from app.core.packing import Bin, Demand, give
from app.core.queues import (
    QueueSpec,
    QueueSpecError,
    QueueView,
    Running,
    deserved_shares,
    dominant_share,
    enqueue,
    queue_from,
)
from app.core.reclaim import Fits, choose_victims, flat_fits
from app.core.shared_pools import PoolHold, SharedPool
from app.core.topology.domains import TopologyConstraint, Where, fits_one_domain
from tests.unit.test_devices import GPU

CPU = 1000
CAPACITY = {"cpu": 12 * CPU, "memory": 48 * 2**30 * 1000, "pods": 330 * 1000}


def q(name: str, weight: int = 1, **kwargs: object) -> QueueSpec:
    return QueueSpec(name, weight, **kwargs)  # type: ignore[arg-type]


def cpu(n: float) -> dict[str, int]:
    return {"cpu": int(n * CPU)}


def test_equal_weights_with_heavy_demand_split_evenly() -> None:
    shares = deserved_shares({"a": q("a"), "b": q("b")}, {"a": cpu(100), "b": cpu(100)}, CAPACITY)
    assert shares["a"]["cpu"] == shares["b"]["cpu"] == 6 * CPU


def test_weights_three_to_one() -> None:
    shares = deserved_shares(
        {"a": q("a", 3), "b": q("b", 1)}, {"a": cpu(100), "b": cpu(100)}, CAPACITY
    )
    assert (shares["a"]["cpu"], shares["b"]["cpu"]) == (9 * CPU, 3 * CPU)


def test_what_a_small_queue_leaves_is_shared_again() -> None:
    """b asks for 2 of its 4: the rest goes to a and c by their weights (water-filling)."""
    shares = deserved_shares(
        {"a": q("a", 1), "b": q("b", 1), "c": q("c", 1)},
        {"a": cpu(100), "b": cpu(2), "c": cpu(100)},
        CAPACITY,
    )
    assert shares["b"]["cpu"] == 2 * CPU
    assert shares["a"]["cpu"] == shares["c"]["cpu"] == 5 * CPU


def test_an_idle_queue_deserves_nothing_and_the_other_everything() -> None:
    shares = deserved_shares({"a": q("a"), "b": q("b")}, {"a": cpu(100)}, CAPACITY)
    assert shares["a"]["cpu"] == 12 * CPU
    assert shares["b"]["cpu"] == 0


def test_capability_caps_and_the_rest_goes_to_the_others() -> None:
    shares = deserved_shares(
        {"a": q("a", capability=cpu(2)), "b": q("b")}, {"a": cpu(100), "b": cpu(100)}, CAPACITY
    )
    assert shares["a"]["cpu"] == 2 * CPU
    assert shares["b"]["cpu"] == 10 * CPU


def test_guarantee_is_a_floor_even_without_demand_and_kept_from_the_others() -> None:
    shares = deserved_shares(
        {"a": q("a"), "b": q("b", guarantee=cpu(4))}, {"a": cpu(100)}, CAPACITY
    )
    assert shares["b"]["cpu"] == 4 * CPU
    assert shares["a"]["cpu"] == 8 * CPU


def test_dominant_share_is_the_largest_fraction_and_ignores_pod_slots() -> None:
    assert dominant_share({"cpu": 3 * CPU, "pods": 300_000}, CAPACITY) == 0.25
    assert dominant_share({}, CAPACITY) == 0.0


def view(
    spec: QueueSpec, allocated: float, deserved: float, head: float | None = None
) -> QueueView:
    return QueueView(
        spec,
        cpu(allocated),
        cpu(deserved),
        cpu(head) if head is not None else None,
        1 if head is not None else 0,
    )


def test_a_queue_below_its_share_admits_up_to_the_overcommitted_share() -> None:
    views = {"a": view(q("a"), 4, 6), "b": view(q("b"), 6, 6, head=2)}
    assert enqueue("a", cpu(2), views, CAPACITY, 1.2) is None
    # 4 + 4 = 8 is beyond 6 * 1.2, but b is at its share: nobody below it waits.
    assert enqueue("a", cpu(4), views, CAPACITY, 1.2) is None


def test_a_queue_at_its_share_waits_while_another_below_its_share_waits() -> None:
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 4, 6, head=2)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message == (
        "queue a (weight 1) holds cpu 6 of its deserved cpu 6 and this gang (cpu 2) would "
        "take it beyond that, while a queue below its share waits: queue b (weight 1) holds "
        "cpu 4 of its deserved cpu 6 with 1 gang(s) waiting; the gang is admitted once its "
        "queue is below its share or no queue below its share waits"
    )


def test_work_conserving_when_the_queue_below_its_share_waits_for_nothing_it_can_take() -> None:
    """b's waiting gang would overshoot even its overcommitted share: a may use the room."""
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 4, 6, head=8)}
    assert enqueue("a", cpu(2), views, CAPACITY, 1.2) is None
    views = {"a": view(q("a"), 6, 6), "b": view(q("b"), 0, 0)}
    assert enqueue("a", cpu(6), views, CAPACITY, 1.2) is None


def test_capability_caps_even_when_the_other_queue_is_idle() -> None:
    views = {"a": view(q("a", capability=cpu(4)), 4, 4), "b": view(q("b"), 0, 0)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message is not None
    assert "would exceed cpu 4 (its capability" in message


def test_an_unused_guarantee_is_kept_free() -> None:
    views = {"a": view(q("a"), 8, 8), "b": view(q("b", guarantee=cpu(4)), 0, 4)}
    message = enqueue("a", cpu(2), views, CAPACITY, 1.2)
    assert message is not None and "would exceed cpu 8 (the cluster" in message
    assert enqueue("b", cpu(4), views, CAPACITY, 1.2) is None


def test_a_closed_queue_admits_nothing() -> None:
    views = {"a": view(q("a", state="Closed"), 0, 6)}
    assert enqueue("a", cpu(1), views, CAPACITY, 1.2) == (
        "queue a is Closed: it admits no new gang; the gang waits until the queue is Open"
    )


def test_queue_from_reads_volcano_fields_and_defaults() -> None:
    spec = queue_from(
        {
            "metadata": {"name": "t"},
            "spec": {
                "weight": 3,
                "capability": {"cpu": "8"},
                "guarantee": {"resource": {"cpu": "2"}},
                "reclaimable": False,
            },
            "status": {"state": "Closed"},
        }
    )
    assert spec == QueueSpec("t", 3, cpu(8), cpu(2), False, "Closed")
    assert queue_from({"metadata": {"name": "d"}}) == QueueSpec("d")
    with pytest.raises(QueueSpecError, match=r"spec\.weight"):
        queue_from({"metadata": {"name": "x"}, "spec": {"weight": "heavy"}})


def running(
    key: str, queue: str, node: str, n: float, priority: int = 0, created: float = 0
) -> Running:
    return Running(key, queue, priority, created, {node: cpu(n)}, cpu(n))


def test_reclaim_takes_the_most_recent_lowest_priority_gangs_of_queues_above_their_share() -> None:
    full = [Bin("n1", cpu(0)), Bin("n2", cpu(0))]
    gangs = [
        running("a/old", "a", "n1", 2, created=1),
        running("a/new", "a", "n2", 2, created=3),
        running("a/high", "a", "n2", 2, priority=5, created=4),
        running("b/own", "b", "n1", 2, created=5),
    ]
    views = {"a": view(q("a"), 6, 4), "b": view(q("b"), 2, 4, head=2)}
    demands = [Demand("b/x-0", cpu(1)), Demand("b/x-1", cpu(1))]
    assert choose_victims("b", demands, 2, full, gangs, views) == ["a/new"]


def test_reclaim_spares_victims_the_gang_does_not_need() -> None:
    full = [Bin("n1", cpu(0)), Bin("n2", cpu(0))]
    gangs = [running("a/new", "a", "n1", 1, created=3), running("a/old", "a", "n2", 3, created=1)]
    views = {"a": view(q("a"), 4, 1), "b": view(q("b"), 0, 3, head=3)}
    assert choose_victims("b", [Demand("b/x-0", cpu(3))], 1, full, gangs, views) == ["a/old"]


def test_reclaim_never_from_a_queue_that_is_not_reclaimable_or_not_above_its_share() -> None:
    full = [Bin("n1", cpu(0))]
    gangs = [running("a/g", "a", "n1", 2), running("c/g", "c", "n1", 2)]
    views = {
        "a": view(q("a", reclaimable=False), 6, 4),
        "b": view(q("b"), 0, 4, head=2),
        "c": view(q("c"), 2, 4),
    }
    assert choose_victims("b", [Demand("b/x", cpu(2))], 1, full, gangs, views) is None


# ---- reclaim for a gang with a required rack -------------------------------------------

RACK = "example.com/rack"
# Two racks of two 2-CPU nodes each, every CPU taken.
RACKS = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}


def racked(free: Mapping[str, float] | None = None) -> list[Bin]:
    return [Bin(n, cpu((free or {}).get(n, 0)), {RACK: r}) for n, r in RACKS.items()]


def rack_gang(size: int) -> tuple[list[Demand], Fits, list[frozenset[str]]]:
    """A gang of `size` one-CPU pods that must fit in one rack: its demands, its own fits
    test (the admission's: one domain of the required level) and the racks' nodes."""
    demands = [Demand(f"b/x-{i}", cpu(1)) for i in range(size)]
    gang = Gang("b/x", 0, 0.0, tuple(demands), size)
    where = Where(TopologyConstraint(RACK, required=True), (RACK,))
    domains = [frozenset(n for n, r in RACKS.items() if r == rack) for rack in ("r1", "r2")]
    return demands, lambda bins: fits_one_domain(gang, where, bins), domains


def r2_blocked(share: float) -> tuple[list[Running], dict[str, QueueView]]:
    """Queue a's most recent gang in r2, the next two in r1; r2 cannot hold a gang of 4
    (n4 is queue c's, not reclaimable). `share`: a's deserved CPUs of the 6 it holds."""
    gangs = [
        running("a/r2-new", "a", "n3", 2, created=9),
        running("a/r1-mid", "a", "n1", 2, created=8),
        running("a/r1-old", "a", "n2", 2, created=7),
        running("c/keeps", "c", "n4", 2, created=1),
    ]
    views = {
        "a": view(q("a"), 6, share),
        "b": view(q("b"), 0, 6, head=4),
        "c": view(q("c", reclaimable=False), 2, 1),
    }
    return gangs, views


def test_a_rack_required_gang_reclaims_only_victims_in_one_rack() -> None:
    gangs, views = r2_blocked(0)
    demands, fits, domains = rack_gang(4)
    # A flat packing takes the two most recent, 2 CPUs in each rack, where a gang of 4
    # that must fit in one rack cannot start.
    assert choose_victims("b", demands, 4, racked(), gangs, views) == ["a/r2-new", "a/r1-mid"]
    victims = choose_victims("b", demands, 4, racked(), gangs, views, fits=fits, domains=domains)
    # r2-new's room is in a rack that cannot hold the gang: it is not evicted.
    assert victims == ["a/r1-mid", "a/r1-old"]
    # The greedy pass alone (no domains) spares it too, by the gang's own test.
    assert choose_victims("b", demands, 4, racked(), gangs, views, fits=fits) == victims


def test_victims_in_the_one_rack_that_can_hold_the_gang_are_found_past_the_greedy_order() -> None:
    # Queue a may lose only 4 of its 6 CPUs (its share is 3): in greedy order that is
    # r2-new and r1-mid, in two racks. Trying r1's victims on their own finds the plan.
    gangs, views = r2_blocked(3)
    demands, fits, domains = rack_gang(4)
    # The greedy order alone spends a's share on r2-new first.
    assert choose_victims("b", demands, 4, racked(), gangs, views, fits=fits) is None
    victims = choose_victims("b", demands, 4, racked(), gangs, views, fits=fits, domains=domains)
    assert victims == ["a/r1-mid", "a/r1-old"]


def test_of_two_racks_that_can_hold_the_gang_the_one_of_the_most_recent_victim_goes() -> None:
    gangs = [
        running("a/r2-new", "a", "n3", 2, created=9),
        running("a/r1-mid", "a", "n1", 2, created=8),
        running("a/r1-old", "a", "n2", 2, created=7),
        running("a/r2-old", "a", "n4", 2, created=6),
    ]
    views = {"a": view(q("a"), 8, 0), "b": view(q("b"), 0, 6, head=4)}
    demands, fits, domains = rack_gang(4)
    victims = choose_victims("b", demands, 4, racked(), gangs, views, fits=fits, domains=domains)
    assert victims == ["a/r2-new", "a/r2-old"]
    # Without the racks: r2-new first, then r1-mid and r1-old fill r1; r2-new is spared.
    assert choose_victims("b", demands, 4, racked(), gangs, views, fits=fits) == [
        "a/r1-mid",
        "a/r1-old",
    ]


def test_no_rack_can_hold_the_gang_nothing_is_evicted() -> None:
    # A CPU free on n1 and one on n3 and a victim in each rack: 4 CPUs for a flat
    # packing, 3 at most in either rack.
    gangs = [
        running("a/r1", "a", "n2", 2, created=2),
        running("a/r2", "a", "n4", 2, created=1),
        running("c/r1", "c", "n1", 1),
        running("c/r2", "c", "n3", 1),
    ]
    views = {
        "a": view(q("a"), 4, 0),
        "b": view(q("b"), 0, 6, head=4),
        "c": view(q("c", reclaimable=False), 2, 1),
    }
    free = racked({"n1": 1, "n3": 1})
    demands, fits, domains = rack_gang(4)
    assert choose_victims("b", demands, 4, free, gangs, views) == ["a/r1"]
    assert choose_victims("b", demands, 4, free, gangs, views, fits=fits, domains=domains) is None


def test_a_gang_that_fits_already_needs_no_victim() -> None:
    gangs = [running("a/g", "a", "n1", 2)]
    views = {"a": view(q("a"), 4, 0), "b": view(q("b"), 0, 6, head=2)}
    demands, fits, domains = rack_gang(2)
    free = racked({"n3": 2})
    assert choose_victims("b", demands, 2, free, gangs, views, fits=fits, domains=domains) is None


def _without(free: Sequence[Bin], gangs: Sequence[Running]) -> list[Bin]:
    """`free` with the room of `gangs` given back."""
    bins = [b.with_free(dict(b.free)) for b in free]
    for gang in gangs:
        give(bins, gang.held)
    return bins


@st.composite
def reclaim_worlds(draw: st.DrawFn) -> tuple[list[Bin], list[Running], dict[str, QueueView], int]:
    """Racked nodes, running gangs of queues a, c (and b's own), views, the needy gang size."""
    room = {n: draw(st.integers(0, 1)) for n in RACKS}
    gangs: list[Running] = []
    for i in range(draw(st.integers(1, 8))):
        queue = draw(st.sampled_from(["a", "a", "a", "b", "c"]))
        held: dict[str, dict[str, int]] = {}
        for node in draw(st.lists(st.sampled_from(list(RACKS)), min_size=1, max_size=2)):
            held[node] = cpu(draw(st.integers(1, 2)))
        total = {"cpu": sum(v["cpu"] for v in held.values())}
        gangs.append(
            Running(f"{queue}/g{i}", queue, draw(st.integers(0, 2)), float(i), held, total)
        )

    def allocated(queue: str) -> int:
        return sum(g.total["cpu"] for g in gangs if g.queue == queue) // CPU

    views = {
        "a": view(q("a"), allocated("a"), draw(st.integers(0, 3))),
        "b": view(q("b"), allocated("b"), 8, head=2),
        "c": view(q("c", reclaimable=draw(st.booleans())), allocated("c"), draw(st.integers(0, 4))),
    }
    return racked(room), gangs, views, draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(reclaim_worlds(), st.booleans())
def test_every_victim_chosen_is_needed_by_the_gangs_own_fits_test(
    world: tuple[list[Bin], list[Running], dict[str, QueueView], int], by_rack: bool
) -> None:
    free, gangs, views, size = world
    demands, rack_fits, domains = rack_gang(size)
    fits = rack_fits if by_rack else flat_fits(demands, size)
    victims = choose_victims(
        "b", demands, size, free, gangs, views, fits=fits, domains=domains if by_rack else ()
    )
    if victims is None:
        return
    by_key = {g.key: g for g in gangs}
    chosen = [by_key[k] for k in victims]
    assert len(set(victims)) == len(victims)
    assert all(g.queue != "b" and views[g.queue].spec.reclaimable for g in chosen)
    assert not fits(free), "victims chosen for a gang that fits already"
    assert fits(_without(free, chosen))
    for spared in chosen:
        rest = [g for g in chosen if g is not spared]
        assert not fits(_without(free, rest)), f"{spared.key} is not needed: {victims}"


def test_a_large_cluster_packs_only_in_the_domains_that_could_hold_the_gang() -> None:
    """100 racks of ten 4-CPU nodes, full of queue a's 1,000 one-node gangs, the most recent
    of each rack interleaved; a's share lets 7 gangs go in the first case (28 CPUs: no rack
    can hold the 32-CPU gang) and 8 in the second. Packings are counted, not timed: the
    racks that cannot hold the gang are passed over without one."""
    racks, per_rack = 100, 10
    bins = [
        Bin(f"n{r}-{i}", cpu(0), {RACK: f"r{r}"}) for r in range(racks) for i in range(per_rack)
    ]
    gangs = [
        running(f"a/g{r}-{i}", "a", f"n{r}-{i}", 4, created=i * racks + r)
        for r in range(racks)
        for i in range(per_rack)
    ]
    demands = [Demand(f"b/x-{i}", cpu(1)) for i in range(32)]
    gang = Gang("b/x", 0, 0.0, tuple(demands), 32)
    where = Where(TopologyConstraint(RACK, required=True), (RACK,))
    packings = 0

    def fits(room: Sequence[Bin]) -> bool:
        nonlocal packings
        packings += 1
        return fits_one_domain(gang, where, room)

    domains = [frozenset(f"n{r}-{i}" for i in range(per_rack)) for r in range(racks)]
    for lets_go, expected in ((7, None), (8, [f"a/g99-{i}" for i in range(9, 1, -1)])):
        packings = 0
        views = {"a": view(q("a"), 4000, 4000 - 4 * lets_go), "b": view(q("b"), 0, 32, head=32)}
        victims = choose_victims("b", demands, 32, bins, gangs, views, fits=fits, domains=domains)
        assert victims == expected
        assert packings <= 1 + 2 * lets_go, packings


def test_reclaim_gives_a_shared_device_pool_back_what_its_victims_hold() -> None:
    """n1 and n2 are served by one pool of 4 devices, all held by a/holder's claim on n1,
    a full node; the gang of queue b needs 2 CPUs and all 4 devices, so only n2 can take it,
    once the pool has its devices back. a/other, more recent, holds none of them: spared."""
    pool = SharedPool("gpu/rack", {GPU: 4000}, {GPU: 0}, {"n1": {GPU: 4000}})
    # Each node's bin shows the pool less what its own pods use of it (PoolDraws.local).
    free = [
        Bin("n1", {**cpu(0), GPU: 0}, pools=(pool,)),
        Bin("n2", {**cpu(3), GPU: 4000}, pools=(pool,)),
    ]
    held = {"n1": {**cpu(1), GPU: 4000}}
    holder = Running("a/holder", "a", 0, 1, held, cpu(1), frozenset({"a/holder-0"}))
    other = Running("a/other", "a", 0, 3, {"n2": cpu(1)}, cpu(1), frozenset({"a/other-0"}))
    holds = [PoolHold(pool, {GPU: 4000}, frozenset({"a/holder-0"}), "n1")]
    views = {"a": view(q("a"), 2, 0), "b": view(q("b"), 0, 3, head=2)}
    demands = [Demand("b/x-0", {**cpu(2), GPU: 4000})]
    # Node by node only, n1 gets 1 CPU back and n2's devices stay taken: no plan.
    assert choose_victims("b", demands, 1, free, [holder, other], views) is None
    victims = choose_victims("b", demands, 1, free, [holder, other], views, pool_holds=holds)
    assert victims == ["a/holder"]
    assert pool.free == {GPU: 0}  # the state's pool is as it was
