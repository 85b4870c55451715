"""The node the filter names for a gang member: what stops the pick, what it avoids, which."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.core.node_choice import soft_preference, without_disfavoured
from app.core.scoring import NodeScorer, ScoringPolicy
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
    names = ["soft", "clean", "hard"]
    # NoSchedule is kube-scheduler's filter's business: it offered the node, so it is allowed.
    assert without_disfavoured(names, state.nodes, {}) == ["clean", "hard"]
    tolerant = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    assert without_disfavoured(names, state.nodes, tolerant) == names
    assert without_disfavoured(["soft"], state.nodes, {}) == ["soft"]
    assert without_disfavoured(["clean", "unknown"], state.nodes, {}) == ["clean", "unknown"]


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
    used=st.lists(st.integers(0, 19), min_size=1, max_size=6),
    placed=st.lists(st.integers(0, 5), max_size=6),
    weights=st.sampled_from([(2, 1), (0, 1), (1, 0), (1, 3)]),
)
def test_best_is_a_node_prioritize_scores_highest(
    used: list[int], placed: list[int], weights: tuple[int, int]
) -> None:
    """What the filter names is never a node that prioritize would have ranked lower."""
    state = ClusterState()
    names = [f"n{n}" for n in range(len(used))]
    state.replace_nodes([node(name, cpu="20", memory="1Ti") for name in names])
    for n, cores in enumerate(used):
        if cores:
            state.apply_pod(pod(f"other{n}", node=f"n{n}", cpu=str(cores), memory="1Ki"))
    for i, n in enumerate(placed):
        if n < len(names):
            state.apply_pod(pod(f"m{i}", group="g", node=f"n{n}", cpu="0", memory="1Ki"))
    policy = ScoringPolicy(locality_weight=weights[0], binpack_weight=weights[1])
    scorer = NodeScorer(policy, state)
    requests = {"cpu": 1000}
    scores = scorer.score(requests, "default/g", names)
    best = scorer.best(requests, "default/g", names)
    assert best in names
    assert scores.get(best, 0) == max(scores.get(n, 0) for n in names)
