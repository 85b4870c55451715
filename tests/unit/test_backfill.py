"""Backfill behind an aged gang: what it can never use is open, and it is never delayed by that."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.core.backfill import Remainders, remainder, shapes_of
from app.core.contention import Contest, Gang, Holder, Ruling, decide
from app.core.line_look import held_for, wake_order
from app.core.packing import Bin, Demand
from app.core.placement import Placement
from app.core.resources import Resources, fits
from app.core.state import ClusterState
from tests.unit.builders import node, pod

AGING = 60.0
NOW = 1000.0  # every gang with waiting_since 0 has aged


def cpu(cores: float, pods: int = 1) -> Resources:
    return {"cpu": int(cores * 1000), "pods": pods}


def members(key: str, count: int, cores: float, placement: Placement | None = None) -> Gang:
    demands = tuple(Demand(f"{key}-{i}", cpu(cores), placement) for i in range(count))
    return Gang(key, 0, 0.0, demands, count)


def aged(gang: Gang) -> Gang:
    return Gang(gang.key, gang.priority, gang.created, gang.demands, gang.need, 0.0)


def fixed(present: Mapping[str, Sequence[Resources]]) -> Remainders:
    """Remainders over pods that the test names per node (every call: nodes all changed)."""
    return Remainders(lambda name: present.get(name, ()), lambda stamp: (stamp + 1, None))


def story(nodes: int) -> tuple[list[Bin], list[Bin], dict[str, list[Resources]]]:
    """The issue's cluster, small: 8-CPU nodes each running one 6-CPU pod (2 CPUs free)."""
    allocatable = [Bin(f"n{i}", cpu(8, 110)) for i in range(nodes)]
    free = [Bin(f"n{i}", cpu(2, 109)) for i in range(nodes)]
    return free, allocatable, {f"n{i}": [cpu(6)] for i in range(nodes)}


# ---- the remainder of one node --------------------------------------------------------


def test_next_to_a_six_cpu_pod_the_two_cpus_no_six_cpu_member_can_use_are_open() -> None:
    shapes = shapes_of(members("ns/big", 4, 6).demands)
    eight = Bin("n0", cpu(8, 110))
    assert remainder(eight, [cpu(6)], shapes) == {"cpu": 2000, "pods": 109}
    assert remainder(eight, [], shapes) == {"cpu": 2000, "pods": 109}
    # A 1-CPU pod that may stay: a member still fits beside it, so only 1 CPU is open.
    assert remainder(eight, [cpu(1)], shapes) == {"cpu": 1000, "pods": 108}
    # Two members fit an empty 12-CPU node: nothing there is never usable.
    assert remainder(Bin("n1", cpu(12, 110)), [], shapes) == {"cpu": 0, "pods": 108}


def test_a_node_the_gang_may_not_use_or_never_fits_is_not_limited() -> None:
    zone_a = Placement(node_selector=(("zone", "a"),))
    shapes = shapes_of(members("ns/big", 2, 6, zone_a).demands)
    assert remainder(Bin("n0", cpu(8), {"zone": "b"}), [], shapes) is None
    assert remainder(Bin("n1", cpu(4), {"zone": "a"}), [], shapes) is None
    assert remainder(Bin("n2", cpu(8), {"zone": "a"}), [], shapes) == {"cpu": 2000, "pods": 0}


def test_too_many_different_pods_hold_the_whole_node() -> None:
    shapes = shapes_of(members("ns/big", 1, 6).demands)
    many = [{"cpu": 2**i, "pods": 1} for i in range(12)]  # 4,096 distinct sums
    assert remainder(Bin("n0", {"cpu": 100_000, "pods": 110}), many, shapes) == {
        "cpu": 0,
        "pods": 0,
    }


_SHAPE = st.tuples(st.integers(1, 4), st.integers(0, 3))  # (cpu, memory) of a member
_POD = st.tuples(st.integers(0, 5), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(
    alloc=st.tuples(st.integers(0, 10), st.integers(0, 8), st.integers(1, 5)),
    present=st.lists(_POD, max_size=5),
    gang=st.lists(_SHAPE, min_size=1, max_size=4),
)
def test_whatever_pods_stay_every_set_of_members_that_fit_still_fits_beside_the_remainder(
    alloc: tuple[int, int, int], present: list[tuple[int, int]], gang: list[tuple[int, int]]
) -> None:
    """remainder()'s promise, checked by brute force over every subset of pods and members."""
    node_bin = Bin("n", {"cpu": alloc[0], "memory": alloc[1], "pods": alloc[2]})
    pods = [{"cpu": c, "memory": m, "pods": 1} for c, m in present]
    demands = [Demand(f"m{i}", {"cpu": c, "memory": m, "pods": 1}) for i, (c, m) in enumerate(gang)]
    cap = remainder(node_bin, pods, shapes_of(demands))
    if cap is None:  # no member fits the empty node: nothing to protect
        assert not any(fits(d.requests, node_bin.free) for d in demands)
        return
    for k in range(len(pods) + 1):
        for staying in itertools.combinations(pods, k):
            left = dict(node_bin.free)
            for p in staying:
                for name, amount in p.items():
                    left[name] = left.get(name, 0) - amount
            beside = {name: left.get(name, 0) - cap.get(name, 0) for name in left}
            for j in range(1, len(demands) + 1):
                for chosen in itertools.combinations(demands, j):
                    need = {n: sum(d.requests.get(n, 0) for d in chosen) for n in left}
                    if fits(need, left):
                        assert fits(need, beside), (staying, chosen, cap)


# ---- the decision -----------------------------------------------------------------------


def test_the_issue_small_gangs_run_in_the_remainders_behind_an_aged_big_gang() -> None:
    free, allocatable, present = story(6)
    big = aged(members("ns/big48", 4, 6))
    small = members("ns/s0", 2, 0.1)
    today = decide(small, Contest(free, (), [big], allocatable), NOW, AGING)
    assert today.verdict == Ruling.WAIT and "has waited longest" in today.message
    now = decide(
        small, Contest(free, (), [big], allocatable, remainders=fixed(present)), NOW, AGING
    )
    assert now.verdict == Ruling.ADMIT, now.message
    # The big gang itself still goes first once it fits: nothing it may use was given away.
    assert decide(big, Contest(free, (), [small], allocatable), NOW, AGING).verdict == Ruling.SHORT


def test_what_the_aged_gang_can_use_is_held_and_the_message_names_where() -> None:
    allocatable = [Bin(f"n{i}", cpu(8, 110)) for i in range(4)]
    free = [
        Bin("n0", cpu(8, 110)),
        Bin("n1", cpu(8, 110)),
        Bin("n2", cpu(2, 109)),
        Bin("n3", cpu(2, 109)),
    ]
    present = {"n2": [cpu(6)], "n3": [cpu(6)]}
    big = aged(members("ns/big", 4, 6))  # needs all four nodes: two are busy
    contest = Contest(free, (), [big], allocatable, remainders=fixed(present))
    # 3 CPUs per member: only the empty nodes have room, and there the big gang holds 6 of 8.
    mid = decide(members("ns/mid", 2, 3), contest, NOW, AGING)
    assert mid.verdict == Ruling.WAIT and mid.behind == ("ns/big", 0)
    assert "holds what its 4 member(s) can use on nodes n0, n1" in mid.message
    assert "fit in what it cannot use" in mid.message
    # 2 CPUs per member fit the remainders, on busy and empty nodes alike.
    two = decide(members("ns/two", 4, 2), contest, NOW, AGING)
    assert two.verdict == Ruling.ADMIT and sorted(two.plan.values()) == ["n0", "n1", "n2", "n3"]
    assert held_for(contest, NOW, AGING) == {"ns/big": (["n0", "n1"], "")}


def test_an_aged_gang_holds_nothing_where_its_members_may_not_go() -> None:
    zone_a = Placement(node_selector=(("zone", "a"),))
    allocatable = [Bin("a0", cpu(8, 110), {"zone": "a"}), Bin("b0", cpu(8, 110), {"zone": "b"})]
    free = [Bin("a0", cpu(2, 109), {"zone": "a"}), Bin("b0", cpu(8, 110), {"zone": "b"})]
    big = aged(members("ns/big", 1, 6, zone_a))
    contest = Contest(free, (), [big], allocatable, remainders=fixed({"a0": [cpu(6)]}))
    other = decide(members("ns/other", 1, 8), contest, NOW, AGING)
    assert other.verdict == Ruling.ADMIT and other.plan == {"ns/other-0": "b0"}
    # Also when room there is promised to a gang that was admitted moments ago.
    promised = Holder("ns/admitted", 0, 0.0, {"b0": cpu(2)})
    contest = Contest(free, [promised], [big], allocatable, remainders=fixed({"a0": [cpu(6)]}))
    other = decide(members("ns/other", 1, 6), contest, NOW, AGING)
    assert other.verdict == Ruling.ADMIT and other.plan == {"ns/other-0": "b0"}


def test_precedence_does_not_hand_over_what_an_aged_gang_holds() -> None:
    # Releasing a lower gang's promise would give back room the aged gang can use.
    allocatable = [Bin("n0", cpu(8, 110))]
    low = Holder("ns/low", -1, 0.0, {"n0": cpu(6)})
    big = aged(members("ns/big", 1, 6))
    contest = Contest([Bin("n0", cpu(8, 110))], [low], [big], allocatable, remainders=fixed({}))
    high = decide(members("ns/high", 1, 4), contest, NOW, AGING)
    assert high.verdict == Ruling.WAIT and high.release == ()


def test_wake_order_wakes_the_gangs_that_fit_behind_an_aged_one() -> None:
    free, allocatable, present = story(4)
    line = [aged(members("ns/big", 4, 6)), members("ns/s0", 2, 0.5), members("ns/s1", 2, 3)]
    assert wake_order(Contest(free, (), line, allocatable), NOW, AGING) == []
    contest = Contest(free, (), line, allocatable, remainders=fixed(present))
    assert wake_order(contest, NOW, AGING) == ["ns/s0"]
    assert held_for(contest, NOW, AGING) == {"ns/big": ([], "all it may use is in use")}


def test_remainders_kept_between_calls_are_those_computed_afresh_after_any_change() -> None:
    """Also when worked out a slice at a time (warm), the cluster changing between slices."""
    rng = random.Random(7)
    state = ClusterState()
    state.replace_nodes([node(f"n{i}", cpu="8") for i in range(4)])

    def staying(name: str) -> list[Mapping[str, int]]:
        return [p.requests for p in state.pods_on(name) if p.key not in state.leaving]

    kept = Remainders(staying, state.nodes_changed_since)
    gangs = [members("ns/a", 2, 3).demands, members("ns/b", 1, 5).demands]
    for step in range(1500):
        choice = rng.randrange(10)
        name = f"p{rng.randrange(8)}"
        if choice >= 8:  # a slice of the warm-up's: a node or two of one gang's remainders
            if rng.random() < 0.1:  # worked out from nothing again (a new process's)
                kept = Remainders(staying, state.nodes_changed_since)
            demands = gangs[choice - 8]
            kept.warm(kept.shapes(demands), state.allocatable_bins(), rng.randrange(1, 3))
        elif choice == 6:  # the gate holds a pending pod on a node, or lets it go
            state.reserve(f"default/{name}", rng.choice(["n0", "n1", "n2", "n3"]))
        elif choice == 7:
            state.unreserve(f"default/{name}")
        elif choice < 3:
            state.apply_pod(
                pod(
                    name,
                    cpu=rng.choice(["500m", "1", "3"]),
                    node=rng.choice(["", "n0", "n1", "n2", "n3"]),
                    phase=rng.choice(["Running", "Running", "Succeeded"]),
                    deleting=rng.random() < 0.2,
                )
            )
        elif choice == 3:
            state.delete_pod("default", name)
        elif choice == 4:
            state.apply_node(node(f"n{rng.randrange(5)}", cpu=rng.choice(["4", "8"])))
        if rng.random() < 0.93:  # the changes and slices of several steps, then a look
            continue
        for demands in gangs:
            shapes = kept.shapes(demands)
            allocatable = state.allocatable_bins()
            fresh = {b.name: remainder(b, staying(b.name), shapes) for b in allocatable}
            assert dict(kept.of(shapes, allocatable)) == fresh, step
            assert kept.warm(shapes, allocatable, 1) and kept.ready(shapes, allocatable)


# ---- a simulated cluster where pods end ------------------------------------------------


@dataclass
class Running:
    node: str
    requests: Resources
    ends: int


@dataclass(frozen=True)
class Arrival:
    key: str
    at: int
    members: int
    cores: int
    memory: int
    runs: int


def sim_contest(
    allocatable: list[Bin], pods: list[Running], line: list[Gang], backfill: bool
) -> Contest:
    """The contest of one moment of the simulation: the running pods' nodes, the line."""
    on: dict[str, list[Resources]] = {}
    for p in pods:
        on.setdefault(p.node, []).append(p.requests)
    free = []
    for b in allocatable:
        left = dict(b.free)
        for requests in on.get(b.name, ()):
            for name, amount in requests.items():
                left[name] = left.get(name, 0) - amount
        free.append(Bin(b.name, left, b.labels, b.taints))
    return Contest(free, (), line, allocatable, remainders=fixed(on) if backfill else None)


def simulate(
    allocatable: list[Bin],
    running: list[Running],
    big: Gang,
    arrivals: list[Arrival],
    backfill: bool,
    horizon: int = 80,
) -> tuple[int | None, int]:
    """When the aged gang starts, and how many small gangs started before it.

    Every second: pods that end leave; the aged gang (first in line) is
    decided on, then each small gang that arrived, in order, behind it.
    """
    pods = list(running)
    started = 0
    waiting: list[Gang] = []
    for now in range(horizon):
        pods = [p for p in pods if p.ends > now]
        first = decide(big, sim_contest(allocatable, pods, waiting, backfill), float(now), AGING)
        if first.verdict == Ruling.ADMIT:
            return now, started
        for a in arrivals:
            if a.at == now:
                demands = tuple(
                    Demand(f"{a.key}-{i}", {"cpu": a.cores, "memory": a.memory, "pods": 1})
                    for i in range(a.members)
                )
                waiting.append(Gang(a.key, 0, float(now), demands, a.members))
        runs = {a.key: a.runs for a in arrivals}
        for gang in list(waiting):
            decision = decide(
                gang, sim_contest(allocatable, pods, [big, *waiting], backfill), float(now), AGING
            )
            if decision.verdict == Ruling.ADMIT:
                by_key = {d.key: d for d in gang.demands}
                for member, node_name in decision.plan.items():
                    pods.append(Running(node_name, by_key[member].requests, now + runs[gang.key]))
                waiting.remove(gang)
                started += 1
    return None, started


_NODE = st.tuples(st.sampled_from([4, 6, 8]), st.sampled_from([4, 8]), st.sampled_from([2, 3, 8]))
_RUNNING = st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(0, 4), st.integers(1, 25))
_ARRIVAL = st.tuples(
    st.integers(0, 30), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(1, 40)
)


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(_NODE, min_size=1, max_size=4),
    running=st.lists(_RUNNING, max_size=8),
    big=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4)), min_size=1, max_size=3),
    arrivals=st.lists(_ARRIVAL, max_size=10),
)
# First fit could not place these aged gangs on the empty cluster though they fit, so
# they were taken for gangs that never fit and held nothing back (app/core/packing_search.py).
@example(nodes=[(6, 4, 2), (4, 4, 2)], running=[], big=[(1, 4), (5, 1)], arrivals=[(0, 1, 1, 0, 2)])
@example(
    nodes=[(6, 4, 2), (4, 4, 2), (6, 4, 2)],
    running=[],
    big=[(5, 0), (5, 0), (2, 4)],
    arrivals=[(0, 1, 1, 0, 1), (0, 1, 1, 0, 2)],
)
def test_backfill_never_delays_the_aged_gangs_start(
    nodes: list[tuple[int, int, int]],
    running: list[tuple[int, int, int, int]],
    big: list[tuple[int, int]],
    arrivals: list[tuple[int, int, int, int, int]],
) -> None:
    allocatable = [
        Bin(f"n{i}", {"cpu": c, "memory": m, "pods": p}) for i, (c, m, p) in enumerate(nodes)
    ]
    pods: list[Running] = []
    used = {b.name: dict.fromkeys(b.free, 0) for b in allocatable}
    for i, c, m, ends in running:  # the pods running when the big gang aged, where they fit
        b = allocatable[i % len(allocatable)]
        requests = {"cpu": c, "memory": m, "pods": 1}
        if all(used[b.name][n] + requests[n] <= b.free[n] for n in requests):
            for n, amount in requests.items():
                used[b.name][n] += amount
            pods.append(Running(b.name, requests, ends))
    gang = Gang(
        "ns/big",
        0,
        0.0,
        tuple(
            Demand(f"big-{i}", {"cpu": c, "memory": m, "pods": 1}) for i, (c, m) in enumerate(big)
        ),
        len(big),
        waiting_since=-AGING,
    )
    smalls = [
        Arrival(f"ns/s{i}", at, n, c, m, runs) for i, (at, n, c, m, runs) in enumerate(arrivals)
    ]
    before, nobody = simulate(allocatable, pods, gang, smalls, backfill=False)
    after, some = simulate(allocatable, pods, gang, smalls, backfill=True)
    # Never later, and in fact at the same moment: each set of its members fits
    # exactly where it would have fitted with nothing backfilled (app/core/backfill.py).
    assert before is None or after == before, (before, after)
    if before is not None:
        assert nobody == 0  # the rule of before: nothing behind an aged gang that may fit
    assert some >= nobody


def test_in_the_simulation_small_gangs_run_where_the_old_rule_ran_none() -> None:
    allocatable = [Bin(f"n{i}", {"cpu": 8, "memory": 8, "pods": 8}) for i in range(4)]
    running = [Running(f"n{i}", {"cpu": 6, "memory": 1, "pods": 1}, 10 + 5 * i) for i in range(4)]
    big = Gang(
        "ns/big",
        0,
        0.0,
        tuple(Demand(f"big-{i}", {"cpu": 6, "memory": 1, "pods": 1}) for i in range(4)),
        4,
        waiting_since=-AGING,
    )
    smalls = [Arrival(f"ns/s{i}", i, 2, 1, 0, 100) for i in range(4)]
    assert simulate(allocatable, running, big, smalls, backfill=False) == (25, 0)
    assert simulate(allocatable, running, big, smalls, backfill=True) == (25, 4)


def test_room_beyond_what_the_aged_gang_will_need_is_held_too_as_which_frees_first_is_unknown() -> (
    None
):
    """Why only the remainder is open, not the nodes the aged gang seems not to need.

    One 6-CPU member waits; n0 runs 3 CPUs that end at 50, n1 runs 4 CPUs that
    end at 5. Setting n0 aside for it (fewer, smaller pods in the way) and
    letting a 4-CPU gang take n1 would start it at 50 instead of 5.
    """
    allocatable = [Bin(f"n{i}", {"cpu": 8, "memory": 8, "pods": 8}) for i in range(2)]
    running = [
        Running("n0", {"cpu": 3, "memory": 0, "pods": 1}, 50),
        Running("n1", {"cpu": 4, "memory": 0, "pods": 1}, 5),
    ]
    big = Gang("ns/big", 0, 0.0, (Demand("big-0", {"cpu": 6, "memory": 0, "pods": 1}),), 1, -AGING)
    smalls = [Arrival("ns/four", 1, 1, 4, 0, 100), Arrival("ns/two", 1, 1, 2, 0, 100)]
    assert simulate(allocatable, running, big, smalls, backfill=False) == (5, 0)
    # The 2-CPU gang runs in a remainder (2 CPUs on either node); the 4-CPU one waits.
    assert simulate(allocatable, running, big, smalls, backfill=True) == (5, 1)
