"""KAI's v2alpha2 PodGroup and YuniKorn's task groups: read into the one gang tree."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.contention import Contest, Gang, Ruling
from app.core.group_rules import (
    describe_task_shortfall,
    role_problem,
    spec_from_kai,
    spec_from_yunikorn,
)
from app.core.groups import (
    SOURCE_KAI,
    SOURCE_YUNIKORN,
    GroupRef,
    PodGroupSpecError,
    group_ref_of_pod,
)
from app.core.kai import (
    KAI_GROUP_ANNOTATION,
    KAI_SUBGROUP_LABEL,
)
from app.core.marking import member_expression, names_a_group
from app.core.packing import Bin, Demand
from app.core.records import pod_record_from
from app.core.topology.domains import TopologyError, levels_to_try
from app.core.topology.subgroups import GangShape, Member, tree_of
from app.core.topology.tree import place_tree
from app.core.yunikorn import (
    TASK_GROUP_NAME_ANNOTATION,
    TASK_GROUPS_ANNOTATION,
    TaskGroupsError,
    task_groups,
)
from tests.unit.builders import cluster, pod

HOST = "kubernetes.io/hostname"
RACK = "example.com/rack"
BLOCK = "example.com/block"
KEY = "kai:ml/infer"


def kai_pg(sub_groups: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"minMember": 10, "queue": "team-a", "subGroups": sub_groups, **spec}


def rack(name: str, required: bool = True) -> dict[str, str]:
    level = "requiredTopologyLevel" if required else "preferredTopologyLevel"
    return {"topology": "cluster-topology", level: name}


# ---- KAI: reading ----------------------------------------------------------------------


def test_kai_sub_groups_become_a_tree_whose_leaves_carry_the_minimums() -> None:
    spec = spec_from_kai(
        KEY,
        kai_pg(
            [
                {"name": "decode"},
                {"name": "decode-leader", "parent": "decode", "minMember": 1},
                {
                    "name": "decode-workers",
                    "parent": "decode",
                    "minMember": 4,
                    "topologyConstraint": rack(RACK),
                },
                {"name": "prefill", "minMember": 0},
            ],
            topologyConstraint=rack(BLOCK),
            priorityClassName="high",
        ),
    )
    assert spec.source == SOURCE_KAI and spec.queue == "team-a"
    assert spec.priority_class_name == "high"
    # KAI: minMember is not used once subGroups exist; a leaf's 0 reads as 1.
    assert spec.min_member == 1 + 4 + 1
    assert spec.min_task_member == (("decode-leader", 1), ("decode-workers", 4), ("prefill", 1))
    assert [(g.path, g.min_member) for g in spec.sub_groups] == [
        (("decode",), 0),
        (("prefill",), 1),
        (("decode", "decode-leader"), 1),
        (("decode", "decode-workers"), 4),
    ]
    workers = spec.sub_groups[3].constraint
    assert workers is not None and workers.key == RACK and workers.required
    assert spec.topology is not None and spec.topology.key == BLOCK


def test_kai_topology_without_a_topology_name_is_ignored_and_preferred_is_read() -> None:
    spec = spec_from_kai(
        KEY, {"minMember": 3, "topologyConstraint": {"requiredTopologyLevel": RACK}}
    )
    assert spec.topology is None and spec.min_member == 3 and not spec.sub_groups
    spec = spec_from_kai(KEY, {"minMember": 3, "topologyConstraint": rack(RACK, required=False)})
    assert spec.topology is not None and not spec.topology.required


@pytest.mark.parametrize(
    ("sub_groups", "words"),
    [
        ([{"name": "a"}, {"name": "a"}], "spec.subGroups names a twice"),
        ([{"name": "a", "parent": "x"}], "sub-group a names parent x, which spec.subGroups"),
        (
            [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
            "spec.subGroups parents form a cycle",
        ),
        ([{"minMember": 2}], "spec.subGroups[0].name must name the sub-group"),
        ([{"name": "a", "minMember": -1}], "spec.subGroups[0].minMember must be an integer"),
    ],
)
def test_bad_kai_sub_groups_name_the_field(sub_groups: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(PodGroupSpecError, match="PodGroup kai:ml/infer") as err:
        spec_from_kai(KEY, kai_pg(sub_groups))
    assert words in str(err.value)


def test_a_kai_pod_names_its_podgroup_by_annotation_and_its_sub_group_by_label() -> None:
    meta = {
        "annotations": {KAI_GROUP_ANNOTATION: "infer"},
        "labels": {KAI_SUBGROUP_LABEL: "decode-workers"},
    }
    ref = group_ref_of_pod("ml", meta, {})
    assert ref is not None and ref.key == KEY and ref.task == "decode-workers"
    assert group_ref_of_pod("ml", meta, {}, sources=("x-k8s",)) is None


# ---- KAI: the tree ---------------------------------------------------------------------


def two_rack_groups() -> tuple[Any, list[Member]]:
    spec = spec_from_kai(
        KEY,
        kai_pg(
            [
                {"name": "a", "minMember": 3, "topologyConstraint": rack(RACK)},
                {"name": "b", "minMember": 3, "topologyConstraint": rack(RACK)},
            ]
        ),
    )
    members = [Member(f"ml/{g}{i}", task=g) for g in "ab" for i in range(3)]
    return spec, members


def test_a_member_naming_an_unknown_or_inner_sub_group_holds_the_gang_with_its_name() -> None:
    spec = spec_from_kai(KEY, kai_pg([{"name": "top"}, {"name": "leaf", "parent": "top"}]))
    shape = GangShape(named=spec.sub_groups)
    with pytest.raises(TopologyError, match="names sub-group 'nope', which the PodGroup does not"):
        tree_of(KEY, shape, 1, [Member("ml/p", task="nope")])
    with pytest.raises(TopologyError, match="'top', which has sub-groups of its own"):
        tree_of(KEY, shape, 1, [Member("ml/p", task="top")])
    with pytest.raises(TopologyError, match=r"names no sub-group; .* \(leaf\)"):
        tree_of(KEY, shape, 1, [Member("ml/p")])


def test_kai_sub_groups_each_required_in_a_rack_land_each_whole_in_one() -> None:
    spec, members = two_rack_groups()
    tree = tree_of(KEY, GangShape(named=spec.sub_groups), spec.min_member, members)
    assert tree is not None and tree.paths["ml/b2"] == ("b",)
    bins = [
        Bin(f"{r}-n{i}", {"cpu": 1000, "pods": 110_000}, {HOST: f"{r}-n{i}", RACK: r})
        for r in ("r0", "r1")
        for i in range(4)
    ]
    demands = tuple(Demand(m.key, {"cpu": 1000, "pods": 1000}) for m in members)
    placed = place_tree(
        Gang(KEY, 0, 0.0, demands, 6),
        None,
        tree,
        Contest(bins),
        0.0,
        60.0,
        lambda c: levels_to_try(c, (HOST, RACK)),
    )
    assert placed.decision.verdict is Ruling.ADMIT
    rack_of = {b.name: b.labels[RACK] for b in bins}
    where = {k: rack_of[n] for k, n in dict(placed.decision.plan).items()}
    assert len({where[f"ml/a{i}"] for i in range(3)}) == 1
    assert len({where[f"ml/b{i}"] for i in range(3)}) == 1
    assert where["ml/a0"] != where["ml/b0"]


def test_a_kai_leaf_short_of_its_minimum_is_named_in_kais_words() -> None:
    spec, _ = two_rack_groups()
    message = describe_task_shortfall(spec, [("b", 1, 3)])
    assert message.startswith(f"cannot find enough sibling pods per sub-group for group {KEY}")
    assert "sub-group b: 1 of 3" in message and KAI_SUBGROUP_LABEL in message


# ---- YuniKorn --------------------------------------------------------------------------

GROUPS = [
    {"name": "driver", "minMember": 1, "minResource": {"cpu": "1"}},
    {"NAME": "executor", "minmember": 2, "minResource": {"cpu": "1", "memory": "1Gi"}},
]


def yk_pod(name: str, task: str, *, groups: str | None = None, created: str = "") -> dict[str, Any]:
    raw = pod(name, namespace="ml")
    raw["metadata"]["labels"]["applicationId"] = "etl-42"
    annotations = {TASK_GROUP_NAME_ANNOTATION: task}
    if groups is not None:
        annotations[TASK_GROUPS_ANNOTATION] = groups
    raw["metadata"]["annotations"] = annotations
    if created:
        raw["metadata"]["creationTimestamp"] = created
    return raw


def test_task_groups_are_read_as_go_reads_them_keys_in_any_case() -> None:
    assert task_groups(json.dumps(GROUPS)) == (("driver", 1), ("executor", 2))


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("[{", "is not valid JSON"),
        ("{}", "must be a non-empty JSON list"),
        ('[{"minMember": 1, "minResource": {}}]', "entry 0 needs a non-empty name"),
        ('[{"name": "a", "minMember": 0, "minResource": {}}]', "task group a needs minMember"),
        ('[{"name": "a", "minMember": 1}]', "task group a needs minResource"),
        ('[{"name": "a", "minMember": 1, "minResource": {"cpu": "x"}}]', "minResource"),
        (
            '[{"name": "a", "minMember": 1, "minResource": {}},'
            ' {"name": "a", "minMember": 1, "minResource": {}}]',
            "names task group a twice",
        ),
    ],
)
def test_bad_task_groups_say_what_to_fix(raw: str, words: str) -> None:
    with pytest.raises(TaskGroupsError, match=TASK_GROUPS_ANNOTATION) as err:
        task_groups(raw)
    assert words in str(err.value)


def test_a_yunikorn_gang_takes_the_task_groups_of_its_oldest_declaring_pod() -> None:
    state = cluster()
    other = json.dumps([{"name": "solo", "minMember": 5, "minResource": {"cpu": "1"}}])
    state.apply_pod(yk_pod("e0", "executor", groups=other, created="2026-01-01T00:00:02Z"))
    state.apply_pod(
        yk_pod("d", "driver", groups=json.dumps(GROUPS), created="2026-01-01T00:00:01Z")
    )
    state.apply_pod(yk_pod("e1", "executor", created="2026-01-01T00:00:00Z"))
    ref = state.members("yunikorn:ml/etl-42")[0].group
    assert ref is not None and ref.source == SOURCE_YUNIKORN
    spec = state.group_spec(ref)
    assert spec.min_member == 3
    assert spec.min_task_member == (("driver", 1), ("executor", 2))
    message = describe_task_shortfall(spec, [("executor", 1, 2)])
    assert "per task group for group yunikorn:ml/etl-42" in message
    assert TASK_GROUP_NAME_ANNOTATION in message


def test_malformed_task_groups_on_the_declaring_pod_hold_the_whole_gang() -> None:
    state = cluster()
    state.apply_pod(yk_pod("d", "driver", groups="[{", created="2026-01-01T00:00:00Z"))
    state.apply_pod(yk_pod("e0", "executor", created="2026-01-01T00:00:01Z"))
    for member in state.members("yunikorn:ml/etl-42"):
        assert member.group is not None
        with pytest.raises(PodGroupSpecError, match="is not valid JSON"):
            state.group_spec(member.group)


def test_a_yunikorn_gang_with_no_declaring_pod_or_no_app_id_is_told_how_to_fix() -> None:
    state = cluster()
    state.apply_pod(yk_pod("e0", "executor"))
    (member,) = state.members("yunikorn:ml/etl-42")
    assert member.group is not None
    with pytest.raises(PodGroupSpecError, match="no member carries the annotation"):
        state.group_spec(member.group)
    raw = yk_pod("lost", "executor")
    del raw["metadata"]["labels"]["applicationId"]
    lost = pod_record_from(raw)
    assert lost.group is None and "no application id" in (lost.group_error or "")


def test_task_group_members_are_roles_of_the_tree() -> None:
    members = [Member("ml/d", task="driver"), Member("ml/e0", task="executor")]
    tree = tree_of(
        "yunikorn:ml/etl-42", GangShape(roles=(("driver", 1), ("executor", 2))), 3, members
    )
    assert tree is not None and tree.paths == {"ml/d": ("driver",), "ml/e0": ("executor",)}


# ---- marking ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "annotation", [KAI_GROUP_ANNOTATION, TASK_GROUPS_ANNOTATION, TASK_GROUP_NAME_ANNOTATION]
)
def test_the_new_sources_members_are_marked(annotation: str) -> None:
    assert names_a_group({"metadata": {"annotations": {annotation: "x"}}})
    assert f"'{annotation}' in object.metadata.annotations" in member_expression()["isMember"]


def test_a_member_naming_a_role_its_gang_lacks_is_a_problem_for_every_member() -> None:
    spec, _ = two_rack_groups()
    assert role_problem(spec, "ml/a0", "a") is None
    assert "names sub-group 'c'" in (role_problem(spec, "ml/c0", "c") or "")
    yk = spec_from_yunikorn(
        "yunikorn:ml/etl", GroupRef("ml", "etl", 1, SOURCE_YUNIKORN, "", (("driver", 1),))
    )
    assert role_problem(yk, "ml/d", "driver") is None and role_problem(yk, "ml/x", "") is None
    problem = role_problem(yk, "ml/x", "execotor") or ""
    assert "names task group 'execotor'" in problem and "does not declare (driver)" in problem
