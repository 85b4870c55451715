"""LeaderWorkerSet replicas as gangs, the pure part: labels read, the tree built and placed."""

from __future__ import annotations

import re

import pytest

from app.core.contention import Contest, Gang, Ruling
from app.core.group_rules import spec_from_labels
from app.core.groups import (
    ALL_SOURCES,
    SOURCE_LWS,
    GroupLabelError,
    group_ref_of_pod,
)
from app.core.lws import (
    LWS_EXCLUSIVE_ANNOTATION,
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_STARTUP_POLICY_ANNOTATION,
    LWS_SUBGROUP_EXCLUSIVE_ANNOTATION,
    LWS_SUBGROUP_INDEX_LABEL,
    LWS_SUBGROUP_SIZE_ANNOTATION,
)
from app.core.marking import names_a_group
from app.core.packing import Bin, Demand
from app.core.records import PodRecord
from app.core.topology.domains import TopologyConstraint, Where, levels_to_try
from app.core.topology.subgroups import GangShape, GangTree, Member, tree_of
from app.core.topology.tree import TreePlaced as Placed
from app.core.topology.tree import place_tree

HOST = "kubernetes.io/hostname"
RACK = "example.com/rack"
BLOCK = "example.com/block"
LEVELS = (HOST, RACK, BLOCK)
WITH_LWS = ALL_SOURCES | {SOURCE_LWS}


def lws_meta(
    index: int = 0,
    worker: int = 0,
    size: str = "4",
    annotations: dict[str, str] | None = None,
    subgroup: int | None = None,
) -> dict[str, object]:
    """A pod's metadata as LWS's controller and pod webhook leave it."""
    labels = {
        LWS_NAME_LABEL: "infer",
        LWS_GROUP_INDEX_LABEL: str(index),
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
    }
    if subgroup is not None:
        labels[LWS_SUBGROUP_INDEX_LABEL] = str(subgroup)
    return {
        "name": f"infer-{index}-{worker}",
        "labels": labels,
        "annotations": {LWS_SIZE_ANNOTATION: size, **(annotations or {})},
    }


def test_a_replica_is_a_gang_of_its_size_keyed_by_set_and_index() -> None:
    ref = group_ref_of_pod("ml", lws_meta(index=1, worker=2), {}, WITH_LWS)
    assert ref is not None and ref.key == "lws:ml/infer-1" and ref.source == SOURCE_LWS
    spec = spec_from_labels(ref, _no_pods)
    assert spec.min_member == 4 and spec.topology is None and spec.sub_group_policy == ()


def test_the_source_is_opt_in_and_the_webhook_marks_only_when_asked() -> None:
    meta = lws_meta()
    assert group_ref_of_pod("ml", meta, {}, ALL_SOURCES) is None
    assert not names_a_group({"metadata": meta})
    assert names_a_group({"metadata": meta}, (LWS_NAME_LABEL,))


def test_a_volcano_group_name_on_an_lws_pod_wins() -> None:
    meta = lws_meta(annotations={"scheduling.k8s.io/group-name": "infer-0-abc"})
    ref = group_ref_of_pod("ml", meta, {}, WITH_LWS)
    assert ref is not None and ref.source == "volcano"


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        (lws_meta(size="four"), "annotation leaderworkerset.sigs.k8s.io/size must be a whole"),
        (lws_meta(size="0"), "must be a whole number >= 1, got '0'"),
        (lws_meta(size="٣"), "must be a whole number"),
        (
            {"labels": {LWS_NAME_LABEL: "infer"}, "annotations": {LWS_SIZE_ANNOTATION: "2"}},
            "label leaderworkerset.sigs.k8s.io/group-index must be the replica's index",
        ),
        (
            lws_meta(annotations={LWS_SUBGROUP_SIZE_ANNOTATION: "8"}),
            "subgroup-size=8 is larger than the group's size 4",
        ),
        (
            lws_meta(annotations={LWS_STARTUP_POLICY_ANNOTATION: "Eventually"}),
            "must be LeaderCreated or LeaderReady",
        ),
        (lws_meta(annotations={LWS_EXCLUSIVE_ANNOTATION: ""}), "must name a node label key"),
    ],
)
def test_bad_lws_labels_turn_the_pod_away_with_the_fix(meta: dict[str, object], words: str) -> None:
    with pytest.raises(GroupLabelError, match=re.escape(words)):
        group_ref_of_pod("ml", meta, {}, WITH_LWS)


def test_leader_ready_starts_the_leader_alone_as_lws_volcano_provider_does() -> None:
    meta = lws_meta(annotations={LWS_STARTUP_POLICY_ANNOTATION: "LeaderReady"})
    ref = group_ref_of_pod("ml", meta, {}, WITH_LWS)
    assert ref is not None and spec_from_labels(ref, _no_pods).min_member == 1


def test_exclusive_topology_is_a_required_level_for_the_replica_and_sub_group() -> None:
    meta = lws_meta(
        annotations={
            LWS_EXCLUSIVE_ANNOTATION: BLOCK,
            LWS_SUBGROUP_SIZE_ANNOTATION: "2",
            LWS_SUBGROUP_EXCLUSIVE_ANNOTATION: RACK,
        },
        subgroup=0,
    )
    ref = group_ref_of_pod("ml", meta, {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, _no_pods)
    assert spec.topology is not None and spec.topology.key == BLOCK and spec.topology.required
    (policy,) = spec.sub_group_policy
    assert policy.size == 2 and policy.constraint is not None and policy.constraint.key == RACK
    assert "exclusive-topology" in spec.topology.describe()


def racks(free: dict[str, int], block_of: dict[str, str]) -> list[Bin]:
    """Per rack, that many 1-CPU nodes, in the rack's block."""
    bins = []
    for rack, count in free.items():
        for i in range(count):
            name = f"{rack}-n{i}"
            labels = {HOST: name, RACK: rack, BLOCK: block_of[rack]}
            bins.append(Bin(name, {"cpu": 1000, "pods": 110_000}, labels))
    return bins


def racks_placed(
    key: str, members: list[str], tree: GangTree, where: TopologyConstraint, bins: list[Bin]
) -> tuple[Placed, dict[str, str]]:
    """place_tree() for 1-CPU members: its answer (admitted) and each member's rack."""
    demands = tuple(Demand(m, {"cpu": 1000, "pods": 1000}) for m in members)
    placed = place_tree(
        Gang(key, 0, 0.0, demands, len(members)),
        Where(where, LEVELS),
        tree,
        Contest(bins),
        0.0,
        60.0,
        lambda c: levels_to_try(c, LEVELS),
    )
    assert placed.decision.verdict is Ruling.ADMIT, placed.decision.message
    rack_of = {b.name: b.labels[RACK] for b in bins}
    return placed, {k: rack_of[n] for k, n in dict(placed.decision.plan).items()}


def test_lws_sub_groups_each_land_in_one_rack_inside_the_replicas_block() -> None:
    """Size 4 in sub-groups of 2: block b1 has racks of 2 (b0 has 3 + 1, more room per rack
    in one but no two racks of 2), so the replica goes to b1, one sub-group per rack."""
    annotations = {
        LWS_EXCLUSIVE_ANNOTATION: BLOCK,
        LWS_SUBGROUP_SIZE_ANNOTATION: "2",
        LWS_SUBGROUP_EXCLUSIVE_ANNOTATION: RACK,
    }
    metas = [lws_meta(worker=w, annotations=annotations, subgroup=w // 2) for w in range(4)]
    ref = group_ref_of_pod("ml", metas[0], {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, _no_pods)
    members = [Member(f"ml/{m['name']}", labels=m["labels"]) for m in metas]  # type: ignore[arg-type]
    tree = tree_of(spec.key, GangShape(policies=spec.sub_group_policy), 4, members)
    assert tree is not None
    assert [g.path for g in tree.groups] == [("subgroup-0",), ("subgroup-1",)]
    bins = racks(
        {"r0": 3, "r1": 1, "r2": 2, "r3": 2}, {"r0": "b0", "r1": "b0", "r2": "b1", "r3": "b1"}
    )
    assert spec.topology is not None
    placed, where = racks_placed(spec.key, [m.key for m in members], tree, spec.topology, bins)
    assert placed.domain is not None and placed.domain.value == "b1"
    assert where["ml/infer-0-0"] == where["ml/infer-0-1"] != where["ml/infer-0-2"]
    assert where["ml/infer-0-2"] == where["ml/infer-0-3"]


def test_leader_excluded_leader_belongs_to_no_sub_group() -> None:
    annotations = {LWS_SUBGROUP_SIZE_ANNOTATION: "2"}
    metas = [lws_meta(worker=0, size="3", annotations=annotations)] + [
        lws_meta(worker=w, size="3", annotations=annotations, subgroup=0) for w in (1, 2)
    ]
    ref = group_ref_of_pod("ml", metas[0], {}, WITH_LWS)
    assert ref is not None
    spec = spec_from_labels(ref, _no_pods)
    members = [Member(f"ml/{m['name']}", labels=m["labels"]) for m in metas]  # type: ignore[arg-type]
    tree = tree_of(spec.key, GangShape(policies=spec.sub_group_policy), 3, members)
    assert tree is not None and "ml/infer-0-0" not in tree.paths
    assert tree.paths["ml/infer-0-1"] == ("subgroup-0",)


def _no_pods(key: str) -> list[PodRecord]:
    """The pods of a group by key: an LWS replica's spec is its own pod's, none needed."""
    return []
