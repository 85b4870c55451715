"""The node the filter names for a gang member: what stops the pick, what it avoids, which."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.core.binpack import binpack, binpack_request
from app.core.node_choice import (
    SoftTaintedNodes,
    soft_preference,
    soft_taints_of,
    without_disfavoured,
)
from app.core.scoring import NodeScorer, ScoringPolicy, locality
from app.core.state import ClusterState
from tests.unit.builders import node, pod

PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_only_preferences_that_kube_schedulers_scoring_weighs_stop_the_pick() -> None:
    assert soft_preference({}) is None
    # Required terms and spreads that may not be broken are filters: kube-scheduler
    # checked them on every node it offers.
    required: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}},
            "podAntiAffinity": {REQUIRED: [{"topologyKey": "kubernetes.io/hostname"}]},
        },
        "topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}],
    }
    assert soft_preference(required) is None
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        spec = {"affinity": {kind: {PREFERRED: [{"weight": 1}]}}}
        assert soft_preference(spec) == f"affinity.{kind}.{PREFERRED}"
    # kube-scheduler spreads the pods of these owners by default; a Job's pods it does not.
    for kind in ("ReplicaSet", "ReplicationController", "StatefulSet"):
        meta = {"ownerReferences": [{"kind": kind, "name": "x"}]}
        assert kind in (soft_preference({}, meta) or "")
    assert soft_preference({}, {"ownerReferences": [{"kind": "Job", "name": "x"}]}) is None
    assert soft_preference({}, {"ownerReferences": "x"}) is None
    # Shapes the API server would not store are no preference, never an error.
    assert soft_preference({"affinity": ["x"], "topologySpreadConstraints": "x"}) is None
    assert soft_preference({"affinity": {"nodeAffinity": 3}}) is None
    spread = {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]}
    assert "ScheduleAnyway" in (soft_preference(spread) or "")


def tainted(name: str, *effects: str) -> dict[str, Any]:
    raw = node(name)
    raw["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": e} for e in effects]
    return raw


def test_nodes_the_pod_would_rather_avoid_are_left_out_unless_nothing_else_is_offered() -> None:
    state = ClusterState()
    state.replace_nodes(
        [node("clean"), tainted("soft", "PreferNoSchedule"), tainted("hard", "NoSchedule")]
    )
    soft = SoftTaintedNodes(state).current()
    assert set(soft) == {"soft"} and soft == soft_taints_of(state.nodes)
    names = ["soft", "clean", "hard"]
    # NoSchedule is kube-scheduler's filter's business: it offered the node, so it is allowed.
    assert without_disfavoured(names, soft, {}) == ["clean", "hard"]
    tolerant = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    assert without_disfavoured(names, soft, tolerant) == names
    assert without_disfavoured(["soft"], soft, {}) == ["soft"]
    assert without_disfavoured(["clean", "unknown"], soft, {}) == ["clean", "unknown"]


def test_the_soft_tainted_nodes_follow_node_changes() -> None:
    state = ClusterState()
    state.replace_nodes([node("a"), node("b")])
    kept = SoftTaintedNodes(state)
    assert kept.current() == {}
    state.apply_node(tainted("a", "PreferNoSchedule"))
    assert set(kept.current()) == {"a"}
    state.apply_node(tainted("b", "PreferNoSchedule", "NoSchedule"))
    state.apply_node(node("a"))
    assert set(kept.current()) == {"b"} and len(kept.current()["b"]) == 1
    state.delete_node("b")
    assert kept.current() == {}
    state.replace_nodes([tainted("c", "PreferNoSchedule")])
    assert set(kept.current()) == {"c"}


def test_best_is_the_fullest_node_and_ties_go_to_the_first_offered() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1"), node("n2"), node("n3")])
    scorer = NodeScorer(ScoringPolicy(), state)
    requests = {"cpu": 1000}
    assert scorer.best(requests, "default/g", ["n3", "n1", "n2"]) == "n3"
    state.apply_pod(pod("busy", node="n2", cpu="2"))
    assert scorer.best(requests, "default/g", ["n3", "n1", "n2"]) == "n2"
    assert scorer.best(requests, "default/g", []) is None
    off = NodeScorer(ScoringPolicy(locality_weight=0, binpack_weight=0), state)
    assert off.best(requests, "default/g", ["n1", "n2"]) is None


@given(
    used=st.lists(st.integers(0, 19), min_size=1, max_size=24),
    placed=st.lists(st.integers(0, 23), max_size=6),
    weights=st.sampled_from([(2, 1), (0, 1), (1, 0), (1, 3)]),
    zones=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_best_is_the_first_node_of_highest_unrounded_score(
    used: list[int], placed: list[int], weights: tuple[int, int], zones: bool, order: Any
) -> None:
    """What the filter names: the weighted parts, compared before rounding; ties to the first.

    So it is never a node that prioritize would have ranked lower. With
    zones, locality covers whole domains (more than a few nodes).
    """
    state = ClusterState()
    names = [f"n{n}" for n in range(len(used))]
    nodes = []
    for n, name in enumerate(names):
        raw = node(name, cpu="20", memory="1Ti")
        raw["metadata"]["labels"]["zone"] = "a" if n % 3 else "b"
        nodes.append(raw)
    state.replace_nodes(nodes)
    for n, cores in enumerate(used):
        if cores:
            state.apply_pod(pod(f"other{n}", node=f"n{n}", cpu=str(cores), memory="1Ki"))
    for i, n in enumerate(placed):
        if n < len(names):
            state.apply_pod(pod(f"m{i}", group="g", node=f"n{n}", cpu="0", memory="1Ki"))
    policy = ScoringPolicy(
        locality_weight=weights[0],
        binpack_weight=weights[1],
        topology_key="zone" if zones else None,
    )
    scorer = NodeScorer(policy, state)
    requests = {"cpu": 1000}
    offered = [*names, "unknown"]
    order.shuffle(offered)
    near = locality(policy, state, "default/g", offered, state.nodes.get)
    asked = binpack_request(policy.binpack_resources, requests)

    def value(name: str) -> float:
        packed = binpack(asked, state, state.nodes.get(name)) if weights[1] else 0.0
        return weights[0] * near.get(name, 0.0) + weights[1] * packed

    expected = max(offered, key=value)  # max() keeps the first of equals
    assert scorer.best(requests, "default/g", offered) == expected
    scores = scorer.score(requests, "default/g", offered)
    assert scores.get(expected, 0) == max(scores.get(n, 0) for n in offered)
