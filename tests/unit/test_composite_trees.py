"""CompositePodGroup trees kept in the cluster state: leaves' pods join their root's gang."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.groups import SOURCE_NATIVE, PodGroupSpecError
from app.core.records import GroupNotFound
from app.core.state import ClusterState
from tests.unit.builders import pod
from tests.unit.test_composite import cpg_object

RACK = "example.com/rack"
BLOCK = "example.com/block"
ROOT_KEY = "composite:ml/job"


def composite(
    name: str, *, parent: str = "", min_groups: int | None = 2, key: str = BLOCK
) -> dict[str, Any]:
    return cpg_object(name, parent, min_groups, key)


def leaf(name: str, parent: str = "job", min_count: int = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workloadRef": {"workloadName": "job", "templateName": "slice"},
        "schedulingPolicy": {"gang": {"minCount": min_count}},
        "schedulingConstraints": {"topology": [{"key": RACK}]},
    }
    if parent:
        spec["parentCompositePodGroupName"] = parent
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"pg-{name}"}, "spec": spec}


def member(name: str, group: str) -> dict[str, Any]:
    raw = pod(name, namespace="ml")
    raw["spec"]["schedulingGroup"] = {"podGroupName": group}
    return raw


def watched() -> ClusterState:
    state = ClusterState()
    state.trees.watched = True
    return state


def test_every_leaf_pod_joins_the_root_gang_with_its_leaf_as_sub_group() -> None:
    state = watched()
    for i in range(3):
        state.apply_pod(member(f"a{i}", "job-a"))
        state.apply_pod(member(f"b{i}", "job-b"))
    # Pods first, then the objects: the pods move to the root's gang when the tree is whole.
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    assert state.apply_podgroup(leaf("job-b"), SOURCE_NATIVE) == []
    assert {p.name for p in state.members("native:ml/job-a")} == {"a0", "a1", "a2"}
    assert state.trees.apply(composite("job")) == [ROOT_KEY]
    assert len(state.members(ROOT_KEY)) == 6
    assert state.members("native:ml/job-a") == []
    assert {p.group.task for p in state.members(ROOT_KEY) if p.group} == {"job-a", "job-b"}
    # The leaves are no gangs of their own meanwhile (/debug/gangs, the podgroups gauge).
    assert "native:ml/job-a" not in state.podgroups
    ref = state.pods["ml/a0"].group
    assert ref is not None
    spec = state.group_spec(ref)
    assert spec.min_member == 6 and spec.topology is not None and spec.topology.key == BLOCK
    assert [
        (g.path, g.min_member, g.constraint.key if g.constraint else "") for g in spec.sub_groups
    ] == [
        (("job-a",), 3, RACK),
        (("job-b",), 3, RACK),
    ]
    assert spec.min_task_member == (("job-a", 3), ("job-b", 3))
    # A pod read afresh (a relist, the bind verb's read) is keyed the same way.
    assert state.trees.pod_record(member("a9", "job-a"), state.sources).group == ref.__class__(
        "ml", "job", source=SOURCE_NATIVE, task="job-a", composite=True
    )
    # The root goes: its leaves' pods are plain native members again, held with the reason.
    state.trees.delete("ml", "job")
    assert ROOT_KEY not in state.podgroups and len(state.members("native:ml/job-a")) == 3
    assert state.podgroups["native:ml/job-a"].spec is not None
    with pytest.raises(PodGroupSpecError, match="CompositePodGroup job not found"):
        state.group_spec(state.pods["ml/a0"].group)  # type: ignore[arg-type]


def test_a_leaf_naming_a_missing_parent_is_held_with_the_objects_named() -> None:
    state = watched()
    state.apply_podgroup(leaf("orphan", parent="nowhere"), SOURCE_NATIVE)
    state.apply_pod(member("o0", "orphan"))
    ref = state.pods["ml/o0"].group
    assert ref is not None and ref.key == "native:ml/orphan"
    with pytest.raises(PodGroupSpecError) as err:
        state.group_spec(ref)
    assert str(err.value) == (
        "PodGroup native:ml/orphan cannot be scheduled: CompositePodGroup nowhere not found "
        "(the parent of PodGroup orphan): create it (apiVersion scheduling.k8s.io/v1alpha3) "
        "or fix spec.parentCompositePodGroupName"
    )


def test_min_group_count_above_the_children_holds_the_root_gang() -> None:
    state = watched()
    state.trees.apply(composite("job", min_groups=3))
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    state.apply_pod(member("a0", "job-a"))
    ref = state.pods["ml/a0"].group
    assert ref is not None and ref.key == ROOT_KEY
    with pytest.raises(PodGroupSpecError, match="minGroupCount 3 is above its 1 child group"):
        state.group_spec(ref)


def test_a_cycle_and_an_unreadable_composite_hold_the_leaves_below() -> None:
    state = watched()
    state.trees.replace([composite("x", parent="y"), composite("y", parent="x")])
    state.apply_podgroup(leaf("l", parent="x"), SOURCE_NATIVE)
    with pytest.raises(PodGroupSpecError, match="is its own ancestor"):
        state.group_spec(state.trees.pod_record(member("p", "l"), state.sources).group)  # type: ignore[arg-type]
    bad = composite("job")
    bad["spec"]["schedulingPolicy"] = {"gang": {"minGroupCount": 0}}
    state.trees.apply(bad)
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    with pytest.raises(PodGroupSpecError, match="minGroupCount must be an integer"):
        state.group_spec(state.trees.pod_record(member("q", "job-a"), state.sources).group)  # type: ignore[arg-type]


def test_not_watched_a_leaf_is_a_flat_native_podgroup() -> None:
    state = ClusterState()
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    state.apply_pod(member("a0", "job-a"))
    ref = state.pods["ml/a0"].group
    assert ref is not None and ref.key == "native:ml/job-a"
    assert state.group_spec(ref).min_member == 3
    with pytest.raises(GroupNotFound):
        state.group_spec(ref.__class__("ml", "job", source=SOURCE_NATIVE))


def test_a_relist_of_leaves_keeps_the_root_records() -> None:
    state = watched()
    state.trees.apply(composite("job", min_groups=1))
    state.replace_podgroups([leaf("job-a"), leaf("job-b")], SOURCE_NATIVE)
    assert state.podgroups[ROOT_KEY].spec is not None
    assert state.podgroups[ROOT_KEY].spec.min_member == 3  # type: ignore[union-attr]
    state.replace_podgroups([], SOURCE_NATIVE)
    assert ROOT_KEY not in state.podgroups


def test_a_podgroup_named_like_a_root_is_a_gang_apart_from_the_tree() -> None:
    """A flat PodGroup `job` beside a CompositePodGroup `job`: two gangs, neither's pods
    nor record taken for the other's."""
    state = watched()
    for i in range(3):
        state.apply_pod(member(f"a{i}", "job-a"))
        state.apply_pod(member(f"b{i}", "job-b"))
        state.apply_pod(member(f"flat{i}", "job"))
    state.apply_podgroup(leaf("job-a"), SOURCE_NATIVE)
    state.apply_podgroup(leaf("job-b"), SOURCE_NATIVE)
    state.apply_podgroup(leaf("job", parent="", min_count=3), SOURCE_NATIVE)
    state.trees.apply(composite("job"))
    trees = [key for key, record in state.podgroups.items() if record.composite]
    assert trees == [ROOT_KEY]
    tree, flat = state.podgroups[ROOT_KEY], state.podgroups["native:ml/job"]
    assert tree.composite and not flat.composite
    assert tree.spec is not None and tree.spec.min_member == 6
    assert flat.spec is not None and flat.spec.min_member == 3
    assert {p.name for p in state.members(ROOT_KEY)} == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert {p.name for p in state.members("native:ml/job")} == {"flat0", "flat1", "flat2"}
    # The tree goes: the flat PodGroup and its pods stay as they were.
    state.trees.delete("ml", "job")
    assert ROOT_KEY not in state.podgroups and "native:ml/job" in state.podgroups
    assert {p.name for p in state.members("native:ml/job")} == {"flat0", "flat1", "flat2"}
