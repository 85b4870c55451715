"""Kubernetes' CompositePodGroup tree read as one gang (pure; the API is alpha in 1.37)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.core.composite import CompositeError, GroupNode, composite_gang, node_from, root_of
from tests.unit.test_lws import racks, racks_placed

HOST = "kubernetes.io/hostname"
RACK = "example.com/rack"
BLOCK = "example.com/block"
LEVELS = (HOST, RACK, BLOCK)


def cpg_object(
    name: str, parent: str = "", min_groups: int | None = None, key: str = ""
) -> dict[str, Any]:
    """A CompositePodGroup as the API delivers it (namespace ml)."""
    spec: dict[str, Any] = {"workloadRef": {"workloadName": "job", "templateName": name}}
    if parent:
        spec["parentCompositePodGroupName"] = parent
    spec["schedulingPolicy"] = (
        {"gang": {"minGroupCount": min_groups}} if min_groups else {"basic": {}}
    )
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"cpg-{name}"}, "spec": spec}


def cpg(name: str, parent: str = "", min_groups: int | None = None, key: str = "") -> GroupNode:
    return node_from(cpg_object(name, parent, min_groups, key), leaf=False)


def pg(name: str, parent: str, min_count: int, key: str = "") -> GroupNode:
    spec: dict[str, Any] = {
        "parentCompositePodGroupName": parent,
        "schedulingPolicy": {"gang": {"minCount": min_count}},
    }
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return node_from({"metadata": {"name": name}, "spec": spec}, leaf=True)


def test_the_root_its_minimum_and_each_leaf_as_a_sub_group_with_its_level() -> None:
    composites = {"job": cpg("job", min_groups=2, key=BLOCK)}
    leaves = [pg(f"job-slice-{i}", "job", 2, RACK) for i in range(2)]
    members = [(f"ml/p{i}", f"job-slice-{i // 2}", "") for i in range(4)]
    gang = composite_gang("job", composites, leaves, members)
    assert gang.min_member == 4 and gang.constraint is not None and gang.constraint.key == BLOCK
    assert [(g.path, g.min_member) for g in gang.tree.groups] == [
        (("job-slice-0",), 2),
        (("job-slice-1",), 2),
    ]
    assert gang.tree.paths["ml/p3"] == ("job-slice-1",)
    assert root_of("job-slice-0", composites, "job") == ["job"]


def test_min_group_count_holds_the_first_children_by_name_and_counts_the_smallest() -> None:
    composites = {"job": cpg("job", min_groups=1)}
    leaves = [pg("a", "job", 3), pg("b", "job", 1)]
    gang = composite_gang("job", composites, leaves, [])
    assert gang.min_member == 1
    assert {g.path: g.min_member for g in gang.tree.groups} == {("a",): 3, ("b",): 0}


def test_nested_composites_put_leaves_under_their_parent_path() -> None:
    composites = {
        "root": cpg("root", min_groups=2, key=BLOCK),
        "half-0": cpg("half-0", "root", 2),
        "half-1": cpg("half-1", "root", 2),
    }
    leaves = [pg(f"half-{h}-s{s}", f"half-{h}", 1, RACK) for h in (0, 1) for s in (0, 1)]
    gang = composite_gang("root", composites, leaves, [("ml/x", "half-1-s0", "n1")])
    assert gang.min_member == 4
    assert gang.tree.paths["ml/x"] == ("half-1", "half-1-s0")
    assert gang.tree.placed == ((("half-1", "half-1-s0"), "n1"),)
    assert root_of("half-1-s0", composites, "half-1") == ["root", "half-1"]


@pytest.mark.parametrize(
    ("composites", "parent", "words"),
    [
        ({"a": cpg("a", "b"), "b": cpg("b", "a")}, "a", "is its own ancestor"),
        ({"a": cpg("a", "gone")}, "a", "CompositePodGroup gone not found (the parent of a)"),
        (
            {"a": cpg("a", "b"), "b": cpg("b", "c"), "c": cpg("c", "d"), "d": cpg("d")},
            "a",
            "deeper than 4 levels",
        ),
    ],
)
def test_a_bad_tree_is_refused_with_the_reason(
    composites: dict[str, GroupNode], parent: str, words: str
) -> None:
    with pytest.raises(CompositeError, match=re.escape(words)):
        root_of("leaf", composites, parent)


def test_bad_fields_name_the_object_and_field() -> None:
    with pytest.raises(
        CompositeError, match=re.escape("job: spec.schedulingPolicy.gang.minGroupCount")
    ):
        node_from(
            {
                "metadata": {"name": "job"},
                "spec": {"schedulingPolicy": {"gang": {"minGroupCount": 0}}},
            },
            leaf=False,
        )
    with pytest.raises(
        CompositeError, match=re.escape("PodGroup s: spec.schedulingConstraints.topology")
    ):
        node_from(
            {"metadata": {"name": "s"}, "spec": {"schedulingConstraints": {"topology": [{}, {}]}}},
            leaf=True,
        )
    with pytest.raises(CompositeError, match="minGroupCount 3 is above its 2 child group"):
        composite_gang(
            "job", {"job": cpg("job", min_groups=3)}, [pg("a", "job", 1), pg("b", "job", 1)], []
        )


def test_the_tree_places_each_leaf_in_one_rack_inside_the_roots_block() -> None:
    composites = {"job": cpg("job", min_groups=2, key=BLOCK)}
    leaves = [pg(f"s{i}", "job", 2, RACK) for i in range(2)]
    members = [(f"ml/p{i}", f"s{i // 2}", "") for i in range(4)]
    gang = composite_gang("job", composites, leaves, members)
    bins = racks(
        {"a0": 3, "a1": 1, "c0": 2, "c1": 2}, {"a0": "b0", "a1": "b0", "c0": "b1", "c1": "b1"}
    )
    assert gang.constraint is not None
    keys = [k for k, _, _ in members]
    _, where = racks_placed("composite:ml/job", keys, gang.tree, gang.constraint, bins)
    assert where["ml/p0"] == where["ml/p1"] and where["ml/p2"] == where["ml/p3"]
    assert {where["ml/p0"], where["ml/p2"]} == {"c0", "c1"}
