"""Kubernetes' CompositePodGroup (KEP-6012, 1.37 alpha) trees against the real kube-scheduler.

The session's control plane runs with the feature gate CompositePodGroup
(tests/cluster/session.py), so the API server serves scheduling.k8s.io/v1alpha3
and the extender watches CompositePodGroups (app/core/composite_trees.py).
Each test brings its own fake nodes of 1 CPU labelled with a rack and a block
(the session's own nodes are cordoned meanwhile); every member asks for 1
CPU, so a rack of n nodes has room for n members.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.core.composite import (
    COMPOSITE_GROUP,
    COMPOSITE_KIND,
    COMPOSITE_PLURAL,
    COMPOSITE_VERSION,
)
from app.core.groups import NATIVE_API, SOURCE_NATIVE, GroupApi
from hack.clusterkit import create_group, wait_for
from tests.cluster.kube import Kube
from tests.cluster.racks import BLOCK, RACK, one_rack, racks, stays_unbound, told
from tests.cluster.test_kubectl_gang import kubectl_gang

COMPOSITE_API = GroupApi(
    SOURCE_NATIVE, COMPOSITE_GROUP, COMPOSITE_VERSION, COMPOSITE_PLURAL, COMPOSITE_KIND, True
)


def tree(
    kube: Kube,
    namespace: str,
    root: str,
    leaves: dict[str, int],
    *,
    min_groups: int = 2,
    parent: str | None = None,
    priority_class: str | None = None,
) -> None:
    """A CompositePodGroup `root` (all in one block, `min_groups` children needed) and a
    leaf PodGroup per entry of `leaves` (name -> minCount, all in one rack) naming
    `parent` (default: the root) as its parent. kube-scheduler schedules a tree only
    when its members' priority is the root's: `priority_class` names the pods' class."""
    workload = {"workloadName": root, "templateName": root}
    root_spec: dict[str, Any] = {
        "workloadRef": workload,
        "schedulingPolicy": {"gang": {"minGroupCount": min_groups}},
        "schedulingConstraints": {"topology": [{"key": BLOCK}]},
    }
    if priority_class:
        root_spec["priorityClassName"] = priority_class
    create_group(kube.custom, COMPOSITE_API, namespace, root, root_spec)
    for name, min_count in leaves.items():
        spec: dict[str, Any] = {
            "parentCompositePodGroupName": parent or root,
            "workloadRef": {"workloadName": root, "templateName": "slice"},
            "schedulingPolicy": {"gang": {"minCount": min_count}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        create_group(kube.custom, NATIVE_API, namespace, name, spec)


def leaf_pods(
    kube: Kube,
    namespace: str,
    leaf: str,
    count: int,
    cpu: str = "1",
    priority_class: str | None = None,
) -> None:
    """`count` pods of the leaf PodGroup, named <leaf>-<i>."""
    for i in range(count):
        kube.create_pod(
            namespace,
            f"{leaf}-{i}",
            cpu=cpu,
            scheduling_group=leaf,
            priority_class=priority_class,
        )


@pytest.mark.parametrize(
    "layout",
    [
        # r2 is alone in b1 and could not hold both leaves: 3 + 3 in b0, not 4 + 2.
        {"r0": ("b0", 4), "r1": ("b0", 4), "r2": ("b1", 4)},
        # b1's two racks of 2 nodes hold no leaf of 3: kube-scheduler tries the tree there
        # too, and that placement with no pod must not end the tree's cycle (it did while
        # the profile left GangScheduling's PlacementFeasible off: docs/preemption.md).
        {"r0": ("b0", 4), "r1": ("b0", 4), "r2": ("b1", 2), "r3": ("b1", 2)},
    ],
    ids=["beside-one-rack", "beside-two-small-racks"],
)
def test_two_leaves_land_three_and_three_each_in_a_rack_of_one_block(
    kube: Kube, namespace: str, layout: dict[str, tuple[str, int]]
) -> None:
    with racks(kube, layout) as rack_of:
        tree(kube, namespace, "job", {"job-a": 3, "job-b": 3})
        leaf_pods(kube, namespace, "job-a", 3)
        leaf_pods(kube, namespace, "job-b", 3)
        bound = kube.wait_bound(namespace, "job-", 6)
        first = one_rack(bound, rack_of, (f"job-a-{i}" for i in range(3)))
        second = one_rack(bound, rack_of, (f"job-b-{i}" for i in range(3)))
        assert {first, second} == {"r0", "r1"}, bound


def test_a_leaf_that_fits_no_node_holds_the_whole_tree_and_is_named(
    kube: Kube, kubeconfig: str, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4), "r1": ("b0", 4)}):
        tree(kube, namespace, "big", {"big-a": 2, "big-b": 2})
        leaf_pods(kube, namespace, "big-a", 2)
        leaf_pods(kube, namespace, "big-b", 2, cpu="2")  # 2 CPUs: no 1-CPU node holds one
        # kube-scheduler's own composite cycle (gate CompositePodGroup) reports an error of
        # its PodGroupPodsCount plugin rather than the filter's message once no node passes;
        # the extender's Event on the CompositePodGroup names the gang and the leaf.
        event = wait_for(
            lambda: told(kube, namespace, f"InsufficientResources: gang composite:{namespace}/big"),
            30,
            "the InsufficientResources Event naming the tree's gang",
        )
        assert "group big-b needs cpu 2" in event, event
        stays_unbound(kube, namespace)
        # `kubectl gang describe` shows the Event, which is on the root CompositePodGroup.
        described = kubectl_gang(kubeconfig, "describe", f"composite:{namespace}/big").stdout
        assert "CompositePodGroup/big" in described and "InsufficientResources" in described


def test_a_leaf_naming_a_missing_parent_is_held_with_a_clear_message(
    kube: Kube, namespace: str
) -> None:
    with racks(kube, {"r0": ("b0", 4)}):
        spec = {
            "parentCompositePodGroupName": "nowhere",
            "workloadRef": {"workloadName": "job", "templateName": "slice"},
            "schedulingPolicy": {"gang": {"minCount": 2}},
        }
        create_group(kube.custom, NATIVE_API, namespace, "orphan", spec)
        leaf_pods(kube, namespace, "orphan", 2)
        # kube-scheduler's own queue holds these pods back (their tree has no root) and
        # never asks the extender: its Event on the leaf says what to fix.
        event = wait_for(
            lambda: told(
                kube,
                namespace,
                f"InvalidPodGroup: PodGroup native:{namespace}/orphan cannot be scheduled: "
                "CompositePodGroup nowhere not found (the parent of PodGroup orphan)",
            ),
            30,
            "the InvalidPodGroup Event naming the missing parent",
        )
        assert "fix spec.parentCompositePodGroupName" in event, event
        stays_unbound(kube, namespace)
