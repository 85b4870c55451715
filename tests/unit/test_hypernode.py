"""Volcano HyperNodes as topology levels (app/core/topology/hypernode.py) and their placement."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.contention import Contest, Gang, Ruling
from app.core.packing import Bin, Demand
from app.core.state import ClusterState
from app.core.topology.domains import (
    DEFAULT_LEVELS,
    Domain,
    TopologyConstraint,
    TopologyError,
    Where,
    domain_message,
    levels_to_try,
    place,
)
from app.core.topology.hypernode import (
    HyperNodeError,
    HyperNodeIndex,
    hypernode_from,
    tier_level,
    tier_of,
)
from app.core.topology.sources import (
    KUEUE_PREFERRED,
    VOLCANO_HIGHEST_TIER,
    VOLCANO_MODE,
    constraint_from_annotations,
)

T1, T2 = tier_level(1), tier_level(2)


def hn(
    name: str, tier: int, *members: dict[str, Any], tier_name: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"tier": tier, "members": list(members)}
    if tier_name:
        spec["tierName"] = tier_name
    return {"metadata": {"name": name}, "spec": spec}


def node(name: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"exactMatch": {"name": name}}}


def regex(pattern: str, kind: str = "Node") -> dict[str, Any]:
    return {"type": kind, "selector": {"regexMatch": {"pattern": pattern}}}


def child(name: str) -> dict[str, Any]:
    return {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}


# A spine s0 over two leaves: leaf-a by exact names, leaf-b by regex; leaf-c by labels.
TREE = [
    hn("leaf-a", 1, node("n0"), node("n1"), tier_name="leaf"),
    hn("leaf-b", 1, regex("^n[23]$"), tier_name="leaf"),
    hn(
        "leaf-c",
        1,
        {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "c"}}}},
    ),
    hn("s0", 2, regex("^leaf-[ab]$", "HyperNode"), tier_name="spine"),
    hn("s1", 2, child("leaf-c"), tier_name="spine"),
]


def index(objects: list[dict[str, Any]] = TREE) -> HyperNodeIndex:
    return HyperNodeIndex.build(hypernode_from(o) for o in objects)


def test_a_node_gets_the_hypernode_of_each_tier_holding_it() -> None:
    idx = index()
    assert idx.levels == (T1, T2)
    assert idx.tier_names == {"leaf": 1, "spine": 2}
    assert idx.labels_for("n0", {}) == {T1: "leaf-a", T2: "s0"}
    assert idx.labels_for("n3", {}) == {T1: "leaf-b", T2: "s0"}
    assert idx.labels_for("n9", {"rack": "c"}) == {T1: "leaf-c", T2: "s1"}
    # Go's regexp matches anywhere unless anchored; these are anchored.
    assert idx.labels_for("n22", {}) == {}
    assert idx.describe_tiers() == "tier 1 (leaf), tier 2 (spine)"


def test_a_cycle_of_hypernodes_ends_and_a_doubly_held_node_gets_the_first_by_name() -> None:
    idx = index(
        [
            hn("x", 2, child("y")),
            hn("y", 2, child("x"), node("n0")),
            hn("w", 1, node("n0")),
            hn("v", 1, node("n0")),
        ]
    )
    assert idx.labels_for("n0", {}) == {T1: "v", T2: "x"}


def test_conflicting_tier_names_are_reported() -> None:
    idx = index(
        [hn("a", 1, node("n0"), tier_name="leaf"), hn("b", 2, child("a"), tier_name="leaf")]
    )
    assert idx.tier_names == {"leaf": 1}
    assert any("tierName leaf" in p for p in idx.problems)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tier": -1}, "spec.tier must be an integer >= 0"),
        ({"tier": 1, "members": [{"type": "Node", "selector": {}}]}, "exactly one of"),
        ({"tier": 1, "members": [regex("(")]}, "regexMatch.pattern"),
        (
            {"tier": 2, "members": [{"type": "HyperNode", "selector": {"labelMatch": {}}}]},
            "exactly one of",
        ),
        (
            {
                "tier": 2,
                "members": [
                    {"type": "HyperNode", "selector": {"labelMatch": {"matchLabels": {"a": "b"}}}}
                ],
            },
            "labelMatch selects nodes only",
        ),
        ({"tier": 1, "members": [{"type": "Rack", "selector": {}}]}, "Node or HyperNode"),
    ],
)
def test_unusable_hypernodes_are_refused_naming_the_field(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(HyperNodeError, match=message):
        hypernode_from({"metadata": {"name": "bad"}, "spec": spec})


def test_label_expressions_select_nodes() -> None:
    idx = index(
        [
            hn(
                "gpu",
                1,
                {
                    "type": "Node",
                    "selector": {
                        "labelMatch": {
                            "matchExpressions": [
                                {"key": "gpu", "operator": "Exists"},
                                {"key": "rack", "operator": "NotIn", "values": ["r9"]},
                            ]
                        }
                    },
                },
            )
        ]
    )
    assert idx.labels_for("a", {"gpu": "h100", "rack": "r1"}) == {T1: "gpu"}
    assert idx.labels_for("b", {"gpu": "h100", "rack": "r9"}) == {}
    assert idx.labels_for("c", {"rack": "r1"}) == {}


def raw_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"allocatable": {"cpu": "4", "pods": "110"}},
    }


def test_state_relabels_nodes_as_hypernodes_come_change_and_go() -> None:
    state = ClusterState()
    heard: list[int] = []
    state.add_node_listener(lambda: heard.append(1))
    state.replace_nodes([raw_node("n0"), raw_node("n1")])
    assert state.nodes["n0"].labels == {"kubernetes.io/hostname": "n0"}
    state.replace_hypernodes(TREE[:2])
    assert state.nodes["n0"].labels[T1] == "leaf-a"
    assert state.topology_levels(DEFAULT_LEVELS) == (*DEFAULT_LEVELS, T1)
    # A node added later is labelled as it arrives.
    state.apply_node(raw_node("n2"))
    assert state.nodes["n2"].labels[T1] == "leaf-b"
    # A spine over both leaves appears: every node gains tier 2.
    before = len(heard)
    state.apply_hypernode(TREE[3])
    assert {n.labels[T2] for n in state.nodes.values()} == {"s0"}
    assert len(heard) == before + 1
    # The same object again changes nothing and tells nobody.
    state.apply_hypernode(TREE[3])
    assert len(heard) == before + 1
    # A broken update takes the hypernode out, with the reason kept.
    state.apply_hypernode(hn("s0", -1))
    assert T2 not in state.nodes["n0"].labels and "s0" in state.hypernode_errors
    state.delete_hypernode("leaf-a")
    assert state.nodes["n0"].labels == {"kubernetes.io/hostname": "n0"}
    assert state.nodes["n0"].own_labels == {"kubernetes.io/hostname": "n0"}
    state.replace_hypernodes([])
    assert state.topology_levels(DEFAULT_LEVELS) == DEFAULT_LEVELS


# ---- Volcano networkTopology over hypernode tiers -------------------------------------


def hard(tier: int | None = None, name: str | None = None) -> TopologyConstraint:
    return TopologyConstraint("", True, tier=tier, tier_name=name, origin="test")


def test_volcano_tiers_are_the_hypernode_tiers_when_there_are_any() -> None:
    levels = (*DEFAULT_LEVELS, T1, T2)
    names = {"leaf": 1, "spine": 2}
    assert levels_to_try(hard(1), levels, names) == ([T1], False)
    assert levels_to_try(hard(5), levels, names) == ([T1, T2], False)
    assert levels_to_try(hard(name="spine"), levels, names) == ([T1, T2], False)
    assert levels_to_try(hard(name="pod"), levels, names) == ([], False)
    soft = TopologyConstraint("", False, tier=1)
    assert levels_to_try(soft, levels, names) == ([T1, T2], True)
    # Without hypernodes a tier name is a configured level's short name.
    plain = ("kubernetes.io/hostname", "example.com/rack", "topology.kubernetes.io/zone")
    assert levels_to_try(hard(name="rack"), plain) == (["example.com/rack"], False)
    # A Kueue key never falls back into hypernode tiers.
    kueue = TopologyConstraint("topology.kubernetes.io/zone", False)
    assert levels_to_try(kueue, levels) == (["topology.kubernetes.io/zone"], True)


def bins(idx: HyperNodeIndex, free: dict[str, float]) -> list[Bin]:
    return [
        Bin(name, {"cpu": int(cores * 1000), "pods": 110}, idx.labels_for(name, {}))
        for name, cores in free.items()
    ]


def gang(members: int, cores: float) -> Gang:
    demands = tuple(Demand(f"g-{i}", {"cpu": int(cores * 1000), "pods": 1}) for i in range(members))
    return Gang("volcano:ml/g", 0, 0.0, demands, members)


def test_a_hard_tier_1_gang_lands_in_one_leaf_or_is_short_naming_the_hypernode_tier() -> None:
    idx = index()
    free = bins(idx, {"n0": 4, "n1": 4, "n2": 4, "n3": 1})
    levels = (*DEFAULT_LEVELS, *idx.levels)
    placed = place(
        gang(2, 3), Where(hard(1), levels, tier_names=idx.tier_names), Contest(free), 0.0, 60.0
    )
    assert placed.decision.verdict is Ruling.ADMIT and placed.domain is not None
    assert placed.domain.value == "leaf-a"
    assert set(placed.decision.plan.values()) == {"n0", "n1"}
    # Three members of 3 CPUs: no leaf holds them, though the spine would.
    short = place(
        gang(3, 3), Where(hard(1), levels, tier_names=idx.tier_names), Contest(free), 0.0, 60.0
    )
    assert short.decision.verdict is Ruling.SHORT and short.no_domain
    assert "in one tier-1 hypernode" in short.decision.message
    assert "stays pending" in short.decision.message
    unnamed = place(
        gang(2, 1),
        Where(hard(name="pod"), levels, tier_names=idx.tier_names),
        Contest(free),
        0.0,
        60.0,
    )
    assert "highestTierName pod names no tier" in unnamed.decision.message


def test_a_node_outside_the_hypernode_is_told_which_it_is_in() -> None:
    domain = Domain(T1, "leaf-a")
    assert domain.describe() == "tier-1 hypernode leaf-a"
    text = domain_message("volcano:ml/g", domain, hard(1), None)
    assert text.endswith("this node is in no tier-1 hypernode")
    assert tier_of(T2) == 2 and tier_of("example.com/rack") is None


def test_a_burst_of_hypernode_events_relabels_the_nodes_once() -> None:
    state = ClusterState()
    heard: list[int] = []
    state.add_node_listener(lambda: heard.append(1))
    state.replace_nodes([raw_node("n0"), raw_node("n2")])
    heard.clear()
    for raw in TREE:
        state.apply_hypernode(raw, relabel=False)
    state.delete_hypernode("s1", relabel=False)
    assert T1 not in state.nodes["n0"].labels and not heard
    state.relabel_hypernodes()
    assert state.nodes["n0"].labels[T2] == "s0" and state.nodes["n2"].labels[T1] == "leaf-b"
    assert len(heard) == 1 and "s1" not in state.hypernodes.hypernodes
    state.relabel_hypernodes()  # nothing new: nobody told
    assert len(heard) == 1


def test_volcano_network_topology_annotations_on_pods() -> None:
    hard = constraint_from_annotations({VOLCANO_HIGHEST_TIER: "2"}, "pod")
    assert hard is not None and hard.required and hard.tier == 2 and not hard.key
    soft = constraint_from_annotations({VOLCANO_MODE: "soft"}, "pod")
    assert soft is not None and not soft.required and soft.tier == 1
    # Kueue's annotations win when a pod carries both.
    both = constraint_from_annotations({VOLCANO_MODE: "hard", KUEUE_PREFERRED: "rack"}, "pod")
    assert both is not None and both.key == "rack"
    with pytest.raises(TopologyError, match="must be hard or soft"):
        constraint_from_annotations({VOLCANO_MODE: "strict"}, "pod")
    with pytest.raises(TopologyError, match="integer >= 1"):
        constraint_from_annotations({VOLCANO_HIGHEST_TIER: "zero"}, "pod")
