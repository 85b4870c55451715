import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import binpack as binpack_module
from app.core.binpack import ShapeMemo, binpack, binpack_all, binpack_request
from app.core.records import node_record_from
from app.core.resources import Resources
from app.core.scoring import NodeScorer, ScoringPolicy
from app.core.state import ClusterState
from app.web.wire import host_priorities
from tests.unit.builders import node, pod

ONE_CPU = {"cpu": 1000}
CPU1 = {"cpu": 1000, "memory": 1024**3 * 1000, "pods": 1000}


def every(
    scorer: NodeScorer, requests: Resources, group: str | None, names: list[str]
) -> dict[str, int]:
    """The scores of all `names`: the scorer leaves out the nodes that score 0."""
    scores = scorer.score(requests, group, names)
    assert all(0 < score <= 10 for score in scores.values())
    return {name: scores.get(name, 0) for name in names}


def cluster() -> ClusterState:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2"), node("n3")])
    return state


def test_binpack_prefers_the_fuller_node_and_zeroes_overflow() -> None:
    state = cluster()
    state.apply_pod(pod("busy", node="n1", cpu="2", memory="4Gi"))
    asked = binpack_request({"cpu": 1, "memory": 1}, CPU1)
    full = binpack(asked, state, state.nodes["n1"])
    empty = binpack(asked, state, state.nodes["n2"])
    assert full > empty > 0
    # (2+1)/4 cpu and (4+1)/8 memory, equally weighted.
    assert full == (3 / 4 + 5 / 8) / 2
    assert binpack(binpack_request({"cpu": 1}, {"cpu": 5000}), state, state.nodes["n2"]) == 0.0


def test_binpack_all_is_binpack_for_every_node() -> None:
    state = cluster()
    state.apply_pod(pod("busy", node="n1", cpu="2", memory="4Gi"))
    state.apply_pod(pod("full", node="n3", cpu="4"))
    names = ["n1", "n2", "n3", "unknown"]
    for weights in ({"cpu": 1, "memory": 1}, {"cpu": 3}, {"memory": 2, "gpu": 1}):
        asked = binpack_request(weights, CPU1)
        expected = {n: binpack(asked, state, state.nodes.get(n)) for n in names}
        assert binpack_all(asked, state, names) == expected


def test_scores_are_integers_0_to_10_for_every_node_and_deterministic() -> None:
    state = cluster()
    state.apply_pod(pod("busy", node="n2", cpu="3"))
    policy = ScoringPolicy()
    names = ["n1", "n2", "n3", "unknown"]
    scorer = NodeScorer(policy, state)
    first = every(scorer, CPU1, None, names)
    assert first == every(scorer, CPU1, None, names)
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in first.values())
    assert first["n2"] > first["n1"] == first["n3"]
    assert first["unknown"] == 0


def test_gang_locality_pulls_members_together() -> None:
    state = cluster()
    state.apply_pod(pod("m0", group="g", node="n3"))
    state.apply_pod(pod("m1", group="g"))
    state.reserve("default/m1", "n3")
    state.apply_pod(pod("other", node="n1", cpu="3"))  # binpack alone would pick n1
    scores = every(NodeScorer(ScoringPolicy(), state), CPU1, "default/g", ["n1", "n2", "n3"])
    assert scores["n3"] > scores["n1"] > scores["n2"]


def test_topology_domain_counts_members_on_other_nodes_of_the_zone() -> None:
    state = ClusterState()
    zone_a1, zone_a2, zone_b = node("a1"), node("a2"), node("b1")
    zone_a1["metadata"]["labels"]["zone"] = "a"
    zone_a2["metadata"]["labels"]["zone"] = "a"
    zone_b["metadata"]["labels"]["zone"] = "b"
    state.replace_nodes([zone_a1, zone_a2, zone_b])
    state.apply_pod(pod("m0", group="g", node="a1"))
    policy = ScoringPolicy(topology_key="zone", binpack_weight=0)
    scores = every(NodeScorer(policy, state), CPU1, "default/g", ["a1", "a2", "b1"])
    assert scores["a1"] == 10
    assert scores["a2"] > scores["b1"] == 0


def test_non_gang_pods_can_get_a_neutral_score() -> None:
    state = cluster()
    state.apply_pod(pod("busy", node="n1", cpu="3"))
    policy = ScoringPolicy(binpack_non_gang=False)
    assert set(every(NodeScorer(policy, state), CPU1, None, ["n1", "n2"]).values()) == {0}


def test_before_any_member_is_placed_all_members_aim_at_the_tightest_fitting_zone() -> None:
    state = ClusterState()
    nodes = [node("a1"), node("b1"), node("b2")]
    nodes[0]["metadata"]["labels"]["zone"] = "a"
    nodes[1]["metadata"]["labels"]["zone"] = "b"
    nodes[2]["metadata"]["labels"]["zone"] = "b"
    state.replace_nodes(nodes)
    for i in range(3):
        state.apply_pod(pod(f"m{i}", group="g"))
    policy = ScoringPolicy(topology_key="zone", binpack_weight=0)
    scores = every(NodeScorer(policy, state), CPU1, "default/g", ["a1", "b1", "b2"])
    # Zone a (4 CPUs) holds the 3 x 1 CPU gang with the least to spare.
    assert scores["a1"] > scores["b1"] == scores["b2"]
    for i in range(3, 6):  # 6 members no longer fit zone a: zone b it is
        state.apply_pod(pod(f"m{i}", group="g"))
    scores = every(NodeScorer(policy, state), CPU1, "default/g", ["a1", "b1", "b2"])
    assert scores["b1"] == scores["b2"] > scores["a1"]


# ---- the per-node memo --------------------------------------------------------------

NAMES = ["n0", "n1", "n2", "n3", "gone"]
SHAPES = [{"cpu": 500, "memory": 1024**3}, {"cpu": 2000}, {"memory": 3 * 1024**3}]

step = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 9), st.integers(0, 3), st.sampled_from(["1", "2"])),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("reserve"), st.integers(0, 9), st.integers(0, 3)),
    st.tuples(st.just("unreserve"), st.integers(0, 9)),
    st.tuples(st.just("resize"), st.integers(0, 3), st.sampled_from(["2", "4", "8"])),
    st.tuples(st.just("drop_node"), st.integers(0, 3)),
    st.tuples(st.just("replace_nodes"), st.integers(1, 4)),
)


def apply(state: ClusterState, change: tuple[object, ...]) -> None:
    match change:
        case ("bind", i, n, cpu):
            state.apply_pod(pod(f"p{i}", node=f"n{n}", cpu=str(cpu)))
        case ("delete", i):
            state.delete_pod("default", f"p{i}")
        case ("reserve", i, n):
            if f"default/p{i}" not in state.pods:
                state.apply_pod(pod(f"p{i}"))
            state.reserve(f"default/p{i}", f"n{n}")
        case ("unreserve", i):
            state.unreserve(f"default/p{i}")
        case ("resize", n, cpu):
            state.apply_node(node(f"n{n}", cpu=str(cpu)))
        case ("drop_node", n):
            state.delete_node(f"n{n}")
        case ("replace_nodes", int(count)):
            state.replace_nodes([node(f"n{n}") for n in range(count)])


@given(
    steps=st.lists(step, max_size=30),
    shape=st.integers(0, len(SHAPES) - 1),
    offered=st.permutations(NAMES).flatmap(
        lambda names: st.integers(1, len(names)).map(lambda n: names[:n])
    ),
    high=st.sampled_from([binpack_module.HIGH, 1]),
)
def test_remembered_scores_always_equal_a_fresh_computation(
    steps: list[tuple[object, ...]], shape: int, offered: list[str], high: int
) -> None:
    """Whatever changed on which node, the memo answers what binpack() computes now."""
    with pytest.MonkeyPatch.context() as patch:
        # One fullest node, and a mark chosen again at each change, as well as the defaults.
        patch.setattr(binpack_module, "HIGH", high)
        patch.setattr(
            binpack_module, "REMARK_AFTER", 1 if high == 1 else binpack_module.REMARK_AFTER
        )
        _remembered_scores_equal_a_fresh_computation(steps, SHAPES[shape], offered)


def _remembered_scores_equal_a_fresh_computation(
    steps: list[tuple[object, ...]], requests: Resources, offered: list[str]
) -> None:
    state = ClusterState()
    state.replace_nodes([node(f"n{n}") for n in range(4)])
    policy = ScoringPolicy()
    scorer = NodeScorer(policy, state)
    for change in steps:
        apply(state, change)
        remembered = every(scorer, requests, None, NAMES)
        asked = binpack_request(policy.binpack_resources, requests)
        expected = {
            name: max(0, min(10, round(binpack(asked, state, state.nodes.get(name)) * 10)))
            for name in NAMES
        }
        assert remembered == expected
        assert remembered == every(NodeScorer(policy, state), requests, None, NAMES)
        # A gang member's binpack part comes from the same memo.
        gang = scorer.score(requests, "default/g", NAMES)
        assert gang == NodeScorer(policy, state).score(requests, "default/g", NAMES)
        # And the node the filter names for a member (names our watch has not seen included).
        best = scorer.best(requests, "default/g", NAMES)
        assert best == NodeScorer(policy, state).best(requests, "default/g", NAMES)
        # Some nodes in some order, as kube-scheduler's own filters leave them: the
        # first of the fullest offered, whether or not the cluster's fullest is among them.
        fullest = max(offered, key=lambda name: binpack(asked, state, state.nodes.get(name)))
        assert scorer.best(requests, "default/g", offered) == fullest


@given(steps=st.lists(step, max_size=30), shape=st.integers(0, len(SHAPES) - 1))
def test_a_new_shapes_memo_is_the_one_remembered_node_by_node(
    steps: list[tuple[object, ...]], shape: int
) -> None:
    """A new request shape's memo, built in one pass over the nodes, holds exactly the
    fractions and scores that remember() of each node's binpack() gives."""
    state = ClusterState()
    state.replace_nodes([node(f"n{n}") for n in range(4)])
    asked = binpack_request(ScoringPolicy().binpack_resources, SHAPES[shape])
    for change in steps:
        apply(state, change)
        by_node = ShapeMemo()
        for name, record in state.nodes.items():
            by_node.remember(name, binpack(asked, state, record))
        built = ShapeMemo.of_every_node(asked, state)
        assert built == by_node and list(built.fractions) == list(by_node.fractions)


@settings(deadline=None)
@given(
    changes=st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from([None, 0.0, 0.1, 0.1, 0.5, 0.9])), max_size=40
    ),
    high=st.integers(1, 3),
)
def test_the_fullest_nodes_are_all_those_above_the_least_full_of_them(
    changes: list[tuple[int, float | None]], high: int
) -> None:
    """Whatever the memo went through, no node outside high() is as full as one in it:
    a gang member's node is picked from those of them that kube-scheduler offered."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(binpack_module, "HIGH", high)
        patch.setattr(binpack_module, "REMARK_AFTER", 2)
        memo = ShapeMemo()
        for node_index, fraction in changes:
            name = f"n{node_index}"
            if fraction is None:
                memo.forget(name)
            else:
                memo.remember(name, fraction)
            fullest = memo.high()
            assert fullest <= memo.fractions.keys()
            if fullest:
                least = min(memo.fractions[n] for n in fullest)
                assert least > 0
                assert fullest == {n for n, f in memo.fractions.items() if f >= least}


def test_the_fullest_nodes_leave_out_the_many_alike_below_them() -> None:
    """A mostly empty cluster: the empty nodes, all alike, are not among the fullest,
    or every window kube-scheduler offers would hold hundreds of them."""
    memo = ShapeMemo()
    for i in range(1000):
        memo.remember(f"empty{i}", 0.01)
    for i in range(10):
        memo.remember(f"used{i}", 0.2)
    assert memo.high() == {f"used{i}" for i in range(10)}
    memo.remember("empty7", 0.3)  # a member landed there
    assert memo.high() == {"empty7"} | {f"used{i}" for i in range(10)}


@pytest.mark.parametrize("names", [[], ["n1"], ["gone"], ["n3", "n1"], ["gone", "n2"]])
def test_the_memo_reads_any_number_of_names_seen_or_not(names: list[str]) -> None:
    """One name, none, or names the memo has not seen: what a fresh computation gives."""
    state = cluster()
    state.apply_pod(pod("busy", node="n1", cpu="1"))
    scorer = NodeScorer(ScoringPolicy(), state)
    assert NodeScorer(ScoringPolicy(), state).score(ONE_CPU, None, ["n1"])  # n1 scores
    for _ in range(2):  # the first call fills the memo, the second reads it
        for group in (None, "default/g"):
            fresh = NodeScorer(ScoringPolicy(), state)
            assert scorer.score(ONE_CPU, group, names) == fresh.score(ONE_CPU, group, names)
        assert scorer.best(ONE_CPU, "default/g", names) == fresh.best(ONE_CPU, "default/g", names)
    if names:
        assert scorer.best(ONE_CPU, "default/g", names) in names


def test_a_node_in_the_request_wins_over_the_memo() -> None:
    """Without nodeCacheCapable kube-scheduler sends the Node objects: score those."""
    state = cluster()
    scorer = NodeScorer(ScoringPolicy(), state)
    requests = {"cpu": 2000}
    cached = scorer.score(requests, None, ["n1"])
    small = node_record_from(node("n1", cpu="2"))
    assert scorer.score(requests, None, ["n1"], {"n1": small}) == {"n1": 10}
    assert cached == {"n1": 5}
    assert scorer.score(requests, None, ["n1"]) == cached


def test_zero_scores_are_left_out_of_the_answer() -> None:
    """kube-scheduler adds nothing for an unnamed node, exactly as for a 0."""
    assert host_priorities({"a": 0, "b": 3, "c": 0}) == [{"Host": "b", "Score": 3}]


def test_more_changes_than_the_state_remembers_forget_every_score() -> None:
    """A scorer that fell behind ClusterState's bounded change list starts over."""
    state = cluster()
    scorer = NodeScorer(ScoringPolicy(), state)
    before = every(scorer, CPU1, None, ["n1", "n2"])
    state.apply_pod(pod("big", node="n1", cpu="2"))
    for i in range(5000):  # each binding changes n1 once
        state.apply_pod(pod(f"p{i}", node="n1", cpu="0", memory="1Ki"))
    _, changed = state.nodes_changed_since(0)
    assert changed is None
    after = every(scorer, CPU1, None, ["n1", "n2"])
    assert after == every(NodeScorer(ScoringPolicy(), state), CPU1, None, ["n1", "n2"])
    assert after["n1"] > before["n1"] and after["n2"] == before["n2"]


@given(
    placed=st.lists(st.integers(0, 3), max_size=6),
    used=st.lists(st.sampled_from(["0", "1", "7", "9", "19"]), min_size=4, max_size=4),
    weights=st.tuples(st.integers(0, 3), st.integers(0, 3)),
)
def test_a_gang_members_scores_are_the_weighted_parts_rounded(
    placed: list[int], used: list[str], weights: tuple[int, int]
) -> None:
    """Locality and binpack, weighted, then rounded: the nodes that round to 0 are left out.

    Nodes of 20 CPUs with 0 to 19 used: the binpack part lands on and around the
    fraction that rounds to 0 or to 1. A value within float error of a half may
    round either way.
    """
    state = ClusterState()
    state.replace_nodes([node(f"n{n}", cpu="20", memory="1Ti") for n in range(4)])
    for n, cores in enumerate(used):
        state.apply_pod(pod(f"other{n}", node=f"n{n}", cpu=cores, memory="1Ki"))
    for i, n in enumerate(placed):
        state.apply_pod(pod(f"m{i}", group="g", node=f"n{n}", cpu="0", memory="1Ki"))
    locality_weight, binpack_weight = weights
    policy = ScoringPolicy(locality_weight=locality_weight, binpack_weight=binpack_weight)
    requests = {"cpu": 1000}
    asked = binpack_request(policy.binpack_resources, requests)
    total = locality_weight + binpack_weight
    names = [f"n{n}" for n in range(4)]
    scores = NodeScorer(policy, state).score(requests, "default/g", names)
    for name in names:
        near = sum(1 for n in placed if f"n{n}" == name) / len(placed) if placed else 0.0
        packed = binpack(asked, state, state.nodes[name]) if binpack_weight else 0.0
        tenths = (locality_weight * near + binpack_weight * packed) / total * 10 if total else 0
        allowed = {math.floor(tenths), math.ceil(tenths)}
        if abs(tenths - math.floor(tenths) - 0.5) > 1e-9:
            allowed = {round(tenths)}
        assert scores.get(name, 0) in allowed, (name, tenths, scores)
    assert 0 not in scores.values()
