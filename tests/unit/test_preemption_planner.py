"""The pure planner: fewest evictions for a whole gang, checked against an exhaustive search."""

from __future__ import annotations

import random

import pytest

from app.core.packing import Bin, Demand
from app.core.placement import Placement
from app.core.preemption.cheapest_victims import Evictable, cheapest_victims
from app.core.preemption.planner import PlanResult, plan
from tests.preemption_oracle import Running, fewest_evictions

CPU4 = {"cpu": 4000, "pods": 110_000}


def member(i: int, cpu: int = 2000, placement: Placement | None = None) -> Demand:
    return Demand(f"ns/m-{i}", {"cpu": cpu, "pods": 1000}, placement)


def unit(
    name: str,
    node: str,
    cpu: int,
    priority: int = 0,
    *,
    gang: str | None = None,
    budget: str | None = None,
    evictions: int = 1,
) -> Evictable:
    return Evictable(
        (f"uid-{name}",),
        (f"ns/{name}",),
        node,
        {"cpu": cpu, "pods": 1000},
        priority,
        gang,
        budget,
        evictions,
    )


def room(node: str, cpu: int) -> Bin:
    return Bin(node, {"cpu": cpu, "pods": 100_000})


def victims_by_node(result: PlanResult) -> dict[str, set[str]]:
    return {p.node: {k for v in p.victims for k in v.keys} for p in result.nodes if p.victims}


def test_the_ci_failure_three_victims_for_three_members_only_where_members_go() -> None:
    """3 nodes x 4 CPUs, each with a 3-CPU and a 0.5-CPU pod; a gang of 3 x 2 CPUs."""
    bins = [room(n, 500) for n in ("n1", "n2", "n3")]
    evictable = {
        n: [unit(f"big-{n}", n, 3000), unit(f"small-{n}", n, 500)] for n in ("n1", "n2", "n3")
    }
    result = plan([member(i) for i in range(3)], bins, evictable)
    assert result is not None
    assert result.cost.evictions == 3
    members_on = {p.node: len(p.members) for p in result.nodes}
    assert sum(members_on.values()) == 3
    # Every victim sits on a node that receives a member.
    assert set(victims_by_node(result)) <= set(members_on)


def test_free_room_is_taken_before_anyone_is_evicted() -> None:
    bins = [room("n1", 4000), room("n2", 1000)]
    evictable = {"n2": [unit("a", "n2", 3000)], "n1": []}
    result = plan([member(i) for i in range(3)], bins, evictable)
    assert result is not None and result.cost.evictions == 1
    assert {p.node: len(p.members) for p in result.nodes} == {"n1": 2, "n2": 1}


def test_lowest_priorities_break_a_tie_in_evictions() -> None:
    bins = [room("n1", 0), room("n2", 0)]
    evictable = {"n1": [unit("a", "n1", 4000, 50)], "n2": [unit("b", "n2", 4000, 10)]}
    result = plan([member(0)], bins, evictable)
    assert result is not None and victims_by_node(result) == {"n2": {"ns/b"}}


def test_fewest_gangs_disturbed_breaks_a_tie_in_priority() -> None:
    bins = [room("n1", 0), room("n2", 0)]
    evictable = {
        "n1": [unit("g-1", "n1", 4000, gang="ns/g", budget="ns/g")],
        "n2": [unit("plain", "n2", 4000)],
    }
    result = plan([member(0)], bins, evictable, {"ns/g": 1})
    assert result is not None and victims_by_node(result) == {"n2": {"ns/plain"}}


def test_a_running_gangs_budget_holds_across_nodes() -> None:
    """protect: the gang keeps minMember, so only one of its members may go, whichever node."""
    bins = [room("n1", 0), room("n2", 0), room("n3", 0)]
    evictable = {
        "n1": [unit("g-1", "n1", 4000, budget="ns/g", gang="ns/g")],
        "n2": [unit("g-2", "n2", 4000, budget="ns/g", gang="ns/g")],
        "n3": [unit("x", "n3", 2000), unit("y", "n3", 2000)],
    }
    result = plan([member(0, 3000), member(1, 3000)], bins, evictable, {"ns/g": 1})
    assert result is not None
    gang_victims = [v for v in result.victims if v.budget == "ns/g"]
    assert len(gang_victims) <= 1
    assert result.cost.evictions == 3  # one gang member, and both pods of n3


def test_a_closed_budget_is_never_spent_like_a_pdb_with_no_disruption_left() -> None:
    bins = [room("n1", 0)]
    evictable = {"n1": [unit("guarded", "n1", 4000, budget="pdb/web")]}
    assert plan([member(0)], bins, evictable, {"pdb/web": 0}) is None
    evictable["n1"].append(unit("a", "n1", 1000))
    evictable["n1"].append(unit("b", "n1", 1000))
    result = plan([member(0)], bins, evictable, {"pdb/web": 0})
    assert result is not None and victims_by_node(result) == {"n1": {"ns/a", "ns/b"}}


def test_a_gang_larger_than_any_node_spreads_over_the_nodes() -> None:
    bins = [room(n, 0) for n in ("n1", "n2", "n3")]
    evictable = {n: [unit(f"fill-{n}", n, 4000)] for n in ("n1", "n2", "n3")}
    result = plan([member(i) for i in range(6)], bins, evictable)
    assert result is not None and result.cost.evictions == 3
    assert sorted(len(p.members) for p in result.nodes) == [2, 2, 2]


def test_no_plan_when_even_every_lower_pod_is_not_enough() -> None:
    bins = [room("n1", 0), room("n2", 0)]
    evictable = {"n1": [unit("a", "n1", 1000)], "n2": [unit("b", "n2", 4000)]}
    assert plan([member(0), member(1), member(2)], bins, evictable) is None


def test_whole_gang_units_count_every_member_that_goes() -> None:
    bins = [room("n1", 0), room("n2", 0)]
    evictable = {
        "n1": [unit("gang", "n1", 4000, gang="ns/g", evictions=3)],
        "n2": [unit("a", "n2", 2000), unit("b", "n2", 2000)],
    }
    result = plan([member(0, 4000)], bins, evictable)
    assert result is not None and victims_by_node(result) == {"n2": {"ns/a", "ns/b"}}


def test_members_of_different_sizes_and_placements() -> None:
    gpu_only = Placement(node_selector=(("kind", "gpu"),))
    bins = [
        Bin("gpu", {"cpu": 0, "pods": 100_000}, {"kind": "gpu"}),
        Bin("cpu", {"cpu": 1000, "pods": 100_000}, {"kind": "cpu"}),
    ]
    evictable = {"gpu": [unit("a", "gpu", 4000)], "cpu": [unit("b", "cpu", 2000)]}
    demands = [member(0, 4000, gpu_only), member(1, 1000)]
    result = plan(demands, bins, evictable)
    assert result is not None and result.cost.evictions == 1
    assert {p.node: p.members for p in result.nodes} == {"gpu": ("ns/m-0",), "cpu": ("ns/m-1",)}


def test_cheapest_victims_is_exact_for_small_sets() -> None:
    units = [unit("a", "n", 1000), unit("b", "n", 1000), unit("c", "n", 2500)]
    found = cheapest_victims({"cpu": 2000}, units, {})
    assert found is not None
    cost, chosen = found
    assert cost.evictions == 1 and [u.keys for u in chosen] == [("ns/c",)]


def random_cluster(
    rng: random.Random,
) -> tuple[dict[str, dict[str, int]], list[Running], list[dict[str, int]], dict[str, int]]:
    nodes = {f"n{i}": {"cpu": rng.choice([4000, 6000, 8000])} for i in range(rng.randint(3, 5))}
    running: list[Running] = []
    gang_min: dict[str, int] = {}
    for name, alloc in nodes.items():
        used = 0
        while used < alloc["cpu"] - 500:
            cpu = rng.choice([500, 1000, 1500, 2000, 3000])
            if used + cpu > alloc["cpu"]:
                break
            gang = rng.choice([None, None, None, "g1", "g2"])
            running.append(
                Running(
                    f"p{len(running)}", name, {"cpu": cpu}, rng.choice([0, 10, 100, 2000]), gang
                )
            )
            used += cpu
    for gang in ("g1", "g2"):
        size = sum(1 for p in running if p.gang == gang)
        gang_min[gang] = max(1, size - rng.randint(0, 2))
    demands = [{"cpu": rng.choice([1000, 2000, 3000])}] * rng.randint(2, 4)
    return nodes, running, demands, gang_min


@pytest.mark.parametrize("seed", range(60))
def test_fewest_evictions_matches_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    nodes, running, demands, gang_min = random_cluster(rng)
    priority = 1000
    bins = []
    for name, alloc in nodes.items():
        used = sum(p.requests["cpu"] for p in running if p.node == name)
        bins.append(Bin(name, {"cpu": alloc["cpu"] - used}))
    evictable: dict[str, list[Evictable]] = {}
    budgets: dict[str, int] = {}
    for p in running:
        if p.priority >= priority:
            continue
        evictable.setdefault(p.node, []).append(
            Evictable((p.name,), (p.name,), p.node, dict(p.requests), p.priority, p.gang, p.gang)
        )
        if p.gang is not None:
            budgets[p.gang] = sum(1 for q in running if q.gang == p.gang) - gang_min[p.gang]
    wanted = [Demand(f"m{i}", dict(d)) for i, d in enumerate(demands)]
    result = plan(wanted, bins, evictable, budgets)
    best = fewest_evictions(nodes, running, demands, priority, gang_min)
    if best is None:
        assert result is None
        return
    assert result is not None, f"a plan with {best} evictions exists"
    assert result.cost.evictions == best
    # The plan is real: members fit where it puts them once its victims are gone.
    gone = {uid for v in result.victims for uid in v.uids}
    left = {b.name: b.free["cpu"] for b in bins}
    for p in running:
        if p.name in gone:
            left[p.node] += p.requests["cpu"]
    for planned in result.nodes:
        left[planned.node] -= sum(
            next(d.requests["cpu"] for d in wanted if d.key == k) for k in planned.members
        )
        assert planned.victims == () or planned.members, "victims on a node no member uses"
    assert all(v >= 0 for v in left.values()), left
    lost: dict[str, int] = {}
    for v in result.victims:
        if v.budget is not None:
            lost[v.budget] = lost.get(v.budget, 0) + 1
    assert all(n <= budgets[g] for g, n in lost.items())
