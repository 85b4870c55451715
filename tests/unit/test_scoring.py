from app.scoring import ScoringPolicy, binpack, binpack_all, binpack_request, score_nodes
from app.state import ClusterState
from tests.unit.builders import node, pod

CPU1 = {"cpu": 1000, "memory": 1024**3 * 1000, "pods": 1000}


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
    first = score_nodes(policy, state, CPU1, None, names)
    assert first == score_nodes(policy, state, CPU1, None, names)
    assert set(first) == set(names)
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in first.values())
    assert first["n2"] > first["n1"] == first["n3"]
    assert first["unknown"] == 0


def test_gang_locality_pulls_members_together() -> None:
    state = cluster()
    state.apply_pod(pod("m0", group="g", node="n3"))
    state.apply_pod(pod("m1", group="g"))
    state.reserve("default/m1", "n3")
    state.apply_pod(pod("other", node="n1", cpu="3"))  # binpack alone would pick n1
    scores = score_nodes(ScoringPolicy(), state, CPU1, "default/g", ["n1", "n2", "n3"])
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
    scores = score_nodes(policy, state, CPU1, "default/g", ["a1", "a2", "b1"])
    assert scores["a1"] == 10
    assert scores["a2"] > scores["b1"] == 0


def test_non_gang_pods_can_get_a_neutral_score() -> None:
    state = cluster()
    state.apply_pod(pod("busy", node="n1", cpu="3"))
    policy = ScoringPolicy(binpack_non_gang=False)
    assert set(score_nodes(policy, state, CPU1, None, ["n1", "n2"]).values()) == {0}


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
    scores = score_nodes(policy, state, CPU1, "default/g", ["a1", "b1", "b2"])
    # Zone a (4 CPUs) holds the 3 x 1 CPU gang with the least to spare.
    assert scores["a1"] > scores["b1"] == scores["b2"]
    for i in range(3, 6):  # 6 members no longer fit zone a: zone b it is
        state.apply_pod(pod(f"m{i}", group="g"))
    scores = score_nodes(policy, state, CPU1, "default/g", ["a1", "b1", "b2"])
    assert scores["b1"] == scores["b2"] > scores["a1"]
