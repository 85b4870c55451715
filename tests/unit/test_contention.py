from app.core.contention import (
    Contest,
    Gang,
    Holder,
    Ruling,
    decide,
    line_key,
    order_line,
    room_left,
)
from app.core.line_look import wake_order, wake_steps
from app.core.packing import Bin, Demand


def cpu(cores: float) -> dict[str, int]:
    return {"cpu": int(cores * 1000), "pods": 1000}


def cluster(*cores: float) -> list[Bin]:
    return [Bin(f"n{i}", {"cpu": int(c * 1000), "pods": 110_000}) for i, c in enumerate(cores)]


def gang(
    key: str,
    members: int,
    cores: float = 1,
    *,
    priority: int = 0,
    created: float = 0.0,
    since: float | None = None,
    need: int | None = None,
) -> Gang:
    demands = tuple(Demand(f"{key}-{i}", cpu(cores)) for i in range(members))
    return Gang(key, priority, created, demands, members if need is None else need, since)


def holder(
    key: str,
    node_cores: dict[str, float],
    *,
    priority: int = 0,
    reserved: dict[str, float] | None = None,
) -> Holder:
    return Holder(
        key,
        priority,
        0.0,
        {n: cpu(c) for n, c in node_cores.items()},
        {n: cpu(c) for n, c in (reserved or {}).items()},
    )


AGING = 60.0


def test_a_gang_that_fits_is_admitted_with_a_plan() -> None:
    decision = decide(gang("ns/a", 3, 2.5), Contest(cluster(4, 4, 4)), 0, AGING)
    assert decision.verdict == Ruling.ADMIT
    assert sorted(decision.plan.values()) == ["n0", "n1", "n2"]


def test_capacity_claimed_by_another_gang_makes_the_second_wait_behind_it() -> None:
    # Gang a holds a claim for one member per node (2.5 CPUs each); b needs the same.
    held = holder("ns/a", {"n0": 2.5, "n1": 2.5, "n2": 2.5}, priority=5)
    decision = decide(gang("ns/b", 3, 2.5, priority=5), Contest(cluster(4, 4, 4), [held]), 0, AGING)
    assert decision.verdict == Ruling.WAIT
    assert decision.behind == ("ns/a", 5)
    assert "waiting behind ns/a (priority 5)" in decision.message
    assert decision.plan == {}


def test_a_gang_that_does_not_fit_the_free_capacity_is_short_and_names_it() -> None:
    decision = decide(gang("ns/big", 4, 3), Contest(cluster(4, 4, 4)), 0, AGING)
    assert decision.verdict == Ruling.SHORT
    assert "gang ns/big needs 4 more member(s)" in decision.message
    assert "only 3 fit" in decision.message


def test_higher_priority_gang_takes_the_place_of_a_lower_one_still_collecting() -> None:
    # Free capacity already excludes what low holds in the gate (1 member on n0).
    low = holder("ns/low", {"n1": 2.5, "n2": 2.5}, priority=1, reserved={"n0": 2.5})
    high = gang("ns/high", 3, 2.5, priority=10)
    decision = decide(high, Contest(cluster(1.5, 4, 4), [low]), 0, AGING)
    assert decision.verdict == Ruling.ADMIT
    assert decision.release == ("ns/low",)
    # Equal priority does not take anything.
    same = gang("ns/same", 3, 2.5, priority=1)
    assert decide(same, Contest(cluster(1.5, 4, 4), [low]), 0, AGING).verdict == Ruling.WAIT


def test_releases_only_as_many_lower_gangs_as_needed_lowest_first() -> None:
    lowest = holder("ns/lowest", {"n0": 2}, priority=1)
    low = holder("ns/low", {"n1": 2}, priority=2)
    decision = decide(
        gang("ns/high", 1, 2, priority=9), Contest(cluster(2, 2), [low, lowest]), 0, AGING
    )
    assert decision.verdict == Ruling.ADMIT and decision.release == ("ns/lowest",)


def test_line_order_priority_then_aged_then_creation() -> None:
    now = 1000.0
    gangs = [
        gang("ns/new", 1, created=30),
        gang("ns/old", 1, created=10),
        gang("ns/aged", 1, created=50, since=now - AGING),
        gang("ns/urgent", 1, priority=5, created=90),
    ]
    assert [g.key for g in order_line(gangs, now, AGING)] == [
        "ns/urgent",
        "ns/aged",
        "ns/old",
        "ns/new",
    ]
    assert line_key(gangs[0], now, AGING) > line_key(gangs[1], now, AGING)


def test_a_gang_ahead_in_line_that_fits_keeps_its_share() -> None:
    ahead = gang("ns/first", 2, 4, created=1)
    late = gang("ns/late", 1, 4, created=2)
    decision = decide(late, Contest(cluster(4, 4), [], [ahead]), 0, AGING)
    assert decision.verdict == Ruling.WAIT and decision.behind == ("ns/first", 0)
    # The gang ahead itself is admitted.
    assert decide(ahead, Contest(cluster(4, 4), [], [late]), 0, AGING).verdict == Ruling.ADMIT


def test_a_decision_never_changes_the_free_room_it_weighs() -> None:
    # The arbiter hands the same free bins to the decision, then to reclaim:
    # promises, gangs set aside ahead and releases by precedence happen on copies.
    free = cluster(4, 4, 4)
    before = [(b.name, dict(b.free)) for b in free]
    low = holder("ns/low", {"n0": 4}, reserved={"n1": 2})
    ahead = gang("ns/first", 1, 4, priority=9, created=1)
    high = gang("ns/high", 2, 4, priority=5, created=2)
    decision = decide(high, Contest(free, [low], [ahead]), 0, AGING)
    assert decision.verdict == Ruling.ADMIT and decision.release == ("ns/low",)
    assert [(b.name, b.free) for b in free] == before
    assert wake_order(Contest(free, [low], [ahead, high]), 0, AGING) == ["ns/first"]
    assert [(b.name, b.free) for b in free] == before


def test_positions_given_or_not_the_bins_and_the_decision_are_the_same() -> None:
    # Contest.positions spares a decision indexing thousands of bins; positions
    # that are wrong (stale, partial, out of range) must not be trusted.
    free = cluster(4, 4, 4, 2)
    before = [(b.name, dict(b.free)) for b in free]
    low = holder("ns/low", {"n0": 4, "n3": 1}, reserved={"n1": 2})
    ahead = gang("ns/first", 1, 4, priority=9, created=1)
    high = gang("ns/high", 2, 4, priority=5, created=2)
    right = {b.name: i for i, b in enumerate(free)}
    unindexed = Contest(free, [low], [ahead, high])
    expected = (
        decide(high, unindexed, 0, AGING),
        wake_order(unindexed, 0, AGING),
        [(b.name, b.free) for b in room_left(free, [low])],
    )
    for positions in (
        right,
        {name: (i + 1) % len(free) for name, i in right.items()},
        {"n3": 3},
        {name: i + len(free) for name, i in right.items()},
        {},
    ):
        contest = Contest(free, [low], [ahead, high], positions=positions)
        assert (
            decide(high, contest, 0, AGING),
            wake_order(contest, 0, AGING),
            [(b.name, b.free) for b in room_left(free, [low], positions)],
        ) == expected, positions
        assert [(b.name, b.free) for b in free] == before


def test_backfill_passes_a_gang_ahead_that_does_not_fit_yet() -> None:
    big = gang("ns/big", 3, 4, created=1, since=0)  # needs 3 whole nodes; 2 are free
    small = gang("ns/small", 1, 1, created=2)
    assert decide(small, Contest(cluster(4, 4), [], [big]), 10, AGING).verdict == Ruling.ADMIT


def test_aging_stops_overtaking_so_a_large_gang_is_not_starved() -> None:
    big = gang("ns/big", 3, 4, created=1, since=0)
    small = gang("ns/small", 1, 1, created=2)
    decision = decide(
        small, Contest(cluster(4, 4, 0), [], [big], cluster(4, 4, 4)), AGING + 1, AGING
    )
    assert decision.verdict == Ruling.WAIT
    assert decision.behind == ("ns/big", 0)
    assert "has waited longest" in decision.message
    # A higher-priority gang still passes the aged one.
    urgent = gang("ns/urgent", 1, 1, priority=9, created=3)
    assert (
        decide(urgent, Contest(cluster(4, 4, 0), [], [big]), AGING + 1, AGING).verdict
        == Ruling.ADMIT
    )


def test_an_aged_gang_that_can_never_fit_blocks_nobody() -> None:
    huge = gang("ns/huge", 5, 4, created=1, since=0)  # 5 nodes' worth on a 3-node cluster
    small = gang("ns/small", 1, 1, created=2)
    decision = decide(
        small, Contest(cluster(4, 4, 0), [], [huge], cluster(4, 4, 4)), AGING + 1, AGING
    )
    assert decision.verdict == Ruling.ADMIT


def test_stream_of_small_gangs_does_not_starve_a_large_one() -> None:
    """Simulated: small gangs keep arriving; the large one is admitted once aged."""
    big = gang("ns/big", 1, 8, created=0)
    free = 8.0
    running: list[tuple[float, float]] = [(4.0, 5.0), (4.0, 15.0)]  # (cores, ends at)
    free -= 8.0
    big_admitted_at = None
    for t in range(0, 300):
        now = float(t)
        for item in [r for r in running if r[1] <= now]:
            running.remove(item)
            free += item[0]
        waiting_since = 0.0
        big_now = Gang(big.key, 0, 0, big.demands, 1, waiting_since)
        small = gang(f"ns/s{t}", 1, 4, created=now)
        decision = decide(big_now, Contest(cluster(free), [], [small]), now, AGING)
        if decision.verdict == Ruling.ADMIT:
            big_admitted_at = now
            break
        # A new small gang arrives every second and runs for 10 s if let in.
        if (
            decide(small, Contest(cluster(free), [], [big_now], cluster(8)), now, AGING).verdict
            == Ruling.ADMIT
        ):
            running.append((4.0, now + 10))
            free -= 4.0
    assert big_admitted_at is not None and big_admitted_at <= AGING + 10


def test_wake_order_lists_the_gangs_that_now_fit_in_line_order() -> None:
    gangs = [
        gang("ns/b", 2, 2, created=2),
        gang("ns/a", 2, 2, created=1),
        gang("ns/c", 1, 4, created=3),
    ]
    assert wake_order(Contest(cluster(4, 4), [], gangs), 0, AGING) == ["ns/a", "ns/b"]
    held = holder("ns/h", {"n0": 4})
    assert wake_order(Contest(cluster(4, 4), [held], gangs), 0, AGING) == ["ns/a"]


def test_wake_steps_walks_the_line_a_slice_at_a_time_and_ends_as_wake_order() -> None:
    gangs = [gang(f"ns/g{i}", 1, created=i) for i in range(7)]
    contest = Contest(cluster(2, 2), [], gangs)
    steps = list(wake_steps(contest, 0, AGING, limit=10, slice_size=2))
    # 4 gangs fit 2 nodes of 2 CPUs: the walk goes on over the 3 that do not.
    assert steps[:-1] == [None, None, None]
    fit = ["ns/g0", "ns/g1", "ns/g2", "ns/g3"]
    assert steps[-1] == wake_order(contest, 0, AGING, limit=10) == fit
