"""Gangs made of groups, the pure part: slices and roles read, chosen and placed."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.contention import Contest, Gang, Holder, Ruling
from app.core.group_specs import spec_from_volcano
from app.core.groups import (
    VOLCANO_GROUP_ANNOTATIONS,
    VOLCANO_TASK_ANNOTATION,
    PodGroupSpecError,
    group_ref_of_pod,
)
from app.core.packing import Bin, Demand
from app.core.topology.domains import TopologyConstraint, TopologyError, Where, levels_to_try
from app.core.topology.sources import (
    JOB_COMPLETION_INDEX,
    KUEUE_POD_INDEX,
    KUEUE_POD_INDEX_LABEL,
    KUEUE_SLICE_CONSTRAINTS,
    KUEUE_SLICE_REQUIRED,
    KUEUE_SLICE_SIZE,
    rank_of,
    slices_from_annotations,
)
from app.core.topology.subgroups import GangShape, GangTree, Member, Slicing, tree_of
from app.core.topology.tree import by_key, choose, pack_tree, place_tree

HOST = "kubernetes.io/hostname"
RACK = "example.com/rack"
BLOCK = "example.com/block"
LEVELS = (HOST, RACK, BLOCK)


def cpu(cores: float) -> dict[str, int]:
    return {"cpu": int(cores * 1000), "pods": 1000}


def racks(free: dict[str, list[float]], block_of: dict[str, str] | None = None) -> list[Bin]:
    """One bin per entry of free[rack]: that many free CPUs on that node."""
    bins = []
    for rack, nodes in free.items():
        for i, cores in enumerate(nodes):
            name = f"{rack}-n{i}"
            labels = {HOST: name, RACK: rack, BLOCK: (block_of or {}).get(rack, "b0")}
            bins.append(Bin(name, {"cpu": int(cores * 1000), "pods": 110_000}, labels))
    return bins


def slices_gang(
    key: str, count: int, layers: tuple[tuple[str, int], ...], cores: float = 1.0
) -> tuple[Gang, GangTree]:
    slicing = Slicing(layers, "test")
    members = [Member(f"{key}-{i}", rank=i) for i in range(count)]
    tree = tree_of(key, GangShape(slicing), count, members)
    assert tree is not None
    demands = tuple(Demand(m.key, cpu(cores)) for m in members)
    return Gang(key, 0, 0.0, demands, count), tree


def racks_of(plan: dict[str, str], bins: list[Bin], level: str = RACK) -> dict[str, str]:
    labels = {b.name: b.labels for b in bins}
    return {key: labels[node][level] for key, node in plan.items()}


# ---- reading --------------------------------------------------------------------------


def test_a_rank_past_the_last_whole_slice_belongs_to_none_as_in_kueue() -> None:
    slicing = Slicing(((RACK, 3),))
    assert [slicing.path(r, 7) for r in range(7)] == [
        ("rack-0",),
        ("rack-0",),
        ("rack-0",),
        ("rack-1",),
        ("rack-1",),
        ("rack-1",),
        (),
    ]
    assert slicing.path(None, 7) == ()
    nested = Slicing(((BLOCK, 8), (RACK, 4)))
    assert nested.path(5, 16) == ("block-0", "rack-1")
    assert nested.path(12, 16) == ("block-1", "rack-3")


def test_kueue_slice_annotations_one_layer_and_the_json_list() -> None:
    one = {KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "4"}
    assert slices_from_annotations(one, "pod") == ((RACK, 4),)
    listed = json.dumps([{"topology": BLOCK, "size": 8}, {"topology": RACK, "size": 4}])
    assert slices_from_annotations({KUEUE_SLICE_CONSTRAINTS: listed}, "pod") == (
        (BLOCK, 8),
        (RACK, 4),
    )
    assert slices_from_annotations({}, "pod") == ()
    assert slices_from_annotations(None, "pod") == ()


@pytest.mark.parametrize(
    ("annotations", "words"),
    [
        ({KUEUE_SLICE_SIZE: "4"}, "needs kueue.x-k8s.io/podset-slice-required-topology"),
        ({KUEUE_SLICE_REQUIRED: RACK}, "needs kueue.x-k8s.io/podset-slice-size"),
        ({KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "0"}, "whole number >= 1"),
        ({KUEUE_SLICE_REQUIRED: RACK, KUEUE_SLICE_SIZE: "four"}, "whole number >= 1"),
        ({KUEUE_SLICE_REQUIRED: "a b", KUEUE_SLICE_SIZE: "4"}, "node label key"),
        ({KUEUE_SLICE_CONSTRAINTS: "[{"}, "not valid JSON"),
        ({KUEUE_SLICE_CONSTRAINTS: "{}"}, "JSON list of 1 to 3"),
        ({KUEUE_SLICE_CONSTRAINTS: "[]"}, "JSON list of 1 to 3"),
        ({KUEUE_SLICE_CONSTRAINTS: "[1]"}, "entry 0 must be an object"),
        (
            {KUEUE_SLICE_CONSTRAINTS: json.dumps([{"topology": BLOCK, "size": 8}] * 2)},
            "names example.com/block twice",
        ),
        (
            {
                KUEUE_SLICE_CONSTRAINTS: json.dumps(
                    [{"topology": BLOCK, "size": 8}, {"topology": RACK, "size": 3}]
                )
            },
            "must divide the size 8",
        ),
        (
            {KUEUE_SLICE_CONSTRAINTS: "[]", KUEUE_SLICE_SIZE: "2"},
            "cannot be combined",
        ),
    ],
)
def test_bad_slice_annotations_say_what_to_fix(annotations: dict[str, str], words: str) -> None:
    with pytest.raises(TopologyError, match=words):
        slices_from_annotations(annotations, "pod")


def test_a_slice_larger_than_the_gang_is_refused() -> None:
    with pytest.raises(TopologyError, match="slice size must be at most the gang's size"):
        tree_of("ml/a", GangShape(Slicing(((RACK, 8),), "annotation")), 6, [])


def test_the_rank_comes_from_kueue_labels_or_the_job_index() -> None:
    assert rank_of({KUEUE_POD_INDEX: "3"}, {}) == 3
    assert rank_of({"app/idx": "5"}, {KUEUE_POD_INDEX_LABEL: "app/idx"}) == 5
    assert rank_of({}, {JOB_COMPLETION_INDEX: "2"}) == 2
    assert rank_of({KUEUE_POD_INDEX: "x"}, {}) is None
    assert rank_of(None, None) is None


# ---- placing --------------------------------------------------------------------------


def test_slices_of_three_on_racks_of_four_free_land_three_and_three_never_four_and_two() -> None:
    bins = racks({"r0": [1, 1, 1, 1], "r1": [1, 1, 1, 1]})
    gang, tree = slices_gang("ml/s", 6, ((RACK, 3),))
    placed = place_tree(gang, None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    where = racks_of(dict(placed.decision.plan), bins)
    assert len(where) == 6
    first = {where[f"ml/s-{i}"] for i in range(3)}
    second = {where[f"ml/s-{i}"] for i in range(3, 6)}
    assert len(first) == 1 and len(second) == 1 and first != second
    assert set(placed.groups) == {("rack-0",), ("rack-1",)}


def test_slices_go_to_racks_inside_one_block_when_another_has_more_room_but_not_per_rack() -> None:
    # Block b0: two racks of 4 free. Block b1: three racks of 3 free (9 in all, more than 8).
    free: dict[str, list[float]] = {"r0": [1] * 4, "r1": [1] * 4}
    free |= {"r2": [1] * 3, "r3": [1] * 3, "r4": [1] * 3}
    bins = racks(free, {"r0": "b0", "r1": "b0", "r2": "b1", "r3": "b1", "r4": "b1"})
    gang, tree = slices_gang("ml/big", 8, ((RACK, 4),))
    where = Where(TopologyConstraint(BLOCK, True), LEVELS)
    placed = place_tree(gang, where, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    assert placed.domain is not None and placed.domain.value == "b0"
    assert set(racks_of(dict(placed.decision.plan), bins, BLOCK).values()) == {"b0"}
    assert {d.value for d in placed.groups.values()} == {"r0", "r1"}


def test_a_block_tried_first_whose_racks_cannot_hold_a_slice_is_passed_over() -> None:
    # Block b1 (racks of 3, 3, 2: 8 free, none to spare) comes first, fullest first; block b0
    # (racks of 4, 4, 1) holds the two slices of 4.
    free: dict[str, list[float]] = {"r0": [1] * 4, "r1": [1] * 4, "r2": [1]}
    free |= {"r3": [1] * 3, "r4": [1] * 3, "r5": [1] * 2}
    blocks = {"r0": "b0", "r1": "b0", "r2": "b0", "r3": "b1", "r4": "b1", "r5": "b1"}
    bins = racks(free, blocks)
    gang, tree = slices_gang("ml/big", 8, ((RACK, 4),))
    where = Where(TopologyConstraint(BLOCK, True), LEVELS)
    placed = place_tree(gang, where, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    assert placed.domain is not None and placed.domain.value == "b0"
    assert {d.value for d in placed.groups.values()} == {"r0", "r1"}


def test_the_fullest_rack_that_holds_a_slice_is_taken_so_an_empty_rack_stays_empty() -> None:
    bins = racks({"r0": [1] * 8, "r1": [1] * 4, "r2": [1] * 4})
    gang, tree = slices_gang("ml/s", 8, ((RACK, 4),))
    placed = place_tree(gang, None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    assert {d.value for d in placed.groups.values()} == {"r1", "r2"}


def test_no_rack_holding_a_slice_holds_the_gang_with_the_slice_named() -> None:
    bins = racks({"r0": [1, 1], "r1": [1, 1], "r2": [1, 1]})
    gang, tree = slices_gang("ml/s", 6, ((RACK, 3),))
    placed = place_tree(gang, None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.SHORT
    assert placed.groups == {}
    message = placed.decision.message
    assert "slice rack-" in message and "whole in one rack" in message, message


def test_nested_slices_put_rack_slices_inside_their_block_slice() -> None:
    free: dict[str, list[float]] = {f"r{i}": [1] * 4 for i in range(4)}
    bins = racks(free, {"r0": "b0", "r1": "b1", "r2": "b0", "r3": "b1"})
    gang, tree = slices_gang("ml/n", 16, ((BLOCK, 8), (RACK, 4)))
    placed = place_tree(gang, None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    plan = dict(placed.decision.plan)
    blocks, in_racks = racks_of(plan, bins, BLOCK), racks_of(plan, bins)
    for block in range(2):
        assert len({blocks[f"ml/n-{i}"] for i in range(block * 8, block * 8 + 8)}) == 1
    for rack in range(4):
        assert len({in_racks[f"ml/n-{i}"] for i in range(rack * 4, rack * 4 + 4)}) == 1


def test_remainder_pods_of_a_size_that_does_not_divide_go_anywhere() -> None:
    bins = racks({"r0": [1, 1, 1], "r1": [1, 1, 1], "r2": [1]})
    gang, tree = slices_gang("ml/r", 7, ((RACK, 3),))
    assert "ml/r-6" not in tree.paths
    placed = place_tree(gang, None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    assert racks_of(dict(placed.decision.plan), bins)["ml/r-6"] == "r2"


def test_a_restarted_member_goes_back_to_its_slice_rack() -> None:
    bins = racks({"r0": [1, 1, 1, 1], "r1": [1, 1, 1, 1]})
    slicing = Slicing(((RACK, 2),), "test")
    members = [
        Member("ml/p-0", 0, node="r1-n0"),
        Member("ml/p-1", 1),
        Member("ml/p-2", 2),
        Member("ml/p-3", 3),
    ]
    tree = tree_of("ml/p", GangShape(slicing), 4, members)
    assert tree is not None
    demands = tuple(Demand(m.key, cpu(1)) for m in members[1:])
    placed = place_tree(Gang("ml/p", 0, 0.0, demands, 3), None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.ADMIT
    assert racks_of(dict(placed.decision.plan), bins)["ml/p-1"] == "r1"
    assert placed.groups[("rack-0",)].value == "r1"


def test_a_role_that_fits_no_node_holds_the_gang_and_is_named() -> None:
    bins = racks({"r0": [4, 4]})
    members = [Member("ml/big-head", task="head"), Member("ml/big-w0", task="worker")]
    tree = tree_of("ml/big", GangShape(roles=(("head", 1), ("worker", 1))), 2, members)
    assert tree is not None
    demands = (Demand("ml/big-head", cpu(6)), Demand("ml/big-w0", cpu(1)))
    placed = place_tree(Gang("ml/big", 0, 0.0, demands, 2), None, tree, Contest(bins), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.SHORT
    assert placed.decision.message == (
        "gang ml/big waits: role head needs cpu 6 on one node; the largest free is cpu 4"
    )


def test_the_members_chosen_meet_every_role_minimum_before_the_gangs() -> None:
    members = [
        Member("g/head", task="head"),
        *(Member(f"g/w{i}", task="worker") for i in range(4)),
    ]
    tree = tree_of("g", GangShape(roles=(("head", 1), ("worker", 2))), 3, members)
    assert tree is not None
    # Workers are smaller: a flat choice of 3 would take three workers and no head.
    demands = (Demand("g/head", cpu(2)), *(Demand(f"g/w{i}", cpu(1)) for i in range(4)))
    chosen = choose(Gang("g", 0, 0.0, demands, 3), tree)
    assert sorted(d.key for d in chosen) == ["g/head", "g/w0", "g/w1"]


def test_a_slice_waits_behind_the_gang_holding_its_rack() -> None:
    bins = racks({"r0": [1] * 3, "r1": [1] * 3})
    holder = Holder("other", 5, 0.0, {"r1-n0": cpu(1)})
    gang, tree = slices_gang("ml/s", 6, ((RACK, 3),))
    placed = place_tree(gang, None, tree, Contest(bins, holders=[holder]), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.WAIT
    assert "other" in placed.decision.message


# ---- the property ---------------------------------------------------------------------


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Bin], tuple[tuple[str, int], ...], int, bool]:
    n_blocks = draw(st.integers(1, 3))
    free: dict[str, list[float]] = {}
    block_of: dict[str, str] = {}
    for b in range(n_blocks):
        for r in range(draw(st.integers(1, 3))):
            rack = f"b{b}r{r}"
            free[rack] = draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=4))
            block_of[rack] = f"b{b}"
    inner = draw(st.integers(1, 4))
    layers: tuple[tuple[str, int], ...] = ((RACK, inner),)
    if draw(st.booleans()):
        layers = ((BLOCK, inner * draw(st.integers(1, 3))), (RACK, inner))
    count = draw(st.integers(layers[0][1], 16))
    return racks(free, block_of), layers, count, draw(st.booleans())


@given(worlds())
@settings(max_examples=300, deadline=None)
def test_what_is_placed_meets_every_sub_group_domain_or_nothing_is_placed(
    world: tuple[list[Bin], tuple[tuple[str, int], ...], int, bool],
) -> None:
    bins, layers, count, in_block = world
    gang, tree = slices_gang("p/g", count, layers)
    where = Where(TopologyConstraint(BLOCK, True), LEVELS) if in_block else None
    placed = place_tree(gang, where, tree, Contest(bins), 0.0, 60.0)
    plan = dict(placed.decision.plan)
    if placed.decision.verdict is not Ruling.ADMIT:
        assert plan == {}
        return
    assert len(plan) == count  # the gang's whole minimum
    labels = {b.name: b.labels for b in bins}
    used = Counter(plan.values())
    for b in bins:  # never more than a node has free
        assert used[b.name] * 1000 <= b.free["cpu"]
    if in_block:
        assert len({labels[n][BLOCK] for n in plan.values()}) == 1
    for group in tree.groups:
        members = [k for k, p in tree.paths.items() if p[: len(group.path)] == group.path]
        assert len(members) >= group.min_member
        assert group.constraint is not None
        level = group.constraint.key
        values = {labels[plan[k]][level] for k in members}
        assert len(values) == 1, (group, values)
        assert placed.groups[group.path].value in values


def test_a_volcano_task_is_read_from_the_label_when_the_annotation_is_absent() -> None:
    meta = {
        "annotations": {VOLCANO_GROUP_ANNOTATIONS[0]: "job"},
        "labels": {VOLCANO_TASK_ANNOTATION: "worker"},
    }
    ref = group_ref_of_pod("ml", meta, {})
    assert ref is not None and ref.task == "worker"
    meta["annotations"][VOLCANO_TASK_ANNOTATION] = "head"
    ref = group_ref_of_pod("ml", meta, {})
    assert ref is not None and ref.task == "head"


# ---- Volcano subGroupPolicy -----------------------------------------------------------

PARTITION = "volcano.sh/partition-id"


def worker_policy(**extra: object) -> dict[str, object]:
    return {
        "name": "worker",
        "subGroupSize": 3,
        "minSubGroups": 2,
        "labelSelector": {"matchLabels": {VOLCANO_TASK_ANNOTATION: "worker"}},
        "matchLabelKeys": [PARTITION],
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    } | extra


def job_spec(min_member: int) -> dict[str, object]:
    return {"minMember": min_member, "subGroupPolicy": [worker_policy()]}


def test_volcano_sub_group_policy_is_read_with_its_own_network_topology() -> None:
    spec = spec_from_volcano(
        "volcano:ml/job", {"minMember": 6, "subGroupPolicy": [worker_policy()]}
    )
    (policy,) = spec.sub_group_policy
    assert (policy.name, policy.size, policy.min_sub_groups, policy.keys) == (
        "worker",
        3,
        2,
        (PARTITION,),
    )
    assert policy.constraint is not None and policy.constraint.tier == 1
    assert "spec.subGroupPolicy[0].networkTopology" in policy.constraint.origin
    labels = {VOLCANO_TASK_ANNOTATION: "worker", PARTITION: "1"}
    assert policy.path_of(labels) == ("worker-1",)
    assert policy.path_of({VOLCANO_TASK_ANNOTATION: "ps", PARTITION: "1"}) is None
    assert policy.path_of({VOLCANO_TASK_ANNOTATION: "worker"}) is None  # no key value: none


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ({"subGroupSize": 3}, r"subGroupPolicy\[0\]\.name must name the policy"),
        (worker_policy(subGroupSize=0), r"subGroupSize must be an integer between 1"),
        (worker_policy(minSubGroups=-1), r"minSubGroups must be an integer between 0"),
        (worker_policy(matchLabelKeys="x"), r"matchLabelKeys must be a list"),
        (worker_policy(networkTopology={"mode": "wild"}), r"networkTopology.mode must be hard"),
        (
            worker_policy(labelSelector={"matchExpressions": [{"key": "a", "operator": "Is"}]}),
            r"operator of In, NotIn, Exists, DoesNotExist",
        ),
    ],
)
def test_bad_sub_group_policies_name_the_field(policy: dict[str, object], words: str) -> None:
    with pytest.raises(PodGroupSpecError, match=words):
        spec_from_volcano("volcano:ml/job", {"subGroupPolicy": [policy]})


def policy_members(partitions: dict[str, int]) -> list[Member]:
    members = []
    for partition, count in partitions.items():
        for i in range(count):
            labels = {VOLCANO_TASK_ANNOTATION: "worker", PARTITION: partition}
            members.append(Member(f"ml/w{partition}-{i}", labels=labels))
    return members


def test_a_required_sub_group_short_of_its_size_holds_the_gang() -> None:
    spec = spec_from_volcano(
        "volcano:ml/job", {"minMember": 5, "subGroupPolicy": [worker_policy()]}
    )
    shape = GangShape(policies=spec.sub_group_policy)
    with pytest.raises(TopologyError, match=r"sub-group worker-1 .* has 2 pod"):
        tree_of("volcano:ml/job", shape, 5, policy_members({"0": 3, "1": 2}))


def test_sub_groups_of_a_policy_land_three_and_three_on_racks_of_four() -> None:
    spec = spec_from_volcano(
        "volcano:ml/job", {"minMember": 6, "subGroupPolicy": [worker_policy()]}
    )
    members = policy_members({"0": 3, "1": 3})
    tree = tree_of("volcano:ml/job", GangShape(policies=spec.sub_group_policy), 6, members)
    assert tree is not None and [g.path for g in tree.groups] == [("worker-0",), ("worker-1",)]
    bins = racks({"r0": [1, 1, 1, 1], "r1": [1, 1, 1, 1]})
    demands = tuple(Demand(m.key, cpu(1)) for m in members)
    placed = place_tree(
        Gang("volcano:ml/job", 0, 0.0, demands, 6),
        None,
        tree,
        Contest(bins),
        0.0,
        60.0,
        lambda c: levels_to_try(c, LEVELS),
    )
    assert placed.decision.verdict is Ruling.ADMIT
    where = racks_of(dict(placed.decision.plan), bins)
    assert len({where[f"ml/w0-{i}"] for i in range(3)}) == 1
    assert len({where[f"ml/w1-{i}"] for i in range(3)}) == 1
    assert where["ml/w0-0"] != where["ml/w1-0"]


def test_a_volcano_gang_never_starts_below_its_required_sub_groups_pods() -> None:
    spec = spec_from_volcano(
        "volcano:ml/job", {"minMember": 2, "subGroupPolicy": [worker_policy()]}
    )
    assert spec.min_member == 6  # minSubGroups 2 x subGroupSize 3


@st.composite
def role_worlds(draw: st.DrawFn) -> tuple[list[Bin], dict[str, tuple[int, int, float]], int]:
    """Nodes of 0-4 free CPUs; roles (members, minimum, CPUs each); the gang's minMember."""
    bins = racks({"r0": draw(st.lists(st.sampled_from([0, 1, 2, 4]), min_size=1, max_size=6))})
    roles: dict[str, tuple[int, int, float]] = {}
    for name in draw(
        st.lists(st.sampled_from(["head", "ps", "worker"]), min_size=1, max_size=3, unique=True)
    ):
        members = draw(st.integers(1, 4))
        roles[name] = (members, draw(st.integers(1, members)), draw(st.sampled_from([1, 2, 3])))
    total = sum(members for members, _, _ in roles.values())
    floor = sum(minimum for _, minimum, _ in roles.values())
    return bins, roles, draw(st.integers(floor, total))


@given(role_worlds())
@settings(max_examples=300, deadline=None)
def test_what_is_placed_meets_every_roles_minimum_or_nothing_is_placed(
    world: tuple[list[Bin], dict[str, tuple[int, int, float]], int],
) -> None:
    bins, roles, min_member = world
    members = [Member(f"g/{r}-{i}", task=r) for r, (n, _, _) in roles.items() for i in range(n)]
    tree = tree_of(
        "g", GangShape(roles=tuple((r, m) for r, (_, m, _) in roles.items())), 0, members
    )
    assert tree is not None
    demands = tuple(Demand(m.key, cpu(roles[m.task][2])) for m in members)
    placed = place_tree(
        Gang("g", 0, 0.0, demands, min_member), None, tree, Contest(bins), 0.0, 60.0
    )
    plan = dict(placed.decision.plan)
    if placed.decision.verdict is not Ruling.ADMIT:
        assert plan == {}
        return
    assert len(plan) >= min_member
    for role, (_, minimum, _) in roles.items():
        assert sum(1 for key in plan if key.startswith(f"g/{role}-")) >= minimum
    used = Counter(plan.values())
    free = {b.name: b.free["cpu"] for b in bins}
    per = {m.key: int(roles[m.task][2] * 1000) for m in members}
    for node in used:
        assert sum(per[k] for k, n in plan.items() if n == node) <= free[node]


def test_a_gang_of_slices_ahead_in_line_is_weighed_as_slices() -> None:
    """Racks r0 (4 free) and r1 (3 free). Gang A ahead (priority 10): 2 slices of 2 by rack.
    Weighed flat, A's first fit takes r0 whole and leaves r1's 3 to B's slice of 2 behind it,
    admitted, though A itself then finds no rack for its second slice. Weighed as slices
    (fullest first, as its admission places them): A takes r1 2 and r0 2, and B waits."""
    bins = racks({"r0": [1] * 4, "r1": [1] * 3})
    a, a_tree = slices_gang("ml/a", 4, ((RACK, 2),))
    b, b_tree = slices_gang("ml/b", 2, ((RACK, 2),))
    a = replace(a, priority=10)
    flat = place_tree(b, None, b_tree, Contest(bins, line=[a]), 0.0, 60.0)
    assert flat.decision.verdict is Ruling.ADMIT  # what weighing A flat did
    as_tree = replace(a, packer=partial(pack_tree, a_tree, by_key))
    placed = place_tree(b, None, b_tree, Contest(bins, line=[as_tree]), 0.0, 60.0)
    assert placed.decision.verdict is Ruling.WAIT, placed.decision
    assert "ml/a" in placed.decision.message
    # A's own decision, with B behind it, admits A with each slice in one rack.
    mine = place_tree(a, None, a_tree, Contest(bins, line=[b]), 0.0, 60.0)
    assert mine.decision.verdict is Ruling.ADMIT
    assert {d.value for d in mine.groups.values()} == {"r0", "r1"}
